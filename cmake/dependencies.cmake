# Every dependency comes from a Debian package (scripts/setup installs them), except libtorch in
# a build against a PyTorch install (RLFORGE_TORCH_FROM_PYTHON). With RLFORGE_MINIMAL_DEPS only
# what the GPU subset needs is looked for: CAF (and OpenSSL for its TLS module), msgpack, spdlog
# with fmt, nlohmann-json, GoogleTest and libtorch (scripts/gpu-pack packs the Debian ones).
find_package(Threads REQUIRED)

# CAF 0.17.6 (no CMake config, no pkg-config file), its TLS module with OpenSSL (cluster TLS,
# DESIGN.md "Cluster"; libssl-dev also serves the certificate checks and `rlforge head
# --init-tls`), msgpack-cxx and SentencePiece: targets defined in cmake/imported_targets.cmake,
# which installed packages use too.
find_package(OpenSSL REQUIRED)
include(${CMAKE_CURRENT_LIST_DIR}/imported_targets.cmake)
find_package(spdlog REQUIRED)         # target spdlog::spdlog (compiled, external fmt)
find_package(nlohmann_json REQUIRED)  # target nlohmann_json::nlohmann_json

if(NOT RLFORGE_MINIMAL_DEPS)
  # The Tinker service's wire formats, also needed by the fuzz-only build: protobuf bodies
  # (libprotobuf-dev, protobuf-compiler: targets protobuf::libprotobuf, protobuf::protoc) that
  # may arrive zstd-compressed (libzstd-dev: target zstd::libzstd_shared).
  find_package(Protobuf REQUIRED)
  find_package(zstd CONFIG REQUIRED)
endif()

if(RLFORGE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(RLFORGE_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

# libtorch: Debian's (1.13, CPU), or the one inside a PyTorch install (RLFORGE_TORCH_FROM_PYTHON
# names the python executable; 2.x included, CUDA builds included), a CUDA libtorch with
# RLFORGE_CUDA. backends/torch_compat.hpp handles the API differences. Not needed by the
# fuzz-only build, which compiles the parsers alone with clang.
if(NOT RLFORGE_FUZZ_ONLY)
  if(RLFORGE_TORCH_FROM_PYTHON)
    execute_process(
      COMMAND ${RLFORGE_TORCH_FROM_PYTHON} -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _rlforge_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_VARIABLE _rlforge_torch_error RESULT_VARIABLE _rlforge_torch_rc)
    if(NOT _rlforge_torch_rc EQUAL 0)
      message(FATAL_ERROR "RLFORGE_TORCH_FROM_PYTHON=${RLFORGE_TORCH_FROM_PYTHON}: cannot import "
                          "torch: ${_rlforge_torch_error}")
    endif()
    list(PREPEND CMAKE_PREFIX_PATH "${_rlforge_torch_prefix}")
  endif()
  if(RLFORGE_CUDA)
    find_package(CUDAToolkit REQUIRED)
  endif()
  find_package(Torch REQUIRED)
  if(RLFORGE_CUDA AND NOT TORCH_CUDA_LIBRARIES)
    message(FATAL_ERROR "RLFORGE_CUDA=ON needs a CUDA libtorch; ${TORCH_INSTALL_PREFIX} is CPU-only")
  endif()
  # c10d's ProcessGroupGloo needs gloo's headers: libtorch's own where it ships them, else
  # libgloo-dev's (libtorch-dev does not pull it in).
  find_path(GLOO_INCLUDE_DIR gloo/config.h HINTS "${TORCH_INSTALL_PREFIX}/include" REQUIRED)
  if(NOT RLFORGE_MINIMAL_DEPS)
    # The service's future store (libsqlite3-dev): target SQLite::SQLite3.
    find_package(SQLite3 REQUIRED)
  endif()
  if(RLFORGE_CUDA)
    # NCCL: the one a PyTorch install brings (nvidia-nccl wheels), else the CUDA toolkit's.
    set(_rlforge_nccl_hints /usr/local/cuda)
    if(RLFORGE_TORCH_FROM_PYTHON)
      execute_process(
        COMMAND ${RLFORGE_TORCH_FROM_PYTHON} -c
                "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])"
        OUTPUT_VARIABLE _rlforge_nccl_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      list(PREPEND _rlforge_nccl_hints "${_rlforge_nccl_dir}")
    endif()
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_rlforge_nccl_hints} PATH_SUFFIXES include REQUIRED)
    find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_rlforge_nccl_hints}
                 PATH_SUFFIXES lib lib64 REQUIRED)
  endif()
endif()

# The service's HTTP server and test client (libcpp-httplib-dev): Debian ships a compiled library
# built with OpenSSL, zlib and Brotli support, and its header must see the same switches (class
# layouts depend on them); its pkg-config file carries them. Target PkgConfig::CPPHTTPLIB.
if(NOT RLFORGE_FUZZ_ONLY AND NOT RLFORGE_MINIMAL_DEPS)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(CPPHTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
endif()
