// What routing training through actors costs, and how data parallelism scales on one node.
//
// 1. Dispatch overhead: forward_backward (cross-entropy) + optim_step of one model on one batch,
//    (a) called directly in-process with the backends (the same math the worker runs: log-probs
//    with entropy, the loss, backward, AdamW), and (b) through trainer_client -> dispatcher ->
//    actor group of 1 rank (batch conversion, messages, validation included). Same torch thread
//    count. Ratio = throughput (b) / (a); goal >= 0.97.
// 2. Data-parallel scaling on the same global batch: 2 ranks x 1 torch thread (gradients summed
//    with Gloo) vs 1 rank x 2 threads. Ratio = throughput (2x1) / (1x2); goal >= 0.9.
//
// Rounds alternate between the configurations (in rotating order) so they see the same machine
// load; figures are medians over the timed rounds (after warm-up). On a machine shared with
// other busy processes the OpenMP threads of the 2-thread configurations spin-wait and lose
// time slices: compare at a load average below 2, or run with OMP_WAIT_POLICY=PASSIVE.
//
//   dispatch_bench [--preset small] [--batch 16] [--seq 128] [--rounds 7] [--warmup 2]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "backends/algo/losses.hpp"
#include "backends/threads.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/system_config.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;
namespace be = rlforge::backends;
namespace algo = rlforge::backends::algo;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::string preset = "small";
  int64_t batch = 16;
  int64_t seq = 128;
  int rounds = 7;
  int warmup = 2;
};

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "dispatch_bench: %s needs a value\n", a.c_str());
      return false;
    }
    std::string v = argv[++i];
    auto positive = [&](int64_t& out) {
      out = std::atoll(v.c_str());
      if (out < 1) {
        std::fprintf(stderr, "dispatch_bench: %s must be >= 1, got '%s'\n", a.c_str(), v.c_str());
        return false;
      }
      return true;
    };
    int64_t tmp = 0;
    if (a == "--preset") {
      o.preset = v;
    } else if (a == "--batch") {
      if (!positive(o.batch))
        return false;
    } else if (a == "--seq") {
      if (!positive(o.seq) || o.seq < 4) {
        std::fprintf(stderr, "dispatch_bench: --seq must be >= 4\n");
        return false;
      }
    } else if (a == "--rounds") {
      if (!positive(tmp))
        return false;
      o.rounds = static_cast<int>(tmp);
    } else if (a == "--warmup") {
      tmp = std::atoll(v.c_str());
      if (tmp < 0) {
        std::fprintf(stderr, "dispatch_bench: --warmup must be >= 0\n");
        return false;
      }
      o.warmup = static_cast<int>(tmp);
    } else {
      std::fprintf(stderr, "dispatch_bench: unknown argument '%s'\n", a.c_str());
      return false;
    }
  }
  return true;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double load_average() {
  double load = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1)
      load = -1;
    std::fclose(f);
  }
  return load;
}

/// Rows of `seq` tokens: the first half prompt, the second half response (the trained part).
be::training_batch make_batch(const options& o, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  std::vector<std::vector<int64_t>> prompts, responses;
  for (int64_t i = 0; i < o.batch; ++i) {
    auto t = at::randint(0, vocab, {o.seq}, gen, at::kLong);
    auto p = t.data_ptr<int64_t>();
    prompts.emplace_back(p, p + o.seq / 2);
    responses.emplace_back(p + o.seq / 2, p + o.seq);
  }
  return be::from_sequences(prompts, responses);
}

/// The direct path: what a worker computes for forward_backward + optim_step, without actors.
struct direct_trainer {
  std::unique_ptr<be::causal_lm> model;
  be::adamw optimizer;

  double step(const be::training_batch& b, const be::adam_params& hp) {
    auto r = be::sequence_logprobs(*model, b.get("sequences"), b.get("attention_mask"), 1.0, 128,
                                   true);
    algo::loss_inputs in;
    in.logprobs = be::response_columns(r.logprobs, b.response_length);
    in.entropy = be::response_columns(r.entropy, b.response_length).detach();
    in.loss_mask = b.get("loss_mask");
    auto out = algo::compute_loss("cross_entropy", in);
    out.loss.backward();
    auto params = model->named_parameters();
    optimizer.step(params, hp);
    be::zero_grad(params);
    return out.loss.item<double>();
  }
};

template <class T>
T or_die(caf::actor_system& sys, caf::expected<T> x, const char* what) {
  if (!x) {
    std::fprintf(stderr, "dispatch_bench: %s failed: %s\n", what, sys.render(x.error()).c_str());
    std::exit(1);
  }
  return std::move(*x);
}

