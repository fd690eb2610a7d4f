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
  # GCC's -Wmaybe-uninitialized gives false positives under the sanitizers' instrumentation (GCC's
  # manual warns against combining -Werror with them). It fires inside libtorch's headers at -O1
  # (at::Generator, reached from at::manual_seed), so it stays a warning in sanitized builds.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-error=maybe-uninitialized)
  endif()
  add_link_options(-fsanitize=${RLFORGE_SANITIZE})
endif()

# rlforge_add_library(<folder> SOURCES ... DEPS ...): the library rlforge_<folder>, alias
# rlforge::<folder>, includes written from the repository root. `cmake --install` puts it in
# the rlforge package (cmake/package.cmake) as rlforge::<folder>, with the folder's headers
# under include/<folder>/.
function(rlforge_add_library name)
  cmake_parse_arguments(arg "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(rlforge_${name} STATIC ${arg_SOURCES})
  add_library(rlforge::${name} ALIAS rlforge_${name})
  target_include_directories(rlforge_${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                             $<INSTALL_INTERFACE:include>)
  target_link_libraries(rlforge_${name} PUBLIC ${arg_DEPS} PRIVATE ${arg_PRIVATE_DEPS}
                        $<BUILD_INTERFACE:rlforge_warnings>)
  set_target_properties(rlforge_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON EXPORT_NAME ${name})
  rlforge_install_library(rlforge_${name} ${CMAKE_CURRENT_SOURCE_DIR} ${name})
endfunction()

# rlforge_install_library(<target> <header dir> <include subdir>): installs a library into the
# export set of the rlforge package and the headers of <header dir> (its sub-folders too) under
# include/<include subdir>/.
#
# A sanitized build's libraries are instrumented, so a program that links the installed package
# links the sanitizers' runtimes too: the installed target carries -fsanitize as a link option.
function(rlforge_install_library target header_dir include_subdir)
  if(RLFORGE_SANITIZE)
    target_link_options(${target} INTERFACE $<INSTALL_INTERFACE:-fsanitize=${RLFORGE_SANITIZE}>)
  endif()
  install(TARGETS ${target} EXPORT rlforgeTargets ARCHIVE DESTINATION lib)
  install(DIRECTORY ${header_dir}/ DESTINATION include/${include_subdir}
          FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h")
endfunction()

# rlforge_add_test(<name> SOURCES ... DEPS ... LABELS ... [TIMEOUT s]): one GoogleTest binary;
# each test suite in it becomes one ctest entry `<name without _tests>.<Suite>` with the labels
# (see cmake/gtest_suites.cmake for why suites rather than single tests).
#
# RUN_SERIAL: the suites run while no other test runs (multi-process tests whose heartbeats
# must not starve).
function(rlforge_add_test name)
  cmake_parse_arguments(arg "RUN_SERIAL" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${arg_SOURCES})
  target_link_libraries(${name} PRIVATE ${arg_DEPS} GTest::gtest GTest::gmock GTest::gtest_main
                        rlforge_warnings)
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 300)
  endif()
  string(REGEX REPLACE "_tests$" "" prefix "${name}")
  set(ctest_file "${CMAKE_CURRENT_BINARY_DIR}/${name}_suites.cmake")
  add_custom_command(TARGET ${name} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D TEST_EXECUTABLE=$<TARGET_FILE:${name}> -D CTEST_FILE=${ctest_file}
            -D PREFIX=${prefix} "-D LABELS=${arg_LABELS}" -D TIMEOUT=${arg_TIMEOUT}
            -D RUN_SERIAL=${arg_RUN_SERIAL}
            -P ${PROJECT_SOURCE_DIR}/cmake/gtest_suites.cmake
    BYPRODUCTS ${ctest_file}
    VERBATIM)
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${ctest_file})
endfunction()

# Precompiled headers for targets with many libtorch translation units. Off by default: on the
# 2-core machines a clean build used as much CPU time with them as without (each target compiles
# its own ~500 MB header image), see docs/PERFORMANCE.md. Worth trying for incremental builds.
option(RLFORGE_PCH "use precompiled headers for torch-heavy targets" OFF)
function(rlforge_use_pch target)
  if(RLFORGE_PCH)
    target_precompile_headers(${target} PRIVATE ${ARGN})
  endif()
endfunction()
