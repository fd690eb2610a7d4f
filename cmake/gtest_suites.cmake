# Registers one ctest entry per GoogleTest *suite* of a test binary (not per TEST): binaries that
# link libtorch take about a second just to start, so a process per test case would spend most
# of the test run loading shared libraries. A failing entry's output names the failing TEST.
#
# Run at build time (POST_BUILD) with -D TEST_EXECUTABLE=... -D CTEST_FILE=... -D PREFIX=...
# -D LABELS=... -D TIMEOUT=...; writes CTEST_FILE, which the directory includes into CTestTestfile.
execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
                OUTPUT_VARIABLE listing RESULT_VARIABLE status TIMEOUT 120)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "listing the tests of ${TEST_EXECUTABLE} failed (${status}):\n${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(content "")
foreach(line IN LISTS lines)
  # Suite lines start in column 0 and end with '.', optionally followed by a "# TypeParam" note.
  if(line MATCHES "^([^ #][^ ]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    set(name "${PREFIX}.${suite}")
    string(APPEND content
      "add_test([=[${name}]=] [=[${TEST_EXECUTABLE}]=] [=[--gtest_filter=${suite}.*]=])\n"
      "set_tests_properties([=[${name}]=] PROPERTIES LABELS [=[${LABELS}]=] TIMEOUT ${TIMEOUT}")
    if(RUN_SERIAL)
      string(APPEND content " RUN_SERIAL TRUE")
    endif()
    string(APPEND content ")\n")
  endif()
endforeach()
file(WRITE "${CTEST_FILE}" "${content}")
