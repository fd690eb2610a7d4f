#!/usr/bin/env bash
# Fails when a lower layer includes a higher one (DESIGN.md "Layers"):
#   strings/    standard C++ only, no other rlforge folder: the messages' text helpers, which
#               every other folder may use (it is below them all)
#   tinker/     standard C++ only: no CAF, no torch, no other rlforge folder but strings/
#   text/       standard C++ and Debian libraries (PCRE2, ICU, SentencePiece, nlohmann-json): no CAF,
#               no torch, no other rlforge folder but strings/
#   chat/       standard C++ and nlohmann-json only: no CAF, no torch, no other rlforge folder but
#               strings/
#   env/        standard C++, POSIX and nlohmann-json only: no CAF, no torch, no other rlforge folder
#   prompt/     standard C++ on text/ and chat/ only: no CAF, no torch, no other rlforge folder
#   placement/  pure C++: no CAF, no torch, no other rlforge folder
#   runtime/    CAF: no torch, no placement/backends/actors
#   backends/   torch: no CAF, no placement/runtime/actors; text/ only in the seam that adapts
#               its tokenizers (backends/model/text_detokenizer.*), so that the GPU subset
#               (RLFORGE_MINIMAL_DEPS) builds without text/
#   actors/     all three below, nothing above (rl, cli, examples, bench, service), no text/,
#               chat/, env/ or prompt/
#   rl/         the RL loop: actors/ and below, nothing above (cli, examples, bench, service)
#   service/    runtime/, placement/, prompt/ (with text/ and chat/, for the OpenAI endpoints) and
#               the torch-free actors/ headers listed in service_actor_headers; no torch, no
#               backends/, nothing above (cli, examples, bench)
# Usage: layering.sh [ROOT]        check the tree at ROOT (default: this repository)
#        layering.sh --self-test   prove the check catches a violation
set -euo pipefail

