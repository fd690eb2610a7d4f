// Generation through the inference engines (dispatcher → engine actor → sampler) against its
// peer, the backends sampler called directly on the same model in this thread. Both sample the
// same tokens (same weights, same seeds); the program checks that, then prints tokens/s for
// each and the overhead ratio (direct time / engine time; 1.0 = no overhead). It also runs two
// engines of one thread each against the direct sampler with two threads (the dispatcher spreads
// the requests; rows are independent, so the tokens are again the same).
//
//   engine_bench [--preset small] [--batch 32] [--prompt-len 8] [--new-tokens 64] [--runs 5]
//
// Defaults: preset "small" (llama, 5.0M parameters, random weights), 32 rows of 8-token random
// prompts, 64 new tokens per row (temperature 1, no stop tokens), medians of 5 timed runs after a
// warm-up, 2 torch threads for the direct sampler and the single engine.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/engine.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "backends/threads.hpp"
#include "bench_util.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using namespace rlforge::actors;
namespace be = rlforge::backends;
using rlforge::bench::median;
using rlforge::bench::seconds_since;

namespace {

const char* const synopsis =
  "engine_bench [--preset NAME] [--batch N] [--prompt-len N] [--new-tokens N] [--runs N]";

struct options {
  std::string preset = "small";
  long batch = 32;
  long prompt_len = 8;
  long new_tokens = 64;
  long runs = 5;
};

bool parse(int argc, char** argv, options& o, std::string& why) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      why = flag + " needs a value";
      return false;
    }
    const char* v = argv[++i];
    bool ok = true;
    if (flag == "--preset")
      o.preset = v;
    else if (flag == "--batch")
      ok = rlforge::bench::parse_long(v, 1, 4096, o.batch);
    else if (flag == "--prompt-len")
      ok = rlforge::bench::parse_long(v, 1, 256, o.prompt_len);
    else if (flag == "--new-tokens")
      ok = rlforge::bench::parse_long(v, 1, 256, o.new_tokens);
    else if (flag == "--runs")
      ok = rlforge::bench::parse_long(v, 1, 1000, o.runs);
    else {
      why = "unknown flag " + flag;
      return false;
    }
    if (!ok) {
      why = flag + " got '" + v + "', out of range";
      return false;
    }
  }
  return true;
}

template <class T>
T or_die(caf::actor_system& sys, caf::expected<T> x, const char* what) {
  if (!x) {
    std::fprintf(stderr, "engine_bench: %s: %s\n", what, sys.render(x.error()).c_str());
    std::exit(1);
  }
  return std::move(*x);
}

placement_group_info one_gpu() {
  placement_group_info pg;
  pg.name = "bench";
  pg.strategy = "pack";
  pg.bundles.push_back({0, "node0", {0}, {{"GPU", 1.0}, {"CPU", 2.0}}});
  return pg;
}

} // namespace

int main(int argc, char** argv) {
  options opt;
  std::string why;
  if (!parse(argc, argv, opt, why))
    return rlforge::bench::usage_error("engine_bench", why, synopsis);
  model_spec spec;
  spec.preset = opt.preset;
  spec.seed = 7;
  auto model = build_model(spec);
  model->set_training(false);
  const auto vocab = model->config().vocab_size;

  std::mt19937_64 rng{42};
  std::vector<sample_request> requests;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<be::sampling_params> params;
  for (long i = 0; i < opt.batch; ++i) {
    sample_request r;
    for (long t = 0; t < opt.prompt_len; ++t)
      r.prompt.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab)));
    r.max_tokens = opt.new_tokens;
    r.temperature = 1.0;
    r.has_seed = true;
    r.seed = 1000 + static_cast<uint64_t>(i);
    be::sampling_params p;
    p.max_tokens = r.max_tokens;
    p.temperature = r.temperature;
    p.seed = r.seed;
    prompts.push_back(r.prompt);
    params.push_back(p);
    requests.push_back(std::move(r));
  }
  const double tokens = static_cast<double>(opt.batch * opt.new_tokens);
  std::printf("engine_bench: preset %s (%lld parameters), %ld rows x %ld new tokens, %ld runs\n",
              opt.preset.c_str(), static_cast<long long>(model->num_parameters()), opt.batch,
              opt.new_tokens, opt.runs);

  // Direct: the backends sampler in this thread, 2 torch threads (warm-up here; timed runs are
  // interleaved with the engine runs below so that load changes hit both alike).
  be::set_intra_op_threads(2);
  auto direct_out = be::generate(*model, prompts, params);
  auto direct_run = [&] {
    be::set_intra_op_threads(2);
    auto start = rlforge::bench::clock_type::now();
    direct_out = be::generate(*model, prompts, params);
    return seconds_since(start);
  };

  runtime::system_config cfg;
  if (auto err = cfg.parse_args({})) {
    std::fprintf(stderr, "engine_bench: %s\n", caf::to_string(err).c_str());
    return 2;
  }
  register_engine_kind();
  caf::actor_system sys{cfg};
  trainer_client client{sys, spawn_dispatcher(sys), std::chrono::seconds(600)};
  std::vector<actor_group> groups;
  auto engines = [&](const std::string& role, int ranks, int threads) {
    group_spec s;
    s.name = role;
    s.kind = "engine";
    s.placement = one_gpu();
    s.num_ranks = ranks;
    s.threads_per_rank = threads;
    s.collectives = false;
    auto g = or_die(sys, actor_group::spawn(sys, s), "spawn engines");
    groups.push_back(g);
    or_die(sys, client.register_engines(g, role), "register engines");
    or_die(sys, client.init_model(role, spec), "init_model");
  };
  engines("one_x2", 1, 2);
  engines("two_x1", 2, 1);

  bool same = true;
  auto engine_run = [&](const std::string& role) {
    auto start = rlforge::bench::clock_type::now();
    auto out = or_die(sys, client.generate(requests, role), "generate");
    double t = seconds_since(start);
    for (size_t i = 0; i < out.size(); ++i)
      same = same && out[i].tokens == direct_out[i].tokens;
    return t;
  };
  or_die(sys, client.generate(requests, "one_x2"), "warm-up generate");
  or_die(sys, client.generate(requests, "two_x1"), "warm-up generate");
  std::vector<double> direct_s, one_s, two_s;
  for (long r = 0; r < opt.runs; ++r) {
    direct_s.push_back(direct_run());
    one_s.push_back(engine_run("one_x2"));
    two_s.push_back(engine_run("two_x1"));
  }
  const double direct = median(direct_s);
  const double one = median(one_s);
  const double two = median(two_s);
  std::printf("  direct sampler (2 threads):      %8.0f tok/s  (median %.3f s)\n",
              tokens / direct, direct);
  std::printf("  1 engine x 2 threads:            %8.0f tok/s  (median %.3f s)  overhead ratio "
              "%.3f\n",
              tokens / one, one, direct / one);
  std::printf("  2 engines x 1 thread (spread):   %8.0f tok/s  (median %.3f s)  ratio to direct "
              "%.3f\n",
              tokens / two, two, direct / two);
  std::printf("  same tokens as the direct sampler: %s\n", same ? "yes" : "NO");
  for (auto& g : groups)
    g.stop();
  return same ? 0 : 1;
}
