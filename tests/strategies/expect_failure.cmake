# Runs PROGRAM under LAUNCH with NP ranks and ARGS, and passes only if the
# job exits non-zero within the time limit (a hang fails) and PATTERN
# appears at least NP times in its output: every rank explains the error
# itself.
cmake_minimum_required(VERSION 3.25)
execute_process(
  COMMAND ${LAUNCH} ${FLAGS} -n ${NP} ${PROGRAM} ${ARGS}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
  TIMEOUT 45)
set(rest "${out}${err}")
message("${rest}")
if(rc EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit, got 0")
endif()
if(NOT rc MATCHES "^[0-9]+$")
  message(FATAL_ERROR "did not finish: ${rc}")
endif()
set(n 0)
string(LENGTH "${PATTERN}" plen)
while(TRUE)
  string(FIND "${rest}" "${PATTERN}" pos)
  if(pos EQUAL -1)
    break()
  endif()
  math(EXPR n "${n} + 1")
  math(EXPR pos "${pos} + ${plen}")
  string(SUBSTRING "${rest}" ${pos} -1 rest)
endwhile()
if(n LESS NP)
  message(FATAL_ERROR "expected '${PATTERN}' from all ${NP} ranks, saw it ${n} times")
endif()
message(STATUS "rejected with exit ${rc}, error on ${n} ranks: ok")
