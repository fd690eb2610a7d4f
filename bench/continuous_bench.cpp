// The continuous-batching engine (backends/engine) against today's static-batch engine
// (`backends::generate`: one left-padded batch per call, rows dropped when done) on a
// GRPO-shaped workload, in one process, same model, same seeds:
//
//   continuous_bench [--preset small] [--layers 2] [--prompts 64] [--samples 8]
//                    [--prompt-len 128:512] [--new-tokens 16:256] [--runs 3] [--threads 2]
//                    [--kv-mb 2048] [--block-size 16] [--max-seqs 256] [--step-tokens 2048]
//                    [--profile-shared]
//
// The model is the `small` preset (vocab 4096, hidden 256, 8 heads / 4 kv heads of 32) cut to 2
// layers (3.5M parameters, random weights): large enough that the forward pass, not the
// bookkeeping, dominates the engines' time, small enough that the static baseline (about 2-3
// minutes a run on 2 cores) keeps the three runs within ~10 minutes; `--layers 0` runs all 4.
// Each prompt (random tokens, length uniform in --prompt-len) asks for --samples samples with
// per-sample seeds, temperature 1, max_tokens uniform in --new-tokens, and 20 stop tokens (with
// random weights a row stops with probability ~1/200 per token, so lengths vary inside a group).
// Three runs per measurement, interleaved so load changes hit all alike; medians:
//   static      every sample is a row of one `generate` call (the old engine's batch)
//   continuous  the engine with the n samples as n separate requests (no prefix sharing)
//   shared      the engine with one request of n samples (prompt prefilled once per group)
// Printed: generated tokens/s of each and the ratios to static; prefill positions run through
// the model and the estimated prefill GFLOPs of each (padding included for static), and the
// ratio; whether every engine sampled the same tokens as static. --profile-shared runs the shared
// engine once and nothing else (to look at it under a profiler).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/engine/continuous_engine.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/init.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "backends/threads.hpp"
#include "bench_util.hpp"

using namespace rlforge::backends;
using rlforge::bench::median;
using rlforge::bench::seconds_since;

namespace {

const char* const synopsis =
    "[--preset NAME] [--layers N] [--prompts N] [--samples N] [--prompt-len LO:HI] "
    "[--new-tokens LO:HI] [--runs N] [--threads N] [--kv-mb N] [--block-size N] "
    "[--max-seqs N] [--step-tokens N] [--profile-shared]";

struct options {
  std::string preset = "small";
  long layers = 2; // the preset cut to this many layers (0 = all of them)
  long prompts = 64, samples = 8;
  long prompt_lo = 128, prompt_hi = 512;
  long new_lo = 16, new_hi = 256;
  long runs = 3, threads = 2;
  long kv_mb = 2048, block_size = 16, max_seqs = 256, step_tokens = 2048;
  bool profile_shared = false; // --profile-shared: run only the shared engine (for a profiler)
};

bool parse_range(const char* text, long lo, long hi, long& a, long& b) {
  std::string s = text;
  auto colon = s.find(':');
  if (colon == std::string::npos)
    return false;
  return rlforge::bench::parse_long(s.substr(0, colon).c_str(), lo, hi, a) &&
         rlforge::bench::parse_long(s.substr(colon + 1).c_str(), a, hi, b);
}

bool parse(int argc, char** argv, options& o, std::string& why) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--profile-shared") {
      o.profile_shared = true;
      continue;
    }
    if (i + 1 >= argc) {
      why = flag + " needs a value";
      return false;
    }
    const char* v = argv[++i];
    bool ok = true;
    if (flag == "--preset")
      o.preset = v;
    else if (flag == "--layers")
      ok = rlforge::bench::parse_long(v, 0, 64, o.layers);
    else if (flag == "--prompts")
      ok = rlforge::bench::parse_long(v, 1, 4096, o.prompts);
    else if (flag == "--samples")
      ok = rlforge::bench::parse_long(v, 1, 64, o.samples);
    else if (flag == "--prompt-len")
      ok = parse_range(v, 1, 4096, o.prompt_lo, o.prompt_hi);
    else if (flag == "--new-tokens")
      ok = parse_range(v, 1, 4096, o.new_lo, o.new_hi);
    else if (flag == "--runs")
      ok = rlforge::bench::parse_long(v, 1, 100, o.runs);
    else if (flag == "--threads")
      ok = rlforge::bench::parse_long(v, 1, 64, o.threads);
    else if (flag == "--kv-mb")
      ok = rlforge::bench::parse_long(v, 1, 1 << 20, o.kv_mb);
    else if (flag == "--block-size")
      ok = rlforge::bench::parse_long(v, 1, 1024, o.block_size);
    else if (flag == "--max-seqs")
      ok = rlforge::bench::parse_long(v, 1, 65536, o.max_seqs);
    else if (flag == "--step-tokens")
      ok = rlforge::bench::parse_long(v, 1, 1 << 20, o.step_tokens);
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

