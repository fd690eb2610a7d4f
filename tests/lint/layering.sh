#!/usr/bin/env bash
# Fails when a lower layer includes a higher one (DESIGN.md "Layers"):
#   placement/  pure C++: no CAF, no torch, no other rlforge folder
#   runtime/    CAF: no torch, no placement/backends/actors
#   backends/   torch: no CAF, no placement/runtime/actors
#   actors/     all three below, nothing above (cli, examples, bench, service)
# Usage: layering.sh [ROOT]        check the tree at ROOT (default: this repository)
#        layering.sh --self-test   prove the check catches a violation
set -euo pipefail

check_tree() {
  local root=$1 status=0
  declare -A forbidden=(
    [placement]='#include ["<](runtime|backends|actors|cli|examples|bench|service)/|#include <(caf|torch|ATen|c10)/'
    [runtime]='#include ["<](placement|backends|actors|cli|examples|bench|service)/|#include <(torch|ATen|c10)/'
    [backends]='#include ["<](placement|runtime|actors|cli|examples|bench|service)/|#include <caf/'
    [actors]='#include ["<](cli|examples|bench|service)/'
  )
  for dir in placement runtime backends actors; do
    [ -d "$root/$dir" ] || continue
    local hits
    hits=$(grep -rnE "${forbidden[$dir]}" "$root/$dir" --include='*.hpp' --include='*.cpp' \
             --include='*.h' || true)
    if [ -n "$hits" ]; then
      echo "layering violation in $dir/ (it may not include these):"
      echo "$hits" | sed "s|^$root/|  |"
      status=1
    fi
  done
  return $status
}

if [ "${1:-}" = "--self-test" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/placement" "$tmp/backends"
  echo '#include "placement/resources.hpp"' > "$tmp/placement/ok.cpp"
  check_tree "$tmp" > /dev/null || { echo "self-test: a clean tree was rejected"; exit 1; }
  echo '#include <caf/all.hpp>' > "$tmp/backends/bad.cpp"
  if check_tree "$tmp" > /dev/null; then
    echo "self-test: backends/ including CAF was not caught"
    exit 1
  fi
  echo "self-test: ok"
  exit 0
fi

root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
check_tree "$root"
echo "layering: ok"
