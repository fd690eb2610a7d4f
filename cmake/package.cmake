# The rlforge CMake package: `cmake --install build --prefix P` installs the libraries
# (rlforge::strings, tinker, text, chat, env, prompt, placement, runtime, backends, actors, rl, service,
# tinker_proto), their headers under P/include/<folder>/ and P/lib/cmake/rlforge/, so that a
# project with P on CMAKE_PREFIX_PATH does `find_package(rlforge)` (examples/embed/). The
# dependencies are found again by rlforgeConfig.cmake through find_dependency, from the same
# Debian packages (and the same libtorch) the build used.
include(CMakePackageConfigHelpers)
install(EXPORT rlforgeTargets NAMESPACE rlforge:: DESTINATION lib/cmake/rlforge
        FILE rlforgeTargets.cmake)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/rlforgeConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/rlforgeConfig.cmake
                              INSTALL_DESTINATION lib/cmake/rlforge)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/rlforgeConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/rlforgeConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/rlforgeConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/imported_targets.cmake
        DESTINATION lib/cmake/rlforge)
