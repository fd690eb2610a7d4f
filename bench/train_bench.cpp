// Training throughput of the causal LM on the CPU, in fp32 and in bf16 mixed precision (bf16
// GEMMs, fp32 master weights; backends/model/compute_dtype.hpp): forward + backward (+ optional
// AdamW step) for a ~10M- and a ~100M-parameter Llama-style config at sequence length 256.
// Prints tokens/s, achieved GFLOP/s and their ratio to the GEMM GFLOP/s of the same dtype this
// same program measures (MFU), and the bf16 step's speed-up over the fp32 step (same run).
//
// FLOPs per step = tokens × (6 × N_matmul + 12 × layers × seq × heads × head_dim), where
// N_matmul counts the parameters used in matrix products (all projections plus lm_head; not the
// embedding table, which is a lookup, nor the norm weights). The first term is the usual
// 2 (forward) + 4 (backward) FLOPs per weight per token; the second is attention's QK^T and PV
// products (2 × 2 × seq × width per token forward, ×3 with backward; the full square is
// computed, so no causal halving).
//
//   train_bench [--threads 2] [--seq 256] [--adamw] [--only small|large] [--steps-small 5]
//               [--steps-large 3] [--batch-small 8] [--batch-large 1] [--chunk 128]
//               [--dtype fp32|bf16|both] [--profile PREFIX] [--batch-invariant]
//
// --batch-invariant runs the models in batch-invariant mode (attention's fixed-order kernel),
// for its cost against the default. --profile PREFIX records the last step of each case with libtorch's profiler into
// PREFIX-<case>-<dtype>.json (Chrome trace; bench/trace_summary.py totals it per op).
//
// The GEMM reference is sampled between training steps so both see the same machine load; the
// load average is printed too. On a machine shared with busy processes the 2-thread figures
// collapse (libgomp spin-waits at every parallel region lose whole time slices): compare runs
// at a load average below the thread count, or run with OMP_WAIT_POLICY=PASSIVE.
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backends/model/causal_lm.hpp"
#include "backends/model/compute_dtype.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"

namespace be = rlforge::backends;
using clock_type = std::chrono::steady_clock;

namespace {

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The 1-minute load average: on a shared machine, other processes steal the cores the figures
// assume, so the run prints it next to them.
double load_average() {
  double load = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1)
      load = -1;
    std::fclose(f);
  }
  return load;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// An [m, k] x [k, n] matmul in `dtype` (fp32, or bf16: `at::mm` on bf16 tensors, the fast
// oneDNN path) whose GFLOP/s is sampled between training steps, so the reference and the model
// see the same machine load (medians of both).
struct gemm_probe {
  at::Tensor a, b, c;
  double flops;
  std::vector<double> rates;

  gemm_probe(int64_t m, int64_t k, int64_t n, at::ScalarType dtype)
    : a(torch::randn({m, k}).to(dtype)), b(torch::randn({k, n}).to(dtype)), c(at::mm(a, b)),
      flops(2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n)) {}

  void sample(int reps) {
    for (int i = 0; i < reps; ++i) {
      auto t0 = clock_type::now();
      at::mm_out(c, a, b);
      rates.push_back(flops / seconds_since(t0) / 1e9);
    }
  }
};

be::model_config make_config(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads,
                             int64_t kv_heads, int64_t intermediate, int64_t max_pos) {
  be::model_config c;
  c.arch = be::architecture::llama;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.intermediate_size = intermediate;
  c.max_position_embeddings = max_pos;
  c.tie_word_embeddings = false;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.eos_token_ids = {};
  c.bos_token_id.reset();
  return c;
}

struct bench_case {
  std::string name;
  be::model_config config;
  int64_t batch;
  int steps;
};

struct options {
  int threads = 2;
  int64_t seq = 256;
  bool adamw = false;
  std::string only;
  std::string profile; ///< trace file prefix (--profile); empty = no profiling
  bool batch_invariant = false; ///< (--batch-invariant)
  int steps_small = 5;
  int steps_large = 3;
  int64_t batch_small = 8;
  int64_t batch_large = 1;
  int64_t chunk = 128;
  std::vector<be::compute_dtype> dtypes{be::compute_dtype::fp32, be::compute_dtype::bf16};
};

