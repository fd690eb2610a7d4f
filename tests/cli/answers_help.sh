#!/usr/bin/env bash
# example.help: every program given answers --help with a usage line on stdout and status 0
# within 20 s, starting nothing.
#   answers_help.sh PROGRAM...
set -uo pipefail
fail=0
for program in "$@"; do
  out=$(timeout 20 "$program" --help 2> /dev/null)
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "FAIL: $program --help exited $rc (124: still running after 20 s)" >&2
    fail=1
  elif ! grep -q "^usage: " <<< "$out"; then
    echo "FAIL: $program --help printed no usage line: $out" >&2
    fail=1
  else
    echo "$(basename "$program") --help: ok"
  fi
done
exit $fail
