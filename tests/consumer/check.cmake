# Run by ctest (consumer.static, consumer.shared): a fresh build of the
# `install` preset's settings (the library alone, Release), installed into a
# scratch prefix; then two downstream projects built against it with
# find_package(vemesh) and run:
#   consumer         vemesh::vemesh (main.cc)
#   layout_consumer  vemesh::layout alone (layout_main.cc)
# ldd of each: neither links libcudart or libnccl (CUDA is never a link
# dependency); layout_consumer links no libmpi, libgloo or libhiredis. The
# installed CMake files name no folder of this machine.
#
# -D: VEMESH_SOURCE_DIR, VEMESH_CONSUMER_SOURCE, VEMESH_SCRATCH, SHARED (ON/OFF),
#     CMAKE_CXX_COMPILER, CMAKE_CXX_COMPILER_LAUNCHER (may be empty), JOBS.
# $ENV{VEMESH_CONSUMER_CONFIGURE_ARGS}: more arguments for the library's
# configure (a ;-list), e.g. -DVEMESH_WITH_NCCL=OFF.
# The library is built in the scratch folder itself, which sits at the depth
# of the test's own build (build/<preset>_consumer_<kind>): with
# CCACHE_BASEDIR set, every compile line is then the same as there, and
# ccache serves the objects. The prefix and the consumers go inside it.
set(scratch ${VEMESH_SCRATCH})
file(REMOVE_RECURSE ${scratch})
set(prefix ${scratch}/_prefix)

# Failed checks are collected and reported together at the end; a step that
# cannot go on (configure, build, run) stops at once.
set(failures)
macro(fail message)
  list(APPEND failures "${message}")
  message(STATUS "FAIL: ${message}")
endmacro()

include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)

# A shared floor resolves every symbol in itself and the floors below it:
# a reference upwards (a cycle between floors) fails its link.
if(SHARED)
  list(APPEND launcher -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--no-undefined)
endif()
string(TIMESTAMP start "%s")
# -B overrides the preset's binaryDir; the preset is read from the source dir.
execute_process(COMMAND ${CMAKE_COMMAND} --preset install -S ${VEMESH_SOURCE_DIR}
                        -B ${scratch} -DBUILD_SHARED_LIBS=${SHARED}
                        -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} ${launcher}
                        $ENV{VEMESH_CONSUMER_CONFIGURE_ARGS}
                WORKING_DIRECTORY ${VEMESH_SOURCE_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc)
  message(FATAL_ERROR "configuring vemesh (preset install) failed (${rc}):\n${out}")
endif()
run("building vemesh" ${CMAKE_COMMAND} --build ${scratch} --parallel ${JOBS})
run("installing vemesh" ${CMAKE_COMMAND} --install ${scratch} --prefix ${prefix})
string(TIMESTAMP built "%s")
math(EXPR seconds "${built} - ${start}")
message(STATUS "vemesh (BUILD_SHARED_LIBS=${SHARED}) built and installed in ${seconds} s")

# Private headers stay behind.
file(GLOB_RECURSE internal_headers ${prefix}/include/vemesh/*/internal/*)
if(internal_headers)
  fail("internal headers were installed: ${internal_headers}")
endif()
# The installed CMake files are relocatable: no folder of this machine.
file(GLOB cmake_files ${prefix}/lib*/cmake/vemesh/*.cmake)
if(NOT cmake_files)
  message(FATAL_ERROR "no CMake files installed under ${prefix}/lib*/cmake/vemesh")
endif()
foreach(file IN LISTS cmake_files)
  file(READ ${file} text)
  foreach(path /usr/local/cuda ${VEMESH_SOURCE_DIR} ${scratch})
    string(FIND "${text}" "${path}" at)
    if(NOT at EQUAL -1)
      fail("${file} names a folder of the build machine: ${path}")
    endif()
  endforeach()
endforeach()

# The installed libraries themselves need no CUDA or NCCL (NEEDED entries):
# a consumer's ldd shows only what it links, not what a floor would pull in.
file(GLOB installed_libs ${prefix}/lib*/libvemesh_*.so*)
foreach(lib IN LISTS installed_libs)
  run("readelf ${lib}" readelf -d ${lib})
  if(output MATCHES "NEEDED[^\n]*(libcudart|libnccl)")
    fail("${lib} needs CUDA or NCCL:\n${output}")
  endif()
endforeach()
if(SHARED AND NOT installed_libs)
  fail("BUILD_SHARED_LIBS=ON installed no libvemesh_*.so under ${prefix}")
endif()

# Builds one consumer, runs it and returns its ldd output in `libraries`.
function(consumer name layout_only)
  set(dir ${scratch}/_${name})
  run("configuring ${name}" ${CMAKE_COMMAND} -S ${VEMESH_CONSUMER_SOURCE} -B ${dir}
      -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
      -DCMAKE_BUILD_TYPE=Release -DVEMESH_CONSUMER_LAYOUT_ONLY=${layout_only})
  run("building ${name}" ${CMAKE_COMMAND} --build ${dir})
  run("running ${name}" ${dir}/${name})
  message(STATUS "${output}")
  run("ldd ${name}" ldd ${dir}/${name})
  if(output MATCHES "not found")
    message(FATAL_ERROR "${name} misses a library:\n${output}")
  endif()
  set(libraries "${output}" PARENT_SCOPE)
endfunction()

macro(refuse name libraries)
  foreach(lib IN ITEMS ${ARGN})
    if("${libraries}" MATCHES "(^|[\n\t /])${lib}[.-]")
      fail("${name} links ${lib}:\n${libraries}")
    endif()
  endforeach()
endmacro()

consumer(consumer OFF)
refuse(consumer "${libraries}" libcudart libnccl)
consumer(layout_consumer ON)
refuse(layout_consumer "${libraries}" libcudart libnccl libmpi libgloo libhiredis)
# A shared build is linked as one: the layout floor's library, not a copy.
if(SHARED AND NOT libraries MATCHES "libvemesh_layout[.]so")
  fail("layout_consumer does not link libvemesh_layout.so:\n${libraries}")
endif()
if(NOT SHARED AND libraries MATCHES "libvemesh_")
  fail("a static vemesh, yet layout_consumer loads:\n${libraries}")
endif()
string(TIMESTAMP done "%s")
math(EXPR seconds "${done} - ${start}")
list(LENGTH failures count)
if(count)
  list(JOIN failures "\n" text)
  message(FATAL_ERROR "consumer check (BUILD_SHARED_LIBS=${SHARED}): ${count} failure(s) "
                      "in ${seconds} s:\n${text}")
endif()
message(STATUS "consumer check (BUILD_SHARED_LIBS=${SHARED}): PASS in ${seconds} s")