struct group_spec {
  std::vector<int64_t> prompt;
  sampling_params params;
  std::vector<uint64_t> seeds;
};

using token_lists = std::vector<std::vector<int64_t>>; // one per sample, group-major

struct run_result {
  double seconds = 0;
  int64_t generated = 0;
  int64_t prefill_positions = 0;
  double prefill_gflops = 0;
  token_lists tokens;
};

/// Estimated prefill FLOPs of running `positions` positions (each attending to `context`
/// positions on average) through the layers: 2 x layer parameters per position for the
/// projections, plus 4 x context x heads x head_dim per layer for scores and values.
double prefill_flops(const model_config& c, double positions, double mean_context) {
  const double h = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double i = static_cast<double>(c.intermediate_size);
  const double layer_params = h * q + 2 * h * kv + q * h + 3 * h * i;
  const double layers = static_cast<double>(c.num_hidden_layers);
  return positions * layers * (2 * layer_params + 4 * mean_context * q);
}

run_result run_static(causal_lm& model, const std::vector<group_spec>& groups) {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<sampling_params> params;
  int64_t width = 0;
  for (auto& g : groups)
    for (auto seed : g.seeds) {
      prompts.push_back(g.prompt);
      auto p = g.params;
      p.seed = seed;
      params.push_back(p);
      width = std::max<int64_t>(width, static_cast<int64_t>(g.prompt.size()));
    }
  run_result r;
  auto start = rlforge::bench::clock_type::now();
  auto out = generate(model, prompts, params);
  r.seconds = seconds_since(start);
  for (auto& o : out) {
    r.generated += static_cast<int64_t>(o.tokens.size());
    r.tokens.push_back(std::move(o.tokens));
  }
  // Every row runs the full padded width through the model, attending over it (masked).
  r.prefill_positions = static_cast<int64_t>(prompts.size()) * width;
  r.prefill_gflops = prefill_flops(model.config(), static_cast<double>(r.prefill_positions),
                                   static_cast<double>(width)) /
                     1e9;
  return r;
}

run_result run_engine(causal_lm& model, const engine_config& config,
                      const std::vector<group_spec>& groups, bool shared) {
  continuous_engine engine(model, config);
  std::map<uint64_t, std::pair<size_t, size_t>> where; // id -> (group, first sample)
  uint64_t id = 0;
  double prompt_sq = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& spec = groups[g];
    const double p = static_cast<double>(spec.prompt.size());
    auto add = [&](size_t first, size_t count) {
      engine_request r;
      r.prompt = spec.prompt;
      r.params = spec.params;
      for (size_t s = first; s < first + count; ++s)
        r.seeds.emplace_back(spec.seeds[s]);
      where[id] = {g, first};
      engine.add(id++, std::move(r));
      prompt_sq += p * p;
    };
    if (shared)
      add(0, spec.seeds.size());
    else
      for (size_t s = 0; s < spec.seeds.size(); ++s)
        add(s, 1);
  }
  const size_t per_group = groups.front().seeds.size();
  run_result r;
  r.tokens.resize(groups.size() * per_group);
  auto start = rlforge::bench::clock_type::now();
  while (engine.has_work())
    for (auto& o : engine.step(0, 0)) {
      auto [g, first] = where.at(o.id);
      for (size_t s = 0; s < o.samples.size(); ++s) {
        r.generated += static_cast<int64_t>(o.samples[s].tokens.size());
        r.tokens[g * per_group + first + s] = std::move(o.samples[s].tokens);
      }
    }
  r.seconds = seconds_since(start);
  auto st = engine.stats();
  r.prefill_positions = st.counters.prompt_tokens + st.counters.recompute_tokens;
  // Causal prefill of a prompt of p positions attends to (p + 1) / 2 positions on average.
  const double mean_context =
      st.counters.prompt_tokens ? prompt_sq / 2.0 / static_cast<double>(st.counters.prompt_tokens)
                                : 0.0;
  r.prefill_gflops = prefill_flops(model.config(), static_cast<double>(r.prefill_positions),
                                   mean_context) /
                     1e9;
  return r;
}

} // namespace

