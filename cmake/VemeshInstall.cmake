# Installs the library, one target per floor, and exports them as
# vemesh::<floor> plus the umbrella vemesh::vemesh for find_package(vemesh),
# which may ask for floors as components:
#   find_package(vemesh REQUIRED COMPONENTS layout)   # MeshLayout alone
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_vemesh_targets vemesh)
foreach(floor IN LISTS VEMESH_FLOORS)
  list(APPEND _vemesh_targets vemesh_${floor})
endforeach()
set(_vemesh_header_excludes PATTERN "internal" EXCLUDE)
# Without MPI, its headers (comm/mpi/, bootstrap/mpi/ expose MPI types).
if(NOT VEMESH_WITH_MPI)
  list(APPEND _vemesh_header_excludes PATTERN "mpi" EXCLUDE)
endif()
if(TARGET vemesh_strategies)
  list(APPEND _vemesh_targets vemesh_strategies)
else()
  list(APPEND _vemesh_header_excludes PATTERN "strategies" EXCLUDE)
endif()
install(TARGETS ${_vemesh_targets} EXPORT vemeshTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Private headers (<floor>/internal/) stay in the source tree.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/vemesh/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/vemesh
  FILES_MATCHING PATTERN "*.h" ${_vemesh_header_excludes})
install(EXPORT vemeshTargets NAMESPACE vemesh:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vemesh)

# What the config needs to know of this build (no paths: the installed
# files must not name the build machine's folders).
if(BUILD_SHARED_LIBS)
  set(VEMESH_SHARED_LIBS ON)
else()
  set(VEMESH_SHARED_LIBS OFF)
endif()
if(NOT VEMESH_HAVE_STRATEGIES)
  set(VEMESH_HAVE_STRATEGIES OFF)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/vemeshConfig.cmake.in
  ${PROJECT_BINARY_DIR}/vemeshConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vemesh)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/vemeshConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/vemeshConfig.cmake ${PROJECT_BINARY_DIR}/vemeshConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vemesh)
