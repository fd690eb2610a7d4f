# Every dependency comes from a Debian package (scripts/setup installs them).
find_package(Threads REQUIRED)

# CAF 0.17.6: Debian ships no CMake config and no pkg-config file.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
find_library(CAF_IO_LIBRARY caf_io REQUIRED)
file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _rlforge_caf_ver REGEX "#define CAF_VERSION [0-9]+")
string(REGEX REPLACE ".*CAF_VERSION ([0-9]+).*" "\\1" RLFORGE_CAF_VERSION "${_rlforge_caf_ver}")
if(RLFORGE_CAF_VERSION LESS 1706 OR RLFORGE_CAF_VERSION GREATER_EQUAL 1800)
  message(FATAL_ERROR "rlforge needs CAF 0.17.6 or a later 0.17 release, found ${RLFORGE_CAF_VERSION}")
endif()
add_library(rlforge_caf_core SHARED IMPORTED)
set_target_properties(rlforge_caf_core PROPERTIES IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}" INTERFACE_LINK_LIBRARIES Threads::Threads)
add_library(rlforge_caf_io SHARED IMPORTED)
set_target_properties(rlforge_caf_io PROPERTIES IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
  INTERFACE_LINK_LIBRARIES rlforge_caf_core)
add_library(CAF::core ALIAS rlforge_caf_core)
add_library(CAF::io ALIAS rlforge_caf_io)
# Cluster TLS (DESIGN.md "Cluster"): CAF's openssl module (libcaf-dev ships libcaf_openssl.so)
# and OpenSSL itself (libssl-dev) for the certificate checks and `rlforge head --init-tls`.
find_package(OpenSSL REQUIRED)
find_library(CAF_OPENSSL_LIBRARY caf_openssl REQUIRED)
add_library(rlforge_caf_openssl SHARED IMPORTED)
set_target_properties(rlforge_caf_openssl PROPERTIES IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
  INTERFACE_LINK_LIBRARIES "rlforge_caf_io;OpenSSL::SSL;OpenSSL::Crypto")
add_library(CAF::openssl ALIAS rlforge_caf_openssl)

find_package(msgpack REQUIRED)        # target msgpackc-cxx
find_package(spdlog REQUIRED)         # target spdlog::spdlog (compiled, external fmt)
find_package(nlohmann_json REQUIRED)  # target nlohmann_json::nlohmann_json

# The Tinker service's wire formats, also needed by the fuzz-only build: protobuf bodies
# (libprotobuf-dev, protobuf-compiler: targets protobuf::libprotobuf, protobuf::protoc) that may
# arrive zstd-compressed (libzstd-dev: target zstd::libzstd_shared).
find_package(Protobuf REQUIRED)
find_package(zstd CONFIG REQUIRED)

if(RLFORGE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(RLFORGE_BUILD_BENCH)
  find_package(benchmark QUIET)
endif()

# libtorch (CPU build from Debian; a CUDA libtorch with RLFORGE_WITH_CUDA). Not needed by the
# fuzz-only build, which compiles the parsers alone with clang.
if(NOT RLFORGE_FUZZ_ONLY)
  if(RLFORGE_WITH_CUDA)
    find_package(CUDAToolkit REQUIRED)
  endif()
  find_package(Torch REQUIRED)
  # c10d's ProcessGroupGloo needs gloo's headers (libgloo-dev), which libtorch-dev does not pull in.
  find_path(GLOO_INCLUDE_DIR gloo/config.h REQUIRED)
  # The service's future store (libsqlite3-dev): target SQLite::SQLite3.
  find_package(SQLite3 REQUIRED)
  if(RLFORGE_WITH_CUDA)
    find_library(NCCL_LIBRARY nccl HINTS /usr/local/cuda/lib64 REQUIRED)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include REQUIRED)
  endif()
endif()

# The service's HTTP server and test client (libcpp-httplib-dev): Debian ships a compiled library
# built with OpenSSL, zlib and Brotli support, and its header must see the same switches (class
# layouts depend on them); its pkg-config file carries them. Target PkgConfig::CPPHTTPLIB.
if(NOT RLFORGE_FUZZ_ONLY)
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(CPPHTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
endif()
