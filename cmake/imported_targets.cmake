# Imported targets for dependencies that ship no CMake config of their own: CAF 0.17 (core, io,
# openssl), msgpack-cxx without Boost, and SentencePiece. Used by the build
# (cmake/dependencies.cmake, text/CMakeLists.txt) and by installed packages (rlforgeConfig.cmake),
# so a program that does find_package(rlforge) links the same libraries. Expects Threads and
# OpenSSL found. Safe to include twice.
if(NOT TARGET rlforge_caf_core)
  find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
  find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
  find_library(CAF_IO_LIBRARY caf_io REQUIRED)
  find_library(CAF_OPENSSL_LIBRARY caf_openssl REQUIRED)
  file(STRINGS "${CAF_INCLUDE_DIR}/caf/config.hpp" _rlforge_caf_ver
       REGEX "#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE ".*CAF_VERSION ([0-9]+).*" "\\1" RLFORGE_CAF_VERSION "${_rlforge_caf_ver}")
  if(RLFORGE_CAF_VERSION LESS 1706 OR RLFORGE_CAF_VERSION GREATER_EQUAL 1800)
    message(FATAL_ERROR
            "rlforge needs CAF 0.17.6 or a later 0.17 release, found ${RLFORGE_CAF_VERSION}")
  endif()
  add_library(rlforge_caf_core SHARED IMPORTED)
  set_target_properties(rlforge_caf_core PROPERTIES IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}" INTERFACE_LINK_LIBRARIES Threads::Threads)
  add_library(rlforge_caf_io SHARED IMPORTED)
  set_target_properties(rlforge_caf_io PROPERTIES IMPORTED_LOCATION "${CAF_IO_LIBRARY}"
    INTERFACE_LINK_LIBRARIES rlforge_caf_core)
  add_library(rlforge_caf_openssl SHARED IMPORTED)
  set_target_properties(rlforge_caf_openssl PROPERTIES IMPORTED_LOCATION "${CAF_OPENSSL_LIBRARY}"
    INTERFACE_LINK_LIBRARIES "rlforge_caf_io;OpenSSL::SSL;OpenSSL::Crypto")
  add_library(CAF::core ALIAS rlforge_caf_core)
  add_library(CAF::io ALIAS rlforge_caf_io)
  add_library(CAF::openssl ALIAS rlforge_caf_openssl)

  # msgpack-cxx is header-only. Its CMake config insists on Boost, which rlforge does not use:
  # the target here is the headers alone (MSGPACK_NO_BOOST).
  find_path(MSGPACK_INCLUDE_DIR msgpack.hpp REQUIRED)
  add_library(msgpackc-cxx INTERFACE IMPORTED)
  set_target_properties(msgpackc-cxx PROPERTIES INTERFACE_INCLUDE_DIRECTORIES
    "${MSGPACK_INCLUDE_DIR}" INTERFACE_COMPILE_DEFINITIONS
    "MSGPACK_NO_BOOST;MSGPACK_DEFAULT_API_VERSION=3")
endif()

# SentencePiece (libsentencepiece-dev), for rlforge::text: not part of the GPU subset.
if(NOT RLFORGE_MINIMAL_DEPS AND NOT RLFORGE_FUZZ_ONLY AND NOT TARGET rlforge_sentencepiece)
  find_path(SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h REQUIRED)
  find_library(SENTENCEPIECE_LIBRARY sentencepiece REQUIRED)
  add_library(rlforge_sentencepiece SHARED IMPORTED GLOBAL)
  set_target_properties(rlforge_sentencepiece PROPERTIES
    IMPORTED_LOCATION "${SENTENCEPIECE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${SENTENCEPIECE_INCLUDE_DIR}")
endif()
