#!/usr/bin/env bash
# Installs the npm packages a test runs against (PACKAGE_DIR's package.json and package-lock.json,
# exact versions) into CACHE/node_modules with `npm ci`, once: a stamp of the lock file's hash
# makes later runs return at once. Never writes into the source tree. Safe to run from several
# processes at once (flock). Used by tests/text (the tokenizer reference) and tests/cli/openai
# (the OpenAI client).
#
# Usage: npm_ci.sh PACKAGE_DIR CACHE
# Exit status: 0 installed; 3 this machine cannot install them (node or npm missing, the npm
# registry unreachable), with the reason on stderr; anything else is a failure.
set -euo pipefail

here=$(cd "${1:?usage: npm_ci.sh PACKAGE_DIR CACHE}" && pwd)
cache=${2:?usage: npm_ci.sh PACKAGE_DIR CACHE}

command -v node >/dev/null 2>&1 || { echo "node is not installed (not on PATH)" >&2; exit 3; }
command -v npm >/dev/null 2>&1 || { echo "npm is not installed (not on PATH)" >&2; exit 3; }

want=$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)
stamp="$cache/installed.sha256"
installed() {
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$cache/node_modules" ]
}
installed && exit 0

mkdir -p "$cache"
exec 9>"$cache/install.lock"
flock -w 900 9 || { echo "npm_ci.sh: timed out waiting for another install into $cache" >&2; exit 1; }
installed && exit 0

registry=$(npm config get registry 2>/dev/null || echo "the npm registry")
if ! timeout 60 npm ping >/dev/null 2>&1; then
  echo "the npm registry ($registry) is not reachable" >&2
  exit 3
fi

rm -f "$stamp"
cp "$here/package.json" "$here/package-lock.json" "$cache/"
if ! timeout 900 npm ci --prefix "$cache" --no-audit --no-fund --ignore-scripts \
    >"$cache/npm-ci.log" 2>&1; then
  echo "npm ci failed in $cache (registry $registry); its log:" >&2
  tail -n 30 "$cache/npm-ci.log" >&2
  exit 1
fi
echo "$want" >"$stamp"
