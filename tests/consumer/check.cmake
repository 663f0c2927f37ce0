# Run by ctest: install vemesh into a scratch prefix, build the consumer
# project against it with find_package(vemesh), and run it.
file(REMOVE_RECURSE ${VEMESH_SCRATCH})
# A sanitized vemesh needs the sanitizer runtime in the consumer's link too.
set(sanitize_flags)
if(VEMESH_SANITIZE)
  set(sanitize_flags -DCMAKE_CXX_FLAGS=-fsanitize=${VEMESH_SANITIZE})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --install ${VEMESH_BINARY_DIR}
                        --prefix ${VEMESH_SCRATCH}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${VEMESH_CONSUMER_SOURCE}
                        -B ${VEMESH_SCRATCH}/build
                        -DCMAKE_PREFIX_PATH=${VEMESH_SCRATCH}/prefix
                        -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
                        ${sanitize_flags}
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${VEMESH_SCRATCH}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer failed: ${rc}")
endif()
execute_process(COMMAND ${VEMESH_SCRATCH}/build/consumer RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the consumer ran and failed: ${rc}")
endif()
