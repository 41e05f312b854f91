# cmake -DRUN=PROGRAM|ARG... -DEXPECT_RC=N -DEXPECT_OUTPUT=TEXT|TEXT... [-DREJECT_OUTPUT=TEXT|...] -P expect_exit.cmake
#
# A test of a program that must fail in one way: it passes only when RUN
# exits with status EXPECT_RC and its output (stdout and stderr together)
# holds every EXPECT_OUTPUT text and no REJECT_OUTPUT text. CTest's WILL_FAIL
# would pass on any failure at all: a crash, a launcher that cannot start, a
# timeout. Lists are separated by '|', since ';' splits add_test's arguments.
foreach(required RUN EXPECT_RC EXPECT_OUTPUT)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "expect_exit.cmake: -D${required}=... is required (see the usage at the top of the script)")
  endif()
endforeach()
string(REPLACE "|" ";" command "${RUN}")
string(REPLACE "|" ";" expected "${EXPECT_OUTPUT}")
string(REPLACE "|" ";" rejected "${REJECT_OUTPUT}")

execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE output ERROR_VARIABLE output)
message("${output}")

set(problems "")
if(NOT rc STREQUAL EXPECT_RC)
  list(APPEND problems "exit status '${rc}', expected ${EXPECT_RC}")
endif()
foreach(text IN LISTS expected)
  string(FIND "${output}" "${text}" at)
  if(at EQUAL -1)
    list(APPEND problems "the output lacks '${text}'")
  endif()
endforeach()
foreach(text IN LISTS rejected)
  string(FIND "${output}" "${text}" at)
  if(NOT at EQUAL -1)
    list(APPEND problems "the output has '${text}'")
  endif()
endforeach()
if(problems)
  list(JOIN problems "; " why)
  message(FATAL_ERROR "expect_exit.cmake: ${why} (command: ${command})")
endif()
message(STATUS "expect_exit.cmake: exit status ${rc} and the expected output")
