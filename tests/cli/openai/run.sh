#!/usr/bin/env bash
# cli.openai_client: the official OpenAI JavaScript client against a real `rlforge serve` on a
# tiny random model (with its tokenizer and chat template) over loopback; client.cjs holds the
# checks. The client is installed once into CACHE by tests/support/npm_ci.sh; without node, npm
# or the registry the test is skipped (exit 77) naming what is missing. The server is stopped
# by its pid on every exit path.
#   run.sh <rlforge binary> <cache dir>
set -euo pipefail
rlforge=$1
cache=$2
here=$(cd "$(dirname "$0")" && pwd)
status=0
"$here/../../support/npm_ci.sh" "$here" "$cache" 2> "$cache.why" || status=$?
if [ "$status" -eq 3 ]; then
  echo "SKIP: the OpenAI client cannot be installed here: $(cat "$cache.why")"
  exit 77
elif [ "$status" -ne 0 ]; then
  cat "$cache.why" >&2
  exit 1
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/rlforge-openai-XXXXXX")
server=""
cleanup() {
  if [ -n "$server" ]; then
    kill -TERM "$server" 2> /dev/null || true
    for _ in $(seq 50); do kill -0 "$server" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$server" 2> /dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
"$rlforge" init-model --preset tiny --out "$work/base" --seed 3 > "$work/init.log" 2>&1 \
  || { cat "$work/init.log" >&2; exit 1; }
key=openai-test-key
RLFORGE_API_KEY=$key OMP_WAIT_POLICY=PASSIVE "$rlforge" serve --base-model "$work/base" \
  --port 0 --db "$work/serve.db" --checkpoint-dir "$work/checkpoints" 2> "$work/serve.log" &
server=$!
port=""
for _ in $(seq 600); do
  port=$(grep -o 'http://127.0.0.1:[0-9]*/' "$work/serve.log" | head -1 | sed 's/.*:\([0-9]*\)\//\1/' || true)
  [ -n "$port" ] && break
  kill -0 "$server" 2> /dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "serve printed no port in 60 s" >&2; cat "$work/serve.log" >&2; exit 1; }
if ! timeout 240 node "$here/client.cjs" "$cache/node_modules" "http://127.0.0.1:$port" "$key" base; then
  echo "--- serve log (tail) ---" >&2
  tail -40 "$work/serve.log" >&2
  exit 1
fi
