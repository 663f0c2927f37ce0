# Installs the library and exports vemesh::vemesh for find_package(vemesh).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_vemesh_targets vemesh)
if(TARGET vemesh_strategies)
  list(APPEND _vemesh_targets vemesh_strategies)
endif()
install(TARGETS ${_vemesh_targets} EXPORT vemeshTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/vemesh/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/vemesh
  FILES_MATCHING PATTERN "*.h")
install(EXPORT vemeshTargets NAMESPACE vemesh:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vemesh)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/vemeshConfig.cmake.in
  ${PROJECT_BINARY_DIR}/vemeshConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vemesh)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/vemeshConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/vemeshConfig.cmake ${PROJECT_BINARY_DIR}/vemeshConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vemesh)
