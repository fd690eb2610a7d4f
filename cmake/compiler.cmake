# Compiler settings shared by every target: warnings, ccache, sanitizers.
find_program(RLFORGE_CCACHE ccache)
if(RLFORGE_CCACHE)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${RLFORGE_CCACHE}")
endif()

add_library(rlforge_warnings INTERFACE)
target_compile_options(rlforge_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter)
if(RLFORGE_WERROR)
  target_compile_options(rlforge_warnings INTERFACE -Werror)
endif()

if(RLFORGE_SANITIZE)
  add_compile_options(-fsanitize=${RLFORGE_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${RLFORGE_SANITIZE})
endif()

# rlforge_add_library(<folder> SOURCES ... DEPS ...): the library rlforge_<folder>, alias
# rlforge::<folder>, includes written from the repository root.
function(rlforge_add_library name)
  cmake_parse_arguments(arg "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(rlforge_${name} STATIC ${arg_SOURCES})
  add_library(rlforge::${name} ALIAS rlforge_${name})
  target_include_directories(rlforge_${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(rlforge_${name} PUBLIC ${arg_DEPS} PRIVATE ${arg_PRIVATE_DEPS} rlforge_warnings)
  set_target_properties(rlforge_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

# rlforge_add_test(<name> SOURCES ... DEPS ... LABELS ...): one GoogleTest binary; each TEST
# becomes its own ctest entry with the given labels.
function(rlforge_add_test name)
  cmake_parse_arguments(arg "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE ${arg_DEPS} GTest::gtest GTest::gmock GTest::gtest_main
                        rlforge_warnings)
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 120)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
                       PROPERTIES LABELS "${arg_LABELS}" TIMEOUT ${arg_TIMEOUT})
endfunction()
