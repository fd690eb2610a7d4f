#!/usr/bin/env bash
# cli.help: `rlforge --help` lists the commands; every command answers --help (its flags, their
# defaults, one example) with status 0 and starts nothing (`rlforge head --help` used to start a
# head); `rlforge --version` prints the version, the build and the wire signature; an unknown
# flag is refused by name with status 2; `rlforge completion --shell bash` completes commands
# and flags.
#   help.sh <rlforge binary>
set -uo pipefail
rlforge=$1
fail=0
bad() { echo "FAIL: $*" >&2; fail=1; }

top=$(timeout 20 "$rlforge" --help) || bad "rlforge --help exited $?"
commands=$(awk '/^Subcommands:/{on=1; next} on && /^  [a-z]/ {print $1}' <<< "$top")
[ -n "$commands" ] || bad "rlforge --help lists no commands: $top"
for c in $commands; do
  out=$(timeout 10 "$rlforge" "$c" --help 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || bad "rlforge $c --help exited $rc (124 = still running after 10 s): $out"
  grep -q "^example:" <<< "$out" || bad "rlforge $c --help has no example: $out"
  grep -q -- "--help" <<< "$out" || bad "rlforge $c --help lists no flags: $out"
  echo "rlforge $c --help: ok ($(grep -c -- ' --' <<< "$out") flag lines)"
done
for c in tokenize head serve generate; do
  grep -qx "$c" <<< "$commands" || bad "rlforge --help does not list $c"
done
# Defaults are shown where a flag has one.
timeout 10 "$rlforge" serve --help | grep -q -- "--port VALUE=8000" ||
  bad "rlforge serve --help does not show --port's default 8000"
version=$(timeout 20 "$rlforge" --version) || bad "rlforge --version exited $?"
grep -q "^rlforge [0-9]\+\.[0-9]\+\.[0-9]\+$" <<< "$version" || bad "no version line: $version"
grep -q "^wire signature: [0-9a-f]\{16\} " <<< "$version" || bad "no wire signature: $version"
grep -q "^build: cuda " <<< "$version" || bad "no build line: $version"
err=$(timeout 10 "$rlforge" tokenize --model /nonexistent --text hi --frobnicate 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 2 ] || bad "an unknown flag exited $rc, not 2: $err"
grep -q -- "--frobnicate" <<< "$err" || bad "an unknown flag is refused without naming it: $err"
err=$(timeout 10 "$rlforge" tokenize --text hi 2>&1 >/dev/null)
[ $? -eq 2 ] && grep -q -- "--model is required" <<< "$err" ||
  bad "a missing required flag is not refused by name: $err"
# Bash completion from the same declarations: commands, then each command's flags.
script=$(timeout 10 "$rlforge" completion --shell bash) || bad "rlforge completion exited $?"
complete_words() {
  bash -c 'eval "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _rlforge;
           echo "${COMPREPLY[*]}"' _ "$script" "$@"
}
[ "$(complete_words rlforge toke)" = "tokenize" ] ||
  bad "completing 'rlforge toke' gives '$(complete_words rlforge toke)'"
grep -qw -- "--metrics-port" <<< "$(complete_words rlforge head --met)" ||
  bad "completing 'rlforge head --met' gives '$(complete_words rlforge head --met)'"
err=$(timeout 10 "$rlforge" completion --shell fish 2>&1 >/dev/null)
[ $? -eq 2 ] && grep -q "bash" <<< "$err" || bad "completion --shell fish: $err"
exit $fail