placement_group_info virtual_pg(int bundles) {
  placement_group_info pg;
  pg.name = "bench";
  pg.strategy = "pack";
  for (int i = 0; i < bundles; ++i)
    pg.bundles.push_back({static_cast<uint32_t>(i), "node0", {i}, {{"GPU", 1.0}, {"CPU", 1.0}}});
  return pg;
}

} // namespace

int main(int argc, char** argv) {
  options opt;
  if (!parse(argc, argv, opt)) {
    std::fprintf(stderr, "usage: dispatch_bench [--preset NAME] [--batch B] [--seq S] "
                         "[--rounds N] [--warmup N]\n");
    return 2;
  }
  auto config = be::preset(opt.preset);
  auto batch = make_batch(opt, config.vocab_size);
  const double tokens = static_cast<double>(opt.batch * opt.seq);
  std::printf("dispatch_bench: preset %s (%lld parameters), batch %lld x seq %lld, %d rounds "
              "(+%d warm-up), load average %.2f\n",
              opt.preset.c_str(), static_cast<long long>(be::num_parameters(config)),
              static_cast<long long>(opt.batch), static_cast<long long>(opt.seq), opt.rounds,
              opt.warmup, load_average());

  runtime::system_config cfg;
  if (auto err = cfg.parse_args({})) {
    std::fprintf(stderr, "dispatch_bench: %s\n", caf::to_string(err).c_str());
    return 2;
  }
  register_worker_kinds();
  caf::actor_system sys{cfg};
  trainer_client client{sys, spawn_dispatcher(sys), 300s};
  std::vector<actor_group> groups;
  auto add = [&](const std::string& role, int ranks, int threads) {
    group_spec s;
    s.name = role;
    s.kind = "policy";
    s.placement = virtual_pg(ranks);
    s.threads_per_rank = threads;
    auto g = or_die(sys, actor_group::spawn(sys, s), "spawn group");
    or_die(sys, client.register_group(role, g), "register");
    model_spec m;
    m.preset = opt.preset;
    m.seed = 7;
    or_die(sys, client.init_model(role, m), "init_model");
    groups.push_back(g);
  };
  add("one_x2", 1, 2);
  add("two_x1", 2, 1);

  be::set_intra_op_threads(2);
  direct_trainer direct{be::causal_lm::random(config, 7), {}};
  be::adam_params hp;
  hp.learning_rate = 1e-5; // small: the weights barely move, each step does the same work

  using step_fn = std::function<void()>;
  std::vector<std::pair<std::string, step_fn>> configs{
    {"direct (1 thread x 2)", [&] { direct.step(batch, hp); }},
    {"dispatcher -> 1 rank x 2 threads",
     [&] {
       or_die(sys, client.forward_backward("one_x2", batch, "cross_entropy"), "forward_backward");
       or_die(sys, client.optim_step("one_x2", hp), "optim_step");
     }},
    {"dispatcher -> 2 ranks x 1 thread",
     [&] {
       or_die(sys, client.forward_backward("two_x1", batch, "cross_entropy"), "forward_backward");
       or_die(sys, client.optim_step("two_x1", hp), "optim_step");
     }},
  };
  std::vector<std::vector<double>> times(configs.size());
  for (int round = 0; round < opt.warmup + opt.rounds; ++round) {
    // Rotate the order each round: a configuration must not always follow the same one
    // (libgomp's spin-waiting threads of the previous one steal cycles for a few ms).
    for (size_t k = 0; k < configs.size(); ++k) {
      size_t c = (k + static_cast<size_t>(round)) % configs.size();
      auto t0 = clock_type::now();
      configs[c].second();
      double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
      if (round >= opt.warmup)
        times[c].push_back(secs);
    }
  }
  std::vector<double> tps;
  for (size_t c = 0; c < configs.size(); ++c) {
    double t = median(times[c]);
    tps.push_back(tokens / t);
    std::printf("  %-36s median step %8.1f ms  %9.0f tokens/s\n", configs[c].first.c_str(),
                t * 1e3, tps.back());
  }
  std::printf("dispatch overhead: dispatcher/direct throughput ratio %.3f (goal >= 0.97)\n",
              tps[1] / tps[0]);
  std::printf("data-parallel scaling: (2 ranks x 1 thread)/(1 rank x 2 threads) ratio %.3f "
              "(goal >= 0.9)\n",
              tps[2] / tps[1]);
  std::printf("load average after: %.2f\n", load_average());
  for (auto& g : groups)
    g.stop();
  caf::anon_send_exit(client.dispatcher(), caf::exit_reason::user_shutdown);
  return 0;
}