void usage() {
  std::fprintf(stderr,
               "usage: train_bench [--threads N] [--seq S] [--adamw] [--only small|large]\n"
               "                   [--steps-small K] [--steps-large K] [--batch-small B]\n"
               "                   [--batch-large B] [--chunk C] [--dtype fp32|bf16|both]\n"
               "                   [--profile PREFIX] [--batch-invariant]\n");
}

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "train_bench: %s needs a value\n", what);
        return nullptr;
      }
      return argv[++i];
    };
    auto positive = [&](const char* what, int64_t& out) {
      auto v = next(what);
      if (!v)
        return false;
      out = std::atoll(v);
      if (out < 1) {
        std::fprintf(stderr, "train_bench: %s must be >= 1, got '%s'\n", what, v);
        return false;
      }
      return true;
    };
    int64_t tmp = 0;
    if (a == "--adamw") {
      o.adamw = true;
    } else if (a == "--threads") {
      if (!positive("--threads", tmp))
        return false;
      o.threads = static_cast<int>(tmp);
    } else if (a == "--seq") {
      if (!positive("--seq", o.seq))
        return false;
    } else if (a == "--steps-small") {
      if (!positive("--steps-small", tmp))
        return false;
      o.steps_small = static_cast<int>(tmp);
    } else if (a == "--steps-large") {
      if (!positive("--steps-large", tmp))
        return false;
      o.steps_large = static_cast<int>(tmp);
    } else if (a == "--batch-small") {
      if (!positive("--batch-small", o.batch_small))
        return false;
    } else if (a == "--batch-large") {
      if (!positive("--batch-large", o.batch_large))
        return false;
    } else if (a == "--chunk") {
      if (!positive("--chunk", o.chunk))
        return false;
    } else if (a == "--dtype") {
      auto v = next("--dtype");
      if (!v)
        return false;
      std::string d = v;
      if (d == "both") {
        o.dtypes = {be::compute_dtype::fp32, be::compute_dtype::bf16};
      } else if (d == "fp32" || d == "bf16") {
        o.dtypes = {be::parse_compute_dtype(d)};
      } else {
        std::fprintf(stderr, "train_bench: --dtype takes fp32, bf16 or both, got '%s'\n", v);
        return false;
      }
    } else if (a == "--batch-invariant") {
      o.batch_invariant = true;
    } else if (a == "--profile") {
      auto v = next("--profile");
      if (!v)
        return false;
      o.profile = v;
    } else if (a == "--only") {
      auto v = next("--only");
      if (!v)
        return false;
      o.only = v;
      if (o.only != "small" && o.only != "large") {
        std::fprintf(stderr, "train_bench: --only takes small or large, got '%s'\n", v);
        return false;
      }
    } else {
      std::fprintf(stderr, "train_bench: unknown argument '%s'\n", a.c_str());
      return false;
    }
  }
  return true;
}

} // namespace

