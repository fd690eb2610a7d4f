#include "examples/grpo/options.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>

namespace rlforge::examples::grpo {

namespace {

bool parse_int(const std::string& s, long long lo, long long hi, long long& out) {
  if (s.empty())
    return false;
  errno = 0;
  char* end = nullptr;
  auto v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi)
    return false;
  out = v;
  return true;
}

bool parse_double(const std::string& s, double& out) {
  if (s.empty())
    return false;
  errno = 0;
  char* end = nullptr;
  auto v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v))
    return false;
  out = v;
  return true;
}

void apply_quick(options& o) {
  o.quick = true;
  o.steps = 4;
  o.held_out = 50;
  o.sft_steps = 40;
  o.sft_batch = 32;
  o.sft_target = 0;
  o.prompts = 8;
  o.group = 4;
}

} // namespace

parse_result parse_options(const std::vector<std::string>& args) {
  parse_result r;
  auto& o = r.opts;
  if (std::find(args.begin(), args.end(), "--quick") != args.end())
    apply_quick(o);
  constexpr long long big = 1000000000;
  // Integer flags: target, smallest and largest allowed value.
  struct int_flag {
    int* target;
    long long lo, hi;
  };
  std::map<std::string, int_flag> ints{
    {"--steps", {&o.steps, 1, big}},         {"--digits", {&o.digits, 1, 4}},
    {"--held-out", {&o.held_out, 1, big}},   {"--sft-steps", {&o.sft_steps, 0, big}},
    {"--sft-batch", {&o.sft_batch, 1, big}}, {"--prompts", {&o.prompts, 1, big}},
    {"--group", {&o.group, 2, big}},         {"--epochs", {&o.epochs, 1, 100}},
  };
  // Real flags: target and whether 0 is allowed (all must be finite and not negative).
  std::map<std::string, std::pair<double*, bool>> reals{
    {"--sft-lr", {&o.sft_lr, false}},
    {"--lr", {&o.lr, false}},
    {"--temperature", {&o.temperature, false}},
    {"--kl-coef", {&o.kl_coef, true}},
    {"--sft-target", {&o.sft_target, true}},
  };
  std::map<std::string, std::string*> paths{{"--metrics", &o.metrics}, {"--plot", &o.plot},
                                            {"--cluster", &o.cluster}, {"--tls", &o.tls},
                                            {"--layout", &o.layout}};
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a == "--quick")
      continue;
    if (a == "--quiet") {
      o.quiet = true;
      continue;
    }
    if (a == "--help" || a == "-h") {
      r.help = true;
      continue;
    }
    bool known = ints.count(a) || reals.count(a) || paths.count(a) || a == "--seed";
    if (!known) {
      r.error = "unknown argument '" + a + "'";
      return r;
    }
    if (i + 1 >= args.size()) {
      r.error = a + " needs a value";
      return r;
    }
    const auto& v = args[++i];
    if (auto it = ints.find(a); it != ints.end()) {
      long long x = 0;
      if (!parse_int(v, it->second.lo, it->second.hi, x)) {
        r.error = a + " must be an integer in [" + std::to_string(it->second.lo) + ", " +
                  std::to_string(it->second.hi) + "], got '" + v + "'";
        return r;
      }
      *it->second.target = static_cast<int>(x);
    } else if (auto rt = reals.find(a); rt != reals.end()) {
      double x = 0;
      bool zero_ok = rt->second.second;
      if (!parse_double(v, x) || x < 0 || (x == 0 && !zero_ok)) {
        r.error = a + " must be a finite number " + (zero_ok ? ">= 0" : "> 0") + ", got '" + v +
                  "'";
        return r;
      }
      if (a == "--sft-target" && x > 1) {
        r.error = "--sft-target must be in [0, 1], got '" + v + "'";
        return r;
      }
      *rt->second.first = x;
    } else if (auto pt = paths.find(a); pt != paths.end()) {
      if (v.empty()) {
        r.error = a + " needs a non-empty path";
        return r;
      }
      if (a == "--layout" && v != "colocated" && v != "split") {
        r.error = "--layout must be colocated or split, got '" + v + "'";
        return r;
      }
      *pt->second = v;
    } else { // --seed
      long long x = 0;
      if (!parse_int(v, 0, std::numeric_limits<long long>::max(), x)) {
        r.error = "--seed must be a non-negative integer, got '" + v + "'";
        return r;
      }
      o.seed = static_cast<uint64_t>(x);
    }
  }
  return r;
}

std::string usage(const std::string& prog) {
  return "usage: " + prog +
         " [--steps N] [--seed S] [--metrics FILE] [--plot FILE] [--quiet] [--quick]\n"
         "       [--digits D] [--held-out N] [--sft-steps N] [--sft-batch B] [--sft-lr X]\n"
         "       [--sft-target A] [--prompts P] [--group G] [--lr X] [--epochs E]\n"
         "       [--temperature T] [--kl-coef C] [--layout colocated|split]\n"
         "       [--cluster HOST:PORT] [--tls DIR]\n"
         "GRPO on multi-digit addition: SFT warm start, then GRPO with colocated policy, ref and\n"
         "inference engines on virtual GPUs; prints held-out accuracy before and after.\n"
         "--quick runs a small job (a few steps) to check everything end to end.\n"
         "--cluster runs the ranks on the nodes of a cluster (rlforge head / rlforge node);\n"
         "--layout split puts the policy and the engines on different bundles (nodes).\n";
}

} // namespace rlforge::examples::grpo
