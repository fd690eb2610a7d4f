// Generation throughput with the key/value cache against its peer, the same sampler recomputing
// the whole prefix at every step (no cache). Both runs sample the same tokens (same seeds); the
// program checks that, then prints tokens/s for each, and the ratio, at each batch size.
//
//   generate_bench [--preset small] [--layers 2] [--batches 1,32] [--prompt-len 8]
//                  [--new-tokens 128] [--runs 3] [--threads 2]
//
// Defaults: preset "small" (llama, vocab 4096, hidden 256, 8 heads / 4 kv heads, intermediate
// 688) cut to 2 layers (3,548,416 parameters; `--layers 4` gives the full preset, 5.0M),
// random weights, 8-token random prompts, 128 new tokens per row (temperature 1, no stop
// tokens, so every row generates exactly 128), medians of 3 timed runs after one short
// warm-up, 2 intra-op threads. The layer cut keeps the no-cache baseline at batch 32 (about
// 300k token-forwards per run) within the benchmark's time budget on a 2-core machine.
//
// On a machine shared with other busy processes, run with OMP_WAIT_POLICY=PASSIVE: libgomp's
// default spin-waiting at each parallel region then costs whole scheduler time slices, which
// made 2-thread decode steps 20x slower than 1-thread ones in our measurements.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/init.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "backends/threads.hpp"

using namespace rlforge::backends;

namespace {

struct options {
  std::string preset = "small";
  int64_t layers = 2; // overrides the preset's num_hidden_layers
  std::vector<int64_t> batches{1, 32};
  int64_t prompt_len = 8;
  int64_t new_tokens = 128;
  int runs = 3;
  int threads = 2;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "generate_bench: %s\nusage: generate_bench [--preset NAME] [--layers N] "
               "[--batches 1,32] [--prompt-len N] [--new-tokens N] [--runs N] [--threads N]\n",
               why.c_str());
  std::exit(2);
}

int64_t parse_positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1)
    usage(flag + " expects a positive integer, got '" + text + "'");
  return v;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc)
      usage("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--preset") {
      o.preset = value;
    } else if (flag == "--layers") {
      o.layers = parse_positive(flag, value);
    } else if (flag == "--batches") {
      o.batches.clear();
      size_t start = 0;
      for (;;) {
        const size_t comma = value.find(',', start);
        o.batches.push_back(parse_positive(flag, value.substr(start, comma - start)));
        if (comma == std::string::npos)
          break;
        start = comma + 1;
      }
    } else if (flag == "--prompt-len") {
      o.prompt_len = parse_positive(flag, value);
    } else if (flag == "--new-tokens") {
      o.new_tokens = parse_positive(flag, value);
    } else if (flag == "--runs") {
      o.runs = static_cast<int>(parse_positive(flag, value));
    } else if (flag == "--threads") {
      o.threads = static_cast<int>(parse_positive(flag, value));
    } else {
      usage("unknown flag " + flag);
    }
  }
  return o;
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size();
  return n % 2 == 1 ? xs[n / 2] : 0.5 * (xs[n / 2 - 1] + xs[n / 2]);
}

struct measurement {
  double seconds = 0;                       // median wall time of one generate call
  std::vector<std::vector<int64_t>> tokens; // from the last run
};

measurement measure(causal_lm& model, const std::vector<std::vector<int64_t>>& prompts,
                    const std::vector<sampling_params>& params, bool use_cache, int runs) {
  const generate_options go{use_cache};
  // Warm-up: allocator and thread pool, a few tokens only.
  auto short_params = params;
  for (auto& p : short_params)
    p.max_tokens = std::min<int64_t>(p.max_tokens, 4);
  generate(model, prompts, short_params, go);

  measurement m;
  std::vector<double> times;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    auto out = generate(model, prompts, params, go);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    m.tokens.clear();
    for (auto& o : out)
      m.tokens.push_back(std::move(o.tokens));
  }
  m.seconds = median(times);
  return m;
}

} // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
    set_intra_op_threads(o.threads);
    model_config config = preset(o.preset);
    config.num_hidden_layers = o.layers;
    if (o.prompt_len + o.new_tokens > config.max_position_embeddings)
      usage("--prompt-len + --new-tokens exceeds the preset's context of " +
            std::to_string(config.max_position_embeddings));
    auto model = causal_lm::from_weights(config, random_hf_weights(config, 1));
    std::printf(
        "generate_bench: preset %s (%lld parameters, vocab %lld, hidden %lld, %lld layers), "
        "prompt %lld tokens, %lld new tokens per row, temperature 1, %d threads, "
        "median of %d runs\n",
        o.preset.c_str(), static_cast<long long>(num_parameters(config)),
        static_cast<long long>(config.vocab_size), static_cast<long long>(config.hidden_size),
        static_cast<long long>(config.num_hidden_layers), static_cast<long long>(o.prompt_len),
        static_cast<long long>(o.new_tokens), o.threads, o.runs);
    std::printf("%6s %16s %16s %10s %10s\n", "batch", "cache tok/s", "no-cache tok/s", "ratio",
                "same");
    std::mt19937_64 rng(2024);
    std::uniform_int_distribution<int64_t> token(0, config.vocab_size - 1);
    double last_ratio = 0;
    int64_t last_batch = 0;
    for (int64_t b : o.batches) {
      std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(b));
      std::vector<sampling_params> params(static_cast<size_t>(b));
      for (size_t i = 0; i < prompts.size(); ++i) {
        for (int64_t j = 0; j < o.prompt_len; ++j)
          prompts[i].push_back(token(rng));
        params[i].max_tokens = o.new_tokens;
        params[i].temperature = 1.0;
        params[i].seed = 1000 + i;
      }
      const auto cached = measure(*model, prompts, params, true, o.runs);
      const auto uncached = measure(*model, prompts, params, false, o.runs);
      const double generated = static_cast<double>(b * o.new_tokens);
      const double cache_rate = generated / cached.seconds;
      const double plain_rate = generated / uncached.seconds;
      last_ratio = cache_rate / plain_rate;
      last_batch = b;
      std::printf("%6lld %16.1f %16.1f %9.2fx %10s\n", static_cast<long long>(b), cache_rate,
                  plain_rate, last_ratio, cached.tokens == uncached.tokens ? "yes" : "NO");
      std::fflush(stdout);
    }
    std::printf("KV cache speed-up at batch %lld: %.2fx (goal >= 10x at batch 32)\n",
                static_cast<long long>(last_batch), last_ratio);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