check_tree() {
  local root=$1 status=0
  declare -A forbidden=(
    [strings]='#include ["<](tinker|text|chat|env|prompt|rl|placement|runtime|backends|actors|cli|examples|bench|service|tests|fuzz)/|#include <(caf|torch|ATen|c10)/'
    [tinker]='#include ["<](rl|prompt|placement|runtime|backends|actors|cli|examples|bench|service)/|#include <(caf|torch|ATen|c10)/'
    [text]='#include ["<](rl|tinker|chat|env|prompt|placement|runtime|backends|actors|cli|examples|bench|service|tests|fuzz)/|#include <(caf|torch|ATen|c10)/'
    [chat]='#include ["<](rl|tinker|text|env|prompt|placement|runtime|backends|actors|cli|examples|bench|service|tests|fuzz)/|#include <(caf|torch|ATen|c10)/'
    [env]='#include ["<](rl|tinker|text|chat|prompt|placement|runtime|backends|actors|cli|examples|bench|service|tests|fuzz)/|#include <(caf|torch|ATen|c10)/'
    [prompt]='#include ["<](rl|tinker|env|placement|runtime|backends|actors|cli|examples|bench|service|tests|fuzz)/|#include <(caf|torch|ATen|c10)/'
    [placement]='#include ["<](rl|prompt|runtime|backends|actors|cli|examples|bench|service)/|#include <(caf|torch|ATen|c10)/'
    [runtime]='#include ["<](rl|placement|backends|actors|cli|examples|bench|service)/|#include <(torch|ATen|c10)/'
    [backends]='#include ["<](rl|placement|runtime|actors|cli|examples|bench|service)/|#include <caf/'
    [actors]='#include ["<](rl|text|chat|env|prompt|cli|examples|bench|service)/'
    [rl]='#include ["<](text|chat|env|prompt|cli|examples|bench|service)/'
    [service]='#include ["<](rl|backends|cli|examples|bench)/|#include <(torch|ATen|c10)/'
  )
  # The actors/ headers service/ may include: plain C++ interfaces that pull neither torch nor CAF.
  local service_actor_headers='actors/tinker_backend\.hpp'
  for dir in strings tinker text chat env prompt placement runtime backends actors rl service; do
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
  if [ -d "$root/backends" ]; then
    local hits
    hits=$(grep -rnE '#include ["<](text|chat|env|prompt)/' "$root/backends" --include='*.hpp' \
             --include='*.cpp' --include='*.h' | grep -v '/model/text_detokenizer\.[ch]pp:' || true)
    if [ -n "$hits" ]; then
      echo "layering violation in backends/ (text/ only in model/text_detokenizer.*):"
      echo "$hits" | sed "s|^$root/|  |"
      status=1
    fi
  fi
  if [ -d "$root/service" ]; then
    local hits
    hits=$(grep -rnE '#include ["<]actors/' "$root/service" --include='*.hpp' --include='*.cpp' \
             --include='*.h' | grep -vE "#include [\"<](${service_actor_headers})[\">]" || true)
    if [ -n "$hits" ]; then
      echo "layering violation in service/ (only these actors/ headers: ${service_actor_headers//\\/}):"
      echo "$hits" | sed "s|^$root/|  |"
      status=1
    fi
  fi
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
  rm "$tmp/backends/bad.cpp"
  mkdir -p "$tmp/backends/model"
  echo '#include "text/tokenizer.hpp"' > "$tmp/backends/model/text_detokenizer.cpp"
  check_tree "$tmp" > /dev/null || { echo "self-test: backends' text seam was rejected"; exit 1; }
  echo '#include "text/tokenizer.hpp"' > "$tmp/backends/model/sampler.cpp"
  if check_tree "$tmp" > /dev/null; then
    echo "self-test: backends/ including text/ outside its seam was not caught"
    exit 1
  fi
  rm -r "$tmp/backends/model"
  mkdir -p "$tmp/tinker"
  echo '#include <caf/all.hpp>' > "$tmp/tinker/bad.cpp"
  if check_tree "$tmp" > /dev/null; then
    echo "self-test: tinker/ including CAF was not caught"
    exit 1
  fi
  rm "$tmp/tinker/bad.cpp"
  mkdir -p "$tmp/text"
  echo '#include "text/tokenizer.hpp"' > "$tmp/text/ok.cpp"
  echo '#include <unicode/normalizer2.h>' > "$tmp/text/ok2.cpp"
  check_tree "$tmp" > /dev/null || { echo "self-test: clean text/ was rejected"; exit 1; }
  for bad in '#include <caf/all.hpp>' '#include <torch/torch.h>' '#include "tinker/types.hpp"' \
             '#include "chat/value.hpp"' '#include "runtime/errc.hpp"' '#include "tests/text/x.hpp"'; do
    echo "$bad" > "$tmp/text/bad.hpp"
    if check_tree "$tmp" > /dev/null; then
      echo "self-test: text/ with '$bad' was not caught"
      exit 1
    fi
    rm "$tmp/text/bad.hpp"
  done
  mkdir -p "$tmp/chat" "$tmp/env"
  echo '#include "chat/value.hpp"' > "$tmp/chat/ok.cpp"
  echo '#include <sys/wait.h>' > "$tmp/env/ok.cpp"
  check_tree "$tmp" > /dev/null || { echo "self-test: clean chat/ or env/ was rejected"; exit 1; }
  for bad in '#include <caf/all.hpp>' '#include <torch/torch.h>' '#include "runtime/errc.hpp"' \
             '#include "tinker/types.hpp"' '#include "text/tokenizer.hpp"' '#include "env/pool.hpp"'; do
    echo "$bad" > "$tmp/chat/bad.hpp"
    if check_tree "$tmp" > /dev/null; then
      echo "self-test: chat/ with '$bad' was not caught"
      exit 1
    fi
    rm "$tmp/chat/bad.hpp"
  done
  for bad in '#include <caf/all.hpp>' '#include <ATen/ATen.h>' '#include "actors/worker.hpp"' \
             '#include "chat/value.hpp"' '#include "service/http_server.hpp"'; do
    echo "$bad" > "$tmp/env/bad.cpp"
    if check_tree "$tmp" > /dev/null; then
      echo "self-test: env/ with '$bad' was not caught"
      exit 1
    fi
    rm "$tmp/env/bad.cpp"
  done
  mkdir -p "$tmp/prompt"
  printf '#include "text/tokenizer.hpp"\n#include "chat/template_renderer.hpp"\n' > "$tmp/prompt/ok.cpp"
  check_tree "$tmp" > /dev/null || { echo "self-test: clean prompt/ was rejected"; exit 1; }
  for bad in '#include <caf/all.hpp>' '#include <torch/torch.h>' '#include "env/pool.hpp"' \
             '#include "backends/model/causal_lm.hpp"' '#include "examples/grpo/options.hpp"'; do
    echo "$bad" > "$tmp/prompt/bad.hpp"
    if check_tree "$tmp" > /dev/null; then
      echo "self-test: prompt/ with '$bad' was not caught"
      exit 1
    fi
    rm "$tmp/prompt/bad.hpp"
  done
  echo '#include "prompt/chat_prompt.hpp"' > "$tmp/chat/bad.hpp"
  if check_tree "$tmp" > /dev/null; then
    echo "self-test: chat/ including prompt/ was not caught"
    exit 1
  fi
  rm "$tmp/chat/bad.hpp"
  mkdir -p "$tmp/service"
  echo '#include "actors/tinker_backend.hpp"' > "$tmp/service/ok.cpp"
  check_tree "$tmp" > /dev/null || { echo "self-test: service/ with tinker_backend was rejected"; exit 1; }
  for bad in '#include "actors/worker.hpp"' '#include <torch/torch.h>' '#include "backends/model.hpp"' \
             '#include "cli/command.hpp"'; do
    echo "$bad" > "$tmp/service/bad.hpp"
    if check_tree "$tmp" > /dev/null; then
      echo "self-test: service/ with '$bad' was not caught"
      exit 1
    fi
  done
  echo "self-test: ok"
  exit 0
fi

root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
check_tree "$root"
echo "layering: ok"
