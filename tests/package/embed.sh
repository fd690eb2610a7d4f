#!/usr/bin/env bash
# package.embed: installs the build (cmake --install) into a temporary prefix, builds
# examples/embed/ (a separate CMake project doing find_package(rlforge)) against it and runs the
# driver it makes. Fails when any step fails, when the installed package names the build or
# source tree (it must stand alone), or when the driver does not report "embed: ok".
#   embed.sh <build dir> <source dir>
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/rlforge-embed-XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
for d in "$build" "$src"; do
  if grep -rlF "$(cd "$d" && pwd)" "$work/prefix/lib/cmake/rlforge"; then
    echo "embed: the installed package names $d (above); it must not depend on the build tree" >&2
    exit 1
  fi
done
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$src/examples/embed" -B "$work/embed" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}" > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/embed" > "$work/build.log" 2>&1 || { tail -50 "$work/build.log" >&2; exit 1; }
out=$("$work/embed/embed_driver" 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out"
grep -q "^embed: ok$" <<< "$out"
