// The continuous-batching engine on a CUDA device (paged KV cache in device memory, fused
// attention over gathered blocks, sampling on the device): what it generates is scored by the
// same model on the CPU in fp32, token by token; seeded runs repeat exactly; greedy tokens are
// the CPU model's argmax within rounding; samples of one prompt share its blocks; the cache
// leaves the device when released.
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "backends/devices.hpp"
#include "backends/engine/continuous_engine.hpp"
#include "backends/model/compute_dtype.hpp"
#include "backends/model/logprobs.hpp"
#include "gpu_support.hpp"

using namespace rlforge;
namespace be = rlforge::backends;

namespace {

be::sampling_params params(int64_t max_tokens, double temperature, int64_t top_k = -1) {
  be::sampling_params p;
  p.max_tokens = max_tokens;
  p.temperature = temperature;
  p.top_k = top_k;
  return p;
}

be::engine_request request(std::vector<int64_t> prompt, be::sampling_params p,
                           std::vector<std::optional<uint64_t>> seeds) {
  be::engine_request r;
  r.prompt = std::move(prompt);
  r.params = p;
  r.seeds = std::move(seeds);
  return r;
}

/// Greedy, sampling (4 samples of one prompt: shared blocks), top-k, a long prompt.
std::vector<be::engine_request> workload() {
  std::vector<be::engine_request> out;
  out.push_back(request({5, 17, 300}, params(12, 0.0), {std::nullopt}));
  out.push_back(request({9, 1, 2, 3, 4, 8, 8, 8, 8, 1}, params(16, 1.0), {11, 12, 13, 14}));
  out.push_back(request({44, 45, 46, 47}, params(10, 0.9, 20), {21}));
  std::vector<int64_t> longer;
  for (int64_t i = 0; i < 70; ++i)
    longer.push_back(100 + (i * 37) % 3000);
  out.push_back(request(longer, params(8, 0.0), {std::nullopt}));
  return out;
}

std::map<uint64_t, be::engine_output> run(be::causal_lm& model,
                                          const std::vector<be::engine_request>& requests) {
  be::engine_config cfg;
  cfg.kv_cache_bytes = int64_t{64} << 20;
  be::continuous_engine engine(model, cfg);
  for (size_t i = 0; i < requests.size(); ++i)
    engine.add(i, requests[i]);
  std::map<uint64_t, be::engine_output> out;
  for (int steps = 0; engine.has_work() && steps < 10000; ++steps)
    for (auto& o : engine.step(0, 1))
      out[o.id] = std::move(o);
  EXPECT_FALSE(engine.has_work());
  return out;
}

/// Checks every sample against the CPU model: each reported log-prob (temperature-scaled for
/// sampled rows without top-k, temperature 1 for greedy rows) within `tol` of the CPU's score of
/// the same token, and greedy tokens the CPU's argmax within `tol`.
void expect_scored_by_cpu(be::causal_lm& cpu, const std::vector<be::engine_request>& requests,
                          const std::map<uint64_t, be::engine_output>& got, double tol,
                          const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    const auto& out = got.at(i);
    ASSERT_EQ(out.samples.size(), r.seeds.size());
    for (size_t s = 0; s < out.samples.size(); ++s) {
      const auto& sample = out.samples[s];
      ASSERT_FALSE(sample.tokens.empty());
      EXPECT_EQ(sample.stop_reason, "length");
      std::vector<int64_t> ids = r.prompt;
      ids.insert(ids.end(), sample.tokens.begin(), sample.tokens.end());
      c10::NoGradGuard no_grad;
      auto hidden = cpu.forward_hidden(at::tensor(ids, at::kLong).unsqueeze(0));
      const auto p = static_cast<int64_t>(r.prompt.size());
      const double t = r.params.temperature > 0 ? r.params.temperature : 1.0;
      auto logp = at::log_softmax(cpu.logits(hidden[0]).to(at::kDouble) / t, -1);
      for (size_t k = 0; k < sample.tokens.size(); ++k) {
        auto row = logp[p - 1 + static_cast<int64_t>(k)];
        const auto token = sample.tokens[k];
        if (r.params.top_k < 0) {
          EXPECT_NEAR(sample.logprobs[k], row[token].item<double>(), tol)
              << "request " << i << " sample " << s << " token " << k;
        }
        if (r.params.temperature == 0) {
          EXPECT_GE(row[token].item<double>(), row.max().item<double>() - tol)
              << "greedy token " << k << " of request " << i << " is not the CPU's argmax";
        }
        if (r.params.top_k > 0) { // the token is among the CPU's top k (within rounding)
          EXPECT_GE(row[token].item<double>(),
                    std::get<0>(row.topk(r.params.top_k)).min().item<double>() - tol);
        }
      }
    }
  }
}

} // namespace

TEST(GpuEngine, Fp32GenerationIsScoredAsOnTheCpu) {
  RLFORGE_REQUIRE_DEVICE();
  auto cpu = gpu_test::random_model();
  auto dev = gpu_test::random_model();
  dev->to(gpu_test::cuda0());
  auto requests = workload();
  auto got = run(*dev, requests);
  expect_scored_by_cpu(*cpu, requests, got, 1e-3, "fp32 on the device");
  // Seeded samples repeat exactly; the 4 samples of one prompt differ from one another.
  auto again = run(*dev, requests);
  for (size_t i = 0; i < requests.size(); ++i)
    for (size_t s = 0; s < requests[i].seeds.size(); ++s)
      if (requests[i].seeds[s] || requests[i].params.temperature == 0) {
        EXPECT_EQ(again.at(i).samples[s].tokens, got.at(i).samples[s].tokens)
            << "request " << i << " sample " << s;
      }
  EXPECT_NE(got.at(1).samples[0].tokens, got.at(1).samples[1].tokens);
}

TEST(GpuEngine, Bf16GenerationIsScoredAsOnTheCpuWithinBf16Tolerance) {
  RLFORGE_REQUIRE_DEVICE();
  auto cpu = gpu_test::random_model();
  auto dev = gpu_test::random_model();
  dev->store_weights_in_bf16();
  dev->to(gpu_test::cuda0());
  auto requests = workload();
  expect_scored_by_cpu(*cpu, requests, run(*dev, requests), 5e-2, "bf16 on the device");
}

TEST(GpuEngine, AReleasedCacheLeavesTheDeviceAndComesBack) {
  RLFORGE_REQUIRE_CUDA();
  auto dev = gpu_test::random_model();
  dev->to(gpu_test::cuda0());
  be::engine_config cfg;
  cfg.kv_cache_bytes = int64_t{512} << 20;
  be::continuous_engine engine(*dev, cfg);
  const auto awake = be::cuda_memory(gpu_test::cuda0());
  EXPECT_GE(engine.cache_bytes(), int64_t{500} << 20);
  engine.release_cache();
  be::release_cached_memory();
  const auto asleep = be::cuda_memory(gpu_test::cuda0());
  EXPECT_LE(asleep.allocated, awake.allocated - (int64_t{500} << 20));
  EXPECT_GE(asleep.free, awake.free + (int64_t{400} << 20));
  engine.restore_cache();
  EXPECT_GE(be::cuda_memory(gpu_test::cuda0()).allocated, awake.allocated);
  engine.add(0, request({1, 2, 3}, params(4, 0.0), {std::nullopt}));
  int steps = 0;
  while (engine.has_work() && steps++ < 100)
    engine.step(0, 1);
  EXPECT_FALSE(engine.has_work());
}