int main(int argc, char** argv) {
  options opt;
  if (!parse(argc, argv, opt)) {
    usage();
    return 2;
  }
  at::set_num_threads(opt.threads);
  std::printf("train_bench: threads=%d seq=%lld adamw=%s chunk=%lld batch_invariant=%s "
              "load_average=%.2f\n",
              at::get_num_threads(), static_cast<long long>(opt.seq), opt.adamw ? "on" : "off",
              static_cast<long long>(opt.chunk), opt.batch_invariant ? "on" : "off",
              load_average());


  std::vector<bench_case> cases;
  if (opt.only.empty() || opt.only == "small")
    cases.push_back({"~10M", make_config(4096, 384, 4, 6, 6, 1024, opt.seq), opt.batch_small,
                     opt.steps_small});
  if (opt.only.empty() || opt.only == "large")
    cases.push_back({"~100M", make_config(16384, 768, 12, 12, 4, 2048, opt.seq), opt.batch_large,
                     opt.steps_large});

  for (auto& bc : cases) {
    const auto& c = bc.config;
    std::map<be::compute_dtype, double> step_seconds;
    for (auto dtype : opt.dtypes) {
      auto model = be::causal_lm::random(c, 1);
      model->set_compute_dtype(dtype);
      model->set_batch_invariant(opt.batch_invariant);
      const int64_t params = model->num_parameters();
      const int64_t matmul_params = params - c.vocab_size * c.hidden_size // embedding lookup
                                    - (2 * c.num_hidden_layers + 1) * c.hidden_size; // norms
      const int64_t tokens = bc.batch * opt.seq;
      const double flops_per_token =
        6.0 * static_cast<double>(matmul_params)
        + 12.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(opt.seq)
            * static_cast<double>(c.num_attention_heads * c.head_dim);
      const double step_flops = flops_per_token * static_cast<double>(tokens);
      // The GEMM shape that dominates this model: tokens x hidden times hidden x intermediate.
      const auto gemm_type = be::gemm_scalar_type(dtype);
      gemm_probe square(1024, 1024, 1024, gemm_type);
      gemm_probe shaped(tokens, c.hidden_size, c.intermediate_size, gemm_type);

      auto params_list = model->trainable_parameters();
      std::unique_ptr<torch::optim::AdamW> optimizer;
      if (opt.adamw)
        optimizer = std::make_unique<torch::optim::AdamW>(
          params_list, torch::optim::AdamWOptions(1e-4).betas({0.9, 0.95}).weight_decay(0.0));
      torch::manual_seed(7);
      auto data = torch::randint(0, c.vocab_size, {bc.batch, opt.seq + 1}, torch::kLong);
      auto inputs = data.narrow(1, 0, opt.seq);
      auto targets = data.narrow(1, 1, opt.seq);

      std::vector<double> fwd_times, bwd_times, opt_times, step_times;
      double first_loss = 0, last_loss = 0;
      for (int step = 0; step <= bc.steps; ++step) { // step 0 is warm-up
        std::unique_ptr<torch::autograd::profiler::RecordProfile> trace;
        if (!opt.profile.empty() && step == bc.steps)
          trace = std::make_unique<torch::autograd::profiler::RecordProfile>(
              opt.profile + "-" + bc.name.substr(1) + "-" + be::to_string(dtype) + ".json");
        auto t0 = clock_type::now();
        for (auto& p : params_list)
          p.mutable_grad() = at::Tensor();
        auto hidden = model->forward_hidden(inputs);
        auto lp = be::token_logprobs(*model, hidden, targets, 1.0, opt.chunk, false).logprobs;
        auto loss = -lp.mean();
        double fwd = seconds_since(t0);
        auto t1 = clock_type::now();
        loss.backward();
        double bwd = seconds_since(t1);
        auto t2 = clock_type::now();
        if (optimizer)
          optimizer->step();
        double opt_s = seconds_since(t2);
        double total = seconds_since(t0);
        double l = loss.item<double>();
        if (step == 1)
          first_loss = l;
        last_loss = l;
        square.sample(3);
        shaped.sample(3);
        if (step > 0) {
          fwd_times.push_back(fwd);
          bwd_times.push_back(bwd);
          opt_times.push_back(opt_s);
          step_times.push_back(total);
        }
      }
      const double step_s = median(step_times);
      step_seconds[dtype] = step_s;
      const double peak_square = median(square.rates);
      const double peak_model = median(shaped.rates);
      const double achieved = step_flops / step_s / 1e9;
      const char* dt = be::to_string(dtype);
      std::printf("\n%s %s: %lld params (%lld in matmuls), layers=%lld hidden=%lld heads=%lld/%lld "
                  "inter=%lld vocab=%lld, batch=%lld x seq=%lld = %lld tokens/step, %d steps\n",
                  bc.name.c_str(), dt, static_cast<long long>(params),
                  static_cast<long long>(matmul_params),
                  static_cast<long long>(c.num_hidden_layers),
                  static_cast<long long>(c.hidden_size),
                  static_cast<long long>(c.num_attention_heads),
                  static_cast<long long>(c.num_key_value_heads),
                  static_cast<long long>(c.intermediate_size),
                  static_cast<long long>(c.vocab_size), static_cast<long long>(bc.batch),
                  static_cast<long long>(opt.seq), static_cast<long long>(tokens), bc.steps);
      std::printf("  median step %.3f s (forward %.3f, backward %.3f, AdamW %.3f), loss %.4f -> "
                  "%.4f\n",
                  step_s, median(fwd_times), median(bwd_times), median(opt_times), first_loss,
                  last_loss);
      std::printf("  throughput %.0f tokens/s, %.1f GFLOP/s (%.2f GFLOP/token)\n",
                  static_cast<double>(tokens) / step_s, achieved, flops_per_token / 1e9);
      std::printf("  %s GEMM (sampled between steps, median): 1024x1024x1024 %.1f GFLOP/s, "
                  "%lldx%lldx%lld %.1f GFLOP/s\n",
                  dt, peak_square, static_cast<long long>(tokens),
                  static_cast<long long>(c.hidden_size),
                  static_cast<long long>(c.intermediate_size), peak_model);
      std::printf("  MFU = %.2f of the %s GEMM 1024^3 (goal >= 0.5 in bf16), %.2f of the "
                  "model-shaped GEMM\n",
                  achieved / peak_square, dt, achieved / peak_model);
    }
    if (step_seconds.size() == 2)
      std::printf("\n%s: bf16 step %.3f s vs fp32 step %.3f s: speed-up %.2fx (goal >= 2)\n",
                  bc.name.c_str(), step_seconds[be::compute_dtype::bf16],
                  step_seconds[be::compute_dtype::fp32],
                  step_seconds[be::compute_dtype::fp32] / step_seconds[be::compute_dtype::bf16]);
  }
  std::printf("\nload_average at the end: %.2f (figures assume the %d threads had the cores)\n",
              load_average(), opt.threads);
  return 0;
}
