# Run by ctest (consumer.options_off): the `install` preset's settings with
# VEMESH_WITH_MPI, VEMESH_WITH_GLOO and VEMESH_WITH_REDIS OFF, shared, built and
# installed into a scratch prefix; then options_consumer (options_main.cc)
# built against it with find_package(vemesh) and run: every stubbed entry
# point answers Unimplemented naming its option. Neither the installed
# libraries (readelf -d, NEEDED) nor the program (ldd) load libmpi, libgloo
# or libhiredis, and no MPI header is installed.
#
# -D: VEMESH_SOURCE_DIR, VEMESH_CONSUMER_SOURCE, VEMESH_SCRATCH,
#     CMAKE_CXX_COMPILER, CMAKE_CXX_COMPILER_LAUNCHER (may be empty), JOBS.
# As in check.cmake, the scratch folder sits at the depth of the test's own
# build (build/<preset>_options_off), so ccache with CCACHE_BASEDIR serves
# the objects the two builds share.
set(scratch ${VEMESH_SCRATCH})
file(REMOVE_RECURSE ${scratch})
set(prefix ${scratch}/_prefix)

include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

string(TIMESTAMP start "%s")
# -B overrides the preset's binaryDir; the preset is read from the source dir.
execute_process(COMMAND ${CMAKE_COMMAND} --preset install -S ${VEMESH_SOURCE_DIR}
                        -B ${scratch} -DBUILD_SHARED_LIBS=ON
                        -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--no-undefined
                        -DVEMESH_WITH_MPI=OFF -DVEMESH_WITH_GLOO=OFF -DVEMESH_WITH_REDIS=OFF
                        -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} ${launcher}
                WORKING_DIRECTORY ${VEMESH_SOURCE_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc)
  message(FATAL_ERROR "configuring vemesh (preset install, options OFF) failed (${rc}):\n${out}")
endif()
run("building vemesh" ${CMAKE_COMMAND} --build ${scratch} --parallel ${JOBS})
run("installing vemesh" ${CMAKE_COMMAND} --install ${scratch} --prefix ${prefix})

set(failures)
file(GLOB installed_libs ${prefix}/lib*/libvemesh_*.so*)
if(NOT installed_libs)
  list(APPEND failures "no libvemesh_*.so installed under ${prefix}")
endif()
foreach(lib IN LISTS installed_libs)
  run("readelf ${lib}" readelf -d ${lib})
  if(output MATCHES "NEEDED[^\n]*(libmpi|libgloo|libhiredis)")
    list(APPEND failures "${lib} needs MPI, Gloo or hiredis:\n${output}")
  endif()
endforeach()

file(GLOB_RECURSE mpi_headers ${prefix}/include/vemesh/*/mpi/*)
if(mpi_headers)
  list(APPEND failures "MPI headers were installed: ${mpi_headers}")
endif()

set(dir ${scratch}/_options_consumer)
run("configuring options_consumer" ${CMAKE_COMMAND} -S ${VEMESH_CONSUMER_SOURCE} -B ${dir}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DCMAKE_BUILD_TYPE=Release -DVEMESH_CONSUMER_OPTIONS_OFF=ON)
run("building options_consumer" ${CMAKE_COMMAND} --build ${dir})
run("running options_consumer" ${dir}/options_consumer)
message(STATUS "${output}")
run("ldd options_consumer" ldd ${dir}/options_consumer)
if(output MATCHES "not found")
  list(APPEND failures "options_consumer misses a library:\n${output}")
endif()
if(output MATCHES "(^|[\n\t /])(libmpi|libgloo|libhiredis)[.-]")
  list(APPEND failures "options_consumer loads MPI, Gloo or hiredis:\n${output}")
endif()

string(TIMESTAMP done "%s")
math(EXPR seconds "${done} - ${start}")
if(failures)
  list(JOIN failures "\n" text)
  message(FATAL_ERROR "options_off check: FAIL in ${seconds} s:\n${text}")
endif()
message(STATUS "options_off check: PASS in ${seconds} s")