int main(int argc, char** argv) {
  options o;
  std::string why;
  if (!parse(argc, argv, o, why))
    return rlforge::bench::usage_error("continuous_bench", why, synopsis);
  try {
    set_intra_op_threads(static_cast<int>(o.threads));
    auto config = preset(o.preset);
    if (o.layers > 0)
      config.num_hidden_layers = o.layers;
    if (o.prompt_hi + o.new_hi > config.max_position_embeddings)
      return rlforge::bench::usage_error("continuous_bench",
                                         "prompt + new tokens exceed the model's context of " +
                                             std::to_string(config.max_position_embeddings),
                                         synopsis);
    auto model = causal_lm::from_weights(config, random_hf_weights(config, 1));
    model->set_training(false);
    for (auto& [name, p] : model->named_parameters())
      p.requires_grad_(false);

    std::mt19937_64 rng(2025);
    auto uniform = [&](long lo, long hi) {
      return std::uniform_int_distribution<long>(lo, hi)(rng);
    };
    std::vector<int64_t> stops;
    for (int64_t t = 0; t < 20; ++t)
      stops.push_back(config.vocab_size - 1 - t);
    std::vector<group_spec> groups(static_cast<size_t>(o.prompts));
    int64_t prompt_total = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      auto& spec = groups[g];
      const long len = uniform(o.prompt_lo, o.prompt_hi);
      for (long t = 0; t < len; ++t)
        spec.prompt.push_back(uniform(0, config.vocab_size - 21));
      prompt_total += len;
      spec.params.max_tokens = uniform(o.new_lo, o.new_hi);
      spec.params.temperature = 1.0;
      spec.params.stop_token_ids = stops;
      for (long s = 0; s < o.samples; ++s)
        spec.seeds.push_back(1000 * g + static_cast<uint64_t>(s));
    }
    engine_config ec;
    ec.kv_cache_bytes = int64_t{o.kv_mb} << 20;
    ec.block_size = o.block_size;
    ec.max_num_seqs = o.max_seqs;
    ec.max_step_tokens = o.step_tokens;
    ec.prefix_caching = false; // sharing inside a group is what is measured, not a warm cache

    std::printf("continuous_bench: preset %s (%lld layers, %lld parameters), %ld prompts x %ld "
                "samples, prompts %ld-%ld tokens (%lld in all), max_tokens %ld-%ld, %ld threads, "
                "KV budget %ld MiB, block %ld, max_seqs %ld, step tokens %ld, median of %ld\n",
                o.preset.c_str(), static_cast<long long>(config.num_hidden_layers),
                static_cast<long long>(num_parameters(config)), o.prompts, o.samples, o.prompt_lo,
                o.prompt_hi, static_cast<long long>(prompt_total), o.new_lo, o.new_hi, o.threads,
                o.kv_mb, o.block_size, o.max_seqs, o.step_tokens, o.runs);
    std::fflush(stdout);
    if (o.profile_shared) {
      auto r = run_engine(*model, ec, groups, true);
      std::printf("shared only: %.2f s, %.0f tokens/s\n", r.seconds,
                  static_cast<double>(r.generated) / r.seconds);
      return 0;
    }
    std::vector<double> st_s, co_s, sh_s;
    run_result st, co, sh;
    for (long r = 0; r < o.runs; ++r) {
      st = run_static(*model, groups);
      st_s.push_back(st.seconds);
      co = run_engine(*model, ec, groups, false);
      co_s.push_back(co.seconds);
      sh = run_engine(*model, ec, groups, true);
      sh_s.push_back(sh.seconds);
      std::printf("  run %ld: static %.2f s, continuous %.2f s, shared %.2f s\n", r + 1,
                  st.seconds, co.seconds, sh.seconds);
      std::fflush(stdout);
    }
    const double t_st = median(st_s), t_co = median(co_s), t_sh = median(sh_s);
    const double gen = static_cast<double>(st.generated);
    std::printf("%-34s %12s %10s %16s %14s\n", "engine", "tokens/s", "ratio", "prefill pos.",
                "prefill GFLOP");
    std::printf("%-34s %12.0f %9.2fx %16lld %14.1f\n", "static batch (backends::generate)",
                gen / t_st, 1.0, static_cast<long long>(st.prefill_positions), st.prefill_gflops);
    std::printf("%-34s %12.0f %9.2fx %16lld %14.1f\n", "continuous, no prefix sharing",
                static_cast<double>(co.generated) / t_co, t_st / t_co,
                static_cast<long long>(co.prefill_positions), co.prefill_gflops);
    std::printf("%-34s %12.0f %9.2fx %16lld %14.1f\n", "continuous + prefix sharing",
                static_cast<double>(sh.generated) / t_sh, t_st / t_sh,
                static_cast<long long>(sh.prefill_positions), sh.prefill_gflops);
    std::printf("prefill positions per group: %.2f prompts (goal 1.00); prefill GFLOPs saved by "
                "sharing: %.1f of %.1f (%.1fx fewer than static, %.1fx fewer than continuous)\n",
                static_cast<double>(sh.prefill_positions) / static_cast<double>(prompt_total),
                st.prefill_gflops - sh.prefill_gflops, st.prefill_gflops,
                st.prefill_gflops / sh.prefill_gflops, co.prefill_gflops / sh.prefill_gflops);
    const bool same = co.tokens == st.tokens && sh.tokens == st.tokens;
    std::printf("same tokens as static: %s; generated %lld tokens per run\n", same ? "yes" : "NO",
                static_cast<long long>(st.generated));
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "continuous_bench: %s\n", e.what());
    return 1;
  }
}
