# Runs one no-hang scenario: LAUNCH (mpiexec) FLAGS -n NP PROGRAM SCENARIO
# TIMEOUT. Passes when every rank printed a PASS line (it got the expected
# error) and the whole job ended within LIMIT seconds. A job that does not
# end is killed at LIMIT and fails: that is a hang.
string(TIMESTAMP t0 "%s")
execute_process(
  COMMAND ${LAUNCH} ${FLAGS} -n ${NP} ${PROGRAM} ${SCENARIO} ${TIMEOUT}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
  TIMEOUT ${LIMIT})
string(TIMESTAMP t1 "%s")
math(EXPR took "${t1} - ${t0}")
message("${out}")
if(NOT rc MATCHES "^[0-9]+$")
  message("${err}")
  message(FATAL_ERROR "${SCENARIO}: the job did not end within ${LIMIT} s (${rc}): a hang")
endif()
string(REGEX MATCHALL "no_hang\\[${SCENARIO}\\] rank [0-9]+/${NP}: PASS" passes "${out}")
list(LENGTH passes n)
if(NOT n EQUAL NP OR out MATCHES ": FAIL ")
  message("${err}")
  message(FATAL_ERROR "${SCENARIO}: ${n} of ${NP} ranks ended with the expected error")
endif()
message(STATUS "${SCENARIO}: every rank (${NP}) ended with the expected error in ${took} s (limit ${LIMIT} s)")
