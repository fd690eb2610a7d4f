#!/usr/bin/env bash
# example.help: every program given answers --help with a usage line, its flags with their
# meaning (CLI11's "Options:" list, defaults as FLAG VALUE=DEFAULT) and an example on stdout, with
# status 0 within 20 s, starting nothing; and refuses an unknown flag with status 2 naming it.
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
  elif ! grep -q "^Options:" <<< "$out" || ! grep -qE "^  --[a-z-]+ [A-Z:]+=[^ ]+" <<< "$out" \
       || ! grep -q "^example" <<< "$out"; then
    echo "FAIL: $program --help lacks its flags, their defaults or an example: $out" >&2
    fail=1
  elif err=$(timeout 20 "$program" --no-such-flag 2>&1 > /dev/null); [ $? -ne 2 ] \
       || ! grep -q -- "--no-such-flag" <<< "$err"; then
    echo "FAIL: $program --no-such-flag was not refused with status 2 naming it: $err" >&2
    fail=1
  else
    echo "$(basename "$program") --help: ok"
  fi
done
exit $fail
