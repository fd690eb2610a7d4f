#include "backends/model/sampler.hpp"
#include "backends/model/token_sampler.hpp"

#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/init.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampling_params.hpp"
#include "stop_strings_support.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;

namespace {

sampling_params params_with(double temperature, int64_t top_k = -1, double top_p = 1.0) {
  sampling_params p;
  p.max_tokens = 4;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

// Softmax of `logits / t` in double, written out independently of the library.
std::vector<double> softmax(const std::vector<float>& logits, double t) {
  std::vector<double> p(logits.size());
  double m = -inf;
  for (float x : logits)
    m = std::max(m, x / t);
  double s = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    s += (p[i] = std::exp(logits[i] / t - m));
  for (double& x : p)
    x /= s;
  return p;
}

// Indices of finite entries.
std::vector<int64_t> support(const std::vector<double>& lp) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < lp.size(); ++i)
    if (lp[i] != -inf)
      ids.push_back(static_cast<int64_t>(i));
  return ids;
}

void expect_invalid(const sampling_params& p, int64_t vocab, const std::string& needle) {
  try {
    validate(p, vocab);
    FAIL() << "expected an error mentioning " << needle;
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_argument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

} // namespace

TEST(SamplingMath, TemperatureScalesLogitsBeforeSoftmax) {
  const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f};
  for (double t : {0.25, 1.0, 3.0}) {
    auto lp = sampling_log_probs(logits, params_with(t));
    auto want = softmax(logits, t);
    ASSERT_EQ(lp.size(), want.size());
    for (size_t i = 0; i < lp.size(); ++i)
      EXPECT_NEAR(lp[i], std::log(want[i]), 1e-12) << "t=" << t << " i=" << i;
  }
}

TEST(SamplingMath, TopKKeepsExactlyKMostLikelyAndRenormalises) {
  const std::vector<float> logits{0.1f, 3.0f, -2.0f, 2.0f, 1.0f, 2.5f};
  auto lp = sampling_log_probs(logits, params_with(1.0, 3));
  EXPECT_EQ(support(lp), (std::vector<int64_t>{1, 3, 5}));
  const double z = std::exp(3.0) + std::exp(2.0) + std::exp(2.5);
  EXPECT_NEAR(lp[1], 3.0 - std::log(z), 1e-6);
  EXPECT_NEAR(lp[3], 2.0 - std::log(z), 1e-6);
  EXPECT_NEAR(lp[5], 2.5 - std::log(z), 1e-6);
}

TEST(SamplingMath, TopKBreaksTiesByLowerTokenId) {
  // Five tokens share the top logit; top_k=3 keeps the three lowest ids among them.
  const std::vector<float> logits{0.0f, 1.0f, 1.0f, -1.0f, 1.0f, 1.0f, 1.0f};
  auto lp = sampling_log_probs(logits, params_with(1.0, 3));
  EXPECT_EQ(support(lp), (std::vector<int64_t>{1, 2, 4}));
  for (int64_t id : {1, 2, 4})
    EXPECT_NEAR(lp[id], std::log(1.0 / 3.0), 1e-12);
}

TEST(SamplingMath, TopKLargerThanVocabKeepsEverything) {
  const std::vector<float> logits{0.3f, -0.2f, 1.1f};
  auto lp = sampling_log_probs(logits, params_with(0.7, 50));
  auto want = softmax(logits, 0.7);
  for (size_t i = 0; i < lp.size(); ++i)
    EXPECT_NEAR(lp[i], std::log(want[i]), 1e-12);
}

TEST(SamplingMath, TopPKeepsSmallestPrefixReachingP) {
  // Probabilities 0.5, 0.25, 0.125, 0.125 (as logits of their logs).
  const std::vector<float> logits{std::log(0.125f), std::log(0.5f), std::log(0.125f),
                                  std::log(0.25f)};
  struct case_t {
    double p;
    std::vector<int64_t> kept;
  };
  // 0.49 is reached by 0.5 alone; 0.6 and 0.74 need 0.5+0.25; 0.76 needs a third token, and of
  // the two tied 0.125 tokens the lower id (0) comes first.
  for (const auto& c : std::vector<case_t>{{0.3, {1}},
                                           {0.49, {1}},
                                           {0.6, {1, 3}},
                                           {0.74, {1, 3}},
                                           {0.76, {0, 1, 3}},
                                           {1.0, {0, 1, 2, 3}}}) {
    auto lp = sampling_log_probs(logits, params_with(1.0, -1, c.p));
    EXPECT_EQ(support(lp), c.kept) << "top_p=" << c.p;
    double mass = 0;
    for (int64_t id : c.kept)
      mass += std::exp(lp[id]);
    EXPECT_NEAR(mass, 1.0, 1e-12) << "top_p=" << c.p;
  }
}

TEST(SamplingMath, TopPAppliesToDistributionRenormalisedAfterTopK) {
  // After temperature 2: logits/2 = {2, 1, 0, -1}. Top-k=3 keeps ids 0..2 with probabilities
  // proportional to e^2, e^1, e^0. Top-p 0.9 then needs the first two of those (0.665+0.245).
  const std::vector<float> logits{4.0f, 2.0f, 0.0f, -2.0f};
  auto lp = sampling_log_probs(logits, params_with(2.0, 3, 0.9));
  EXPECT_EQ(support(lp), (std::vector<int64_t>{0, 1}));
  const double z = std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(lp[0], 2.0 - std::log(z), 1e-12);
  EXPECT_NEAR(lp[1], 1.0 - std::log(z), 1e-12);
  // The same top-p over the unfiltered distribution needs a third token (0.644+0.237 < 0.9).
  auto p = softmax(logits, 2.0);
  ASSERT_LT(p[0] + p[1], 0.9);
  auto wide = sampling_log_probs(logits, params_with(2.0, -1, 0.9));
  EXPECT_EQ(support(wide), (std::vector<int64_t>{0, 1, 2}));
}

TEST(SamplingMath, MaskedLogitsStayExcluded) {
  const std::vector<float> logits{-std::numeric_limits<float>::infinity(), 0.0f, 1.0f};
  auto lp = sampling_log_probs(logits, params_with(1.0, 3));
  EXPECT_EQ(lp[0], -inf);
  EXPECT_NEAR(std::exp(lp[1]) + std::exp(lp[2]), 1.0, 1e-12);
}

TEST(SamplingMath, GreedyPicksArgmaxLowestIdOnTies) {
  const std::vector<double> v{0.5, 2.0, -1.0, 2.0, 1.0};
  EXPECT_EQ(greedy_token(v.data(), 5), 1);
  const std::vector<double> w{-3.0, -2.0, -1.0};
  EXPECT_EQ(greedy_token(w.data(), 3), 2);
}

TEST(SamplingMath, InverseCdfFollowsCumulativeProbabilityInIdOrder) {
  const std::vector<double> p{0.0, 0.2, 0.0, 0.5, 0.3};
  EXPECT_EQ(inverse_cdf(p.data(), 5, 0.0), 1);
  EXPECT_EQ(inverse_cdf(p.data(), 5, 0.19), 1);
  EXPECT_EQ(inverse_cdf(p.data(), 5, 0.21), 3);
  EXPECT_EQ(inverse_cdf(p.data(), 5, 0.69), 3);
  EXPECT_EQ(inverse_cdf(p.data(), 5, 0.71), 4);
  EXPECT_EQ(inverse_cdf(p.data(), 5, 0.999999), 4);
  // Unnormalised weights are scaled by their total; zero-weight tokens are never drawn.
  const std::vector<double> q{2.0, 0.0, 6.0, 0.0};
  EXPECT_EQ(inverse_cdf(q.data(), 4, 0.24), 0);
  EXPECT_EQ(inverse_cdf(q.data(), 4, 0.26), 2);
  EXPECT_EQ(inverse_cdf(q.data(), 4, 0.9999999999), 2);
}

TEST(SamplingMath, InverseCdfFrequenciesMatchProbabilities) {
  const std::vector<double> p{0.1, 0.6, 0.3};
  std::vector<int> counts(3, 0);
  const int n = 10000;
  for (int i = 0; i < n; ++i)
    counts[static_cast<size_t>(inverse_cdf(p.data(), 3, (i + 0.5) / n))]++;
  EXPECT_EQ(counts[0], 1000);
  EXPECT_EQ(counts[1], 6000);
  EXPECT_EQ(counts[2], 3000);
}

TEST(SamplingMath, RejectsBadMathInputs) {
  const std::vector<double> p{0.5, 0.5};
  for (double u : {-0.1, 1.0, 2.0, std::nan("")}) {
    try {
      inverse_cdf(p.data(), 2, u);
      FAIL() << "expected an error for u=" << u;
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("u must be in [0, 1)"), std::string::npos) << e.what();
    }
  }
  const std::vector<double> zeros{0.0, 0.0};
  EXPECT_THROW(inverse_cdf(zeros.data(), 2, 0.5), error);
  EXPECT_THROW(greedy_token(p.data(), 0), error);
  std::vector<double> lp{std::log(0.5), std::log(0.5)};
  EXPECT_THROW(filter_log_probs(lp.data(), 0, 1, 1.0), error);
  EXPECT_THROW(filter_log_probs(lp.data(), 2, 0, 1.0), error);
  EXPECT_THROW(filter_log_probs(lp.data(), 2, -1, 0.0), error);
  EXPECT_THROW(sampling_log_probs({}, params_with(1.0)), error);
  EXPECT_THROW(sampling_log_probs({1.0f, 2.0f}, params_with(0.0)), error);
  EXPECT_THROW(sampling_log_probs({1.0f, std::nanf("")}, params_with(1.0)), error);
  const float ninf = -std::numeric_limits<float>::infinity();
  EXPECT_THROW(sampling_log_probs({ninf, ninf}, params_with(1.0)), error);
}

TEST(SamplingParams, AcceptsValidParameters) {
  sampling_params p;
  p.max_tokens = 1;
  EXPECT_NO_THROW(validate(p, 10));
  p.temperature = 0.0;
  p.top_k = 10;
  p.top_p = 1.0;
  p.stop_token_ids = {0, 9};
  EXPECT_NO_THROW(validate(p, 10));
  p.top_k = 1000;
  p.top_p = 1e-9;
  EXPECT_NO_THROW(validate(p, 10));
}

TEST(SamplingParams, RejectsEveryNonsenseValueNamingIt) {
  sampling_params ok;
  ok.max_tokens = 8;
  auto with = [&](auto&& change) {
    sampling_params p = ok;
    change(p);
    return p;
  };
  expect_invalid(with([](auto& p) { p.max_tokens = 0; }), 10, "max_tokens must be >= 1, got 0");
  expect_invalid(with([](auto& p) { p.max_tokens = -5; }), 10, "max_tokens must be >= 1, got -5");
  expect_invalid(with([](auto& p) { p.temperature = -0.5; }), 10, "temperature");
  expect_invalid(with([](auto& p) { p.temperature = -0.5; }), 10, "-0.5");
  expect_invalid(with([](auto& p) { p.temperature = std::nan(""); }), 10, "nan");
  expect_invalid(with([](auto& p) { p.temperature = inf; }), 10, "inf");
  expect_invalid(with([](auto& p) { p.top_k = 0; }), 10, "top_k must be -1 (off) or >= 1, got 0");
  expect_invalid(with([](auto& p) { p.top_k = -2; }), 10, "got -2");
  expect_invalid(with([](auto& p) { p.top_p = 0.0; }), 10, "top_p must be in (0, 1], got 0");
  expect_invalid(with([](auto& p) { p.top_p = -0.1; }), 10, "got -0.1");
  expect_invalid(with([](auto& p) { p.top_p = 1.5; }), 10, "got 1.5");
  expect_invalid(with([](auto& p) { p.top_p = std::nan(""); }), 10, "top_p");
  expect_invalid(with([](auto& p) {
                   p.stop_token_ids = {3, 10};
                 }),
                 10, "stop token id 10 is outside the vocabulary [0, 10)");
  expect_invalid(with([](auto& p) { p.stop_token_ids = {-1}; }), 10, "stop token id -1");
  expect_invalid(with([](auto& p) {
                   p.stop_strings = {"ok", ""};
                   p.tokenizer = tiny_detokenizer();
                 }),
                 10, "stop string 1 is empty");
  expect_invalid(with([](auto& p) { p.stop_strings = {"x"}; }), 10,
                 "stop strings need the model's tokenizer");
  sampling_params good = ok;
  good.stop_strings = {"x"};
  good.tokenizer = tiny_detokenizer();
  EXPECT_NO_THROW(validate(good, 10));
}

// ---- generation against a tiny random model -------------------------------------------------

namespace {

using prompt_list = std::vector<std::vector<int64_t>>;

std::unique_ptr<causal_lm> tiny_model(int64_t max_positions = 512) {
  auto config = preset("tiny");
  config.max_position_embeddings = max_positions;
  // A larger init spread than HF's 0.02 gives peaked, seed-sensitive distributions.
  return causal_lm::from_weights(config, random_hf_weights(config, 7, 0.2));
}

sampling_params make_params(int64_t max_tokens, double temperature, std::optional<uint64_t> seed,
                            int64_t top_k = -1, double top_p = 1.0) {
  sampling_params p;
  p.max_tokens = max_tokens;
  p.temperature = temperature;
  p.seed = seed;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

// Raw logits [n, V] (double) of one unpadded sequence, by a single full forward pass.
at::Tensor full_logits(causal_lm& model, const std::vector<int64_t>& seq) {
  c10::NoGradGuard no_grad;
  auto ids = at::tensor(seq, at::kLong).unsqueeze(0);
  return model.logits(model.forward_hidden(ids)).squeeze(0).to(at::kDouble);
}

std::vector<int64_t> concat(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  auto out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

// Log-probability of `token` under temperature / top-k / top-p applied to `logits`, computed
// independently of the library: sort by probability (ties by lower id), cut, renormalise.
// -inf when the token is outside the kept set.
double reference_logprob(const at::Tensor& logits_row, int64_t token, double t, int64_t top_k,
                         double top_p) {
  auto probs = at::softmax(logits_row / t, 0).contiguous();
  const auto v = probs.size(0);
  std::vector<std::pair<double, int64_t>> ranked;
  for (int64_t i = 0; i < v; ++i)
    ranked.emplace_back(probs[i].item<double>(), i);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  if (top_k > 0 && top_k < v)
    ranked.resize(static_cast<size_t>(top_k));
  double mass = 0;
  for (const auto& r : ranked)
    mass += r.first;
  size_t keep = ranked.size();
  double cumulative = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    cumulative += ranked[i].first / mass;
    if (top_p < 1.0 && cumulative >= top_p) {
      keep = i + 1;
      break;
    }
  }
  ranked.resize(keep);
  double kept_mass = 0;
  for (const auto& r : ranked)
    kept_mass += r.first;
  for (const auto& r : ranked)
    if (r.second == token)
      return std::log(r.first / kept_mass);
  return -inf;
}

} // namespace

TEST(Generate, GreedyFollowsArgmaxOfFullForward) {
  auto model = tiny_model();
  const std::vector<int64_t> prompt{5, 17, 300, 42};
  auto out = generate(*model, {prompt}, {make_params(10, 0.0, std::nullopt)});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].tokens.size(), 10u);
  EXPECT_EQ(out[0].stop_reason, "length");
  auto logits = full_logits(*model, concat(prompt, out[0].tokens));
  auto lp = at::log_softmax(logits, 1);
  for (size_t t = 0; t < out[0].tokens.size(); ++t) {
    const auto pos = static_cast<int64_t>(prompt.size() + t) - 1;
    EXPECT_EQ(out[0].tokens[t], logits[pos].argmax().item<int64_t>()) << "step " << t;
    EXPECT_NEAR(out[0].logprobs[t], lp[pos][out[0].tokens[t]].item<double>(), 1e-5) << "step " << t;
  }
}

TEST(Generate, SampledLogprobsMatchFullForwardRecomputation) {
  auto model = tiny_model();
  const std::vector<int64_t> prompt{1, 2, 3, 4, 5, 6};
  struct case_t {
    double t;
    int64_t k;
    double p;
  };
  for (const auto& c : std::vector<case_t>{
           {1.0, -1, 1.0}, {0.7, -1, 1.0}, {1.3, 20, 1.0}, {0.9, -1, 0.8}, {1.0, 40, 0.9}}) {
    auto out = generate(*model, {prompt}, {make_params(12, c.t, 99, c.k, c.p)});
    ASSERT_EQ(out[0].tokens.size(), 12u);
    auto logits = full_logits(*model, concat(prompt, out[0].tokens));
    for (size_t i = 0; i < out[0].tokens.size(); ++i) {
      const auto pos = static_cast<int64_t>(prompt.size() + i) - 1;
      const double want = reference_logprob(logits[pos], out[0].tokens[i], c.t, c.k, c.p);
      ASSERT_NE(want, -inf) << "token outside the kept set: t=" << c.t << " k=" << c.k
                            << " p=" << c.p << " step " << i;
      EXPECT_NEAR(out[0].logprobs[i], want, 1e-5)
          << "t=" << c.t << " k=" << c.k << " p=" << c.p << " step " << i;
    }
  }
}

TEST(Generate, SameSeedGivesSameTokens) {
  auto model = tiny_model();
  const prompt_list prompts{{9, 8, 7}};
  auto a = generate(*model, prompts, {make_params(16, 1.0, 1234)});
  auto b = generate(*model, prompts, {make_params(16, 1.0, 1234)});
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  EXPECT_EQ(a[0].logprobs, b[0].logprobs);
}

TEST(Generate, DifferentSeedsGiveDifferentTokens) {
  auto model = tiny_model();
  const std::vector<int64_t> prompt{9, 8, 7};
  std::vector<std::vector<int64_t>> seen;
  for (uint64_t seed = 1; seed <= 6; ++seed)
    seen.push_back(generate(*model, {prompt}, {make_params(12, 1.0, seed)})[0].tokens);
  // Rows without a seed draw from distinct generators too.
  seen.push_back(generate(*model, {prompt}, {make_params(12, 1.0, std::nullopt)})[0].tokens);
  seen.push_back(generate(*model, {prompt}, {make_params(12, 1.0, std::nullopt)})[0].tokens);
  for (size_t i = 0; i < seen.size(); ++i)
    for (size_t j = i + 1; j < seen.size(); ++j)
      EXPECT_NE(seen[i], seen[j]) << "runs " << i << " and " << j;
}

TEST(Generate, StopTokenEndsGenerationAndIsKept) {
  auto model = tiny_model();
  const std::vector<int64_t> prompt{11, 12, 13};
  auto free_run = generate(*model, {prompt}, {make_params(12, 1.0, 5)})[0];
  ASSERT_EQ(free_run.tokens.size(), 12u);
  const int64_t stop = free_run.tokens[4];
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), stop);
  const std::vector<int64_t> want(free_run.tokens.begin(), first + 1);

  auto params = make_params(12, 1.0, 5);
  params.stop_token_ids = {stop, 511};
  auto stopped = generate(*model, {prompt}, {params})[0];
  EXPECT_EQ(stopped.tokens, want);
  EXPECT_EQ(stopped.stop_reason, "stop");
  EXPECT_EQ(stopped.logprobs.size(), want.size());
}

TEST(Generate, StopStringsEndEachRowWhereItsTextFirstContainsOne) {
  auto model = tiny_model();
  const auto& tok = tiny_tokenizer();
  const int64_t n = 40;
  const prompt_list prompts = {{11, 12, 13}, {40, 41}, {7}, {300, 301, 302, 303}};
  const std::vector<uint64_t> seeds = {5, 6, 8, 9};
  std::vector<sampling_params> free_params;
  for (auto seed : seeds)
    free_params.push_back(make_params(n, 1.0, seed));
  // The reference: the same rows without stop strings, cut where the prefix text first holds one.
  auto free_runs = generate(*model, prompts, free_params);
  const std::string absent = "<never in this text>";
  auto params = free_params;
  std::vector<std::optional<size_t>> cuts(prompts.size());
  bool early = false;
  for (size_t i = 0; i + 1 < prompts.size(); ++i) { // the last row has no stop strings
    auto stop = spanning_stop(tok, free_runs[i].tokens, 3);
    ASSERT_FALSE(stop.empty()) << "row " << i << ": no stop string spanning two tokens";
    ASSERT_FALSE(stop_cut(tok, free_runs[i].tokens, {absent}));
    params[i].stop_strings = {absent, stop};
    params[i].tokenizer = tiny_detokenizer();
    cuts[i] = stop_cut(tok, free_runs[i].tokens, {stop});
    ASSERT_TRUE(cuts[i]);
    early = early || *cuts[i] < static_cast<size_t>(n);
  }
  EXPECT_TRUE(early) << "no row stops before max_tokens: the test would not see a stop";
  auto stopped = generate(*model, prompts, params);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    const auto& free_run = free_runs[i];
    const size_t keep = cuts[i].value_or(free_run.tokens.size());
    EXPECT_EQ(stopped[i].tokens,
              std::vector<int64_t>(free_run.tokens.begin(), free_run.tokens.begin() + keep));
    EXPECT_EQ(stopped[i].stop_reason, cuts[i] ? "stop" : free_run.stop_reason);
    ASSERT_EQ(stopped[i].logprobs.size(), keep);
    for (size_t t = 0; t < keep; ++t)
      EXPECT_NEAR(stopped[i].logprobs[t], free_run.logprobs[t], 1e-5) << "token " << t;
  }
}

TEST(Generate, MaxTokensEndsWithLength) {
  auto model = tiny_model();
  for (int64_t n : {1, 3, 7}) {
    auto out = generate(*model, {{4, 5}}, {make_params(n, 0.8, 3)})[0];
    EXPECT_EQ(static_cast<int64_t>(out.tokens.size()), n);
    EXPECT_EQ(static_cast<int64_t>(out.logprobs.size()), n);
    EXPECT_EQ(out.stop_reason, "length");
  }
}

TEST(Generate, ContextLengthCapsGeneration) {
  auto model = tiny_model(16);
  // The long prompt finishes first; the short one then keeps generating past the width the
  // padded batch started with, which must not count against its own context.
  const std::vector<int64_t> prompt(12, 3);
  auto out = generate(*model, {prompt, {1, 2}},
                      {make_params(10, 0.0, std::nullopt), make_params(10, 0.0, std::nullopt)});
  EXPECT_EQ(out[0].tokens.size(), 4u); // 12 + 4 = 16 positions
  EXPECT_EQ(out[0].stop_reason, "length");
  EXPECT_EQ(out[1].tokens.size(), 10u);
  EXPECT_EQ(out[1].stop_reason, "length");
}

TEST(Generate, BatchedRowsMatchEachAlone) {
  auto model = tiny_model();
  const prompt_list prompts{
      {3, 1, 4}, {1, 5, 9, 2, 6, 5, 3, 5}, {8}, {9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4}};
  std::vector<sampling_params> params{
      make_params(9, 0.0, std::nullopt), make_params(14, 0.8, 11, 50),
      make_params(6, 1.0, 12, -1, 0.9), make_params(12, 1.2, 13, 30, 0.95)};
  // A stop token makes one row finish early, so the batch shrinks mid-way.
  params[1].stop_token_ids = {generate(*model, {prompts[1]}, {params[1]})[0].tokens[5]};

  auto batched = generate(*model, prompts, params);
  // Another composition: reversed order.
  prompt_list rev_prompts(prompts.rbegin(), prompts.rend());
  std::vector<sampling_params> rev_params(params.rbegin(), params.rend());
  auto reversed = generate(*model, rev_prompts, rev_params);
  // And with unseeded sampling rows interleaved: they draw from their own generators.
  prompt_list mixed_prompts;
  std::vector<sampling_params> mixed_params;
  for (size_t i = 0; i < prompts.size(); ++i) {
    mixed_prompts.push_back({static_cast<int64_t>(20 + i), 21, 22});
    mixed_params.push_back(make_params(16, 1.0, std::nullopt));
    mixed_prompts.push_back(prompts[i]);
    mixed_params.push_back(params[i]);
  }
  auto mixed = generate(*model, mixed_prompts, mixed_params);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = generate(*model, {prompts[i]}, {params[i]})[0];
    EXPECT_EQ(mixed[2 * i + 1].tokens, alone.tokens) << "row " << i;
    const auto& b = batched[i];
    const auto& r = reversed[prompts.size() - 1 - i];
    EXPECT_EQ(b.tokens, alone.tokens) << "row " << i;
    EXPECT_EQ(r.tokens, alone.tokens) << "row " << i;
    EXPECT_EQ(b.stop_reason, alone.stop_reason) << "row " << i;
    ASSERT_EQ(b.logprobs.size(), alone.logprobs.size());
    for (size_t t = 0; t < alone.logprobs.size(); ++t) {
      EXPECT_NEAR(b.logprobs[t], alone.logprobs[t], 1e-5) << "row " << i << " step " << t;
      EXPECT_NEAR(r.logprobs[t], alone.logprobs[t], 1e-5) << "row " << i << " step " << t;
    }
  }
  EXPECT_EQ(batched[1].stop_reason, "stop");
  EXPECT_LE(batched[1].tokens.size(), 6u);
}

TEST(Generate, WithoutCacheGivesSameTokens) {
  auto model = tiny_model();
  const prompt_list prompts{{3, 1, 4, 1}, {2, 7}, {6, 6, 6, 6, 6, 6, 6}};
  const std::vector<sampling_params> params{make_params(8, 0.0, std::nullopt),
                                            make_params(10, 0.9, 21, 64),
                                            make_params(5, 1.0, 22, -1, 0.85)};
  auto cached = generate(*model, prompts, params);
  auto uncached = generate(*model, prompts, params, generate_options{false});
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(cached[i].tokens, uncached[i].tokens) << "row " << i;
    ASSERT_EQ(cached[i].logprobs.size(), uncached[i].logprobs.size());
    for (size_t t = 0; t < cached[i].logprobs.size(); ++t)
      EXPECT_NEAR(cached[i].logprobs[t], uncached[i].logprobs[t], 1e-5);
  }
}

TEST(Generate, PromptLogprobsMatchFullForward) {
  auto model = tiny_model();
  const prompt_list prompts{{10, 20, 30, 40, 50}, {7}, {100, 200, 300}};
  std::vector<sampling_params> params(3, make_params(2, 0.0, std::nullopt));
  params[0].prompt_logprobs = params[1].prompt_logprobs = true;
  auto out = generate(*model, prompts, params);
  EXPECT_TRUE(out[1].prompt_logprobs.empty()); // one token: nothing to predict
  EXPECT_TRUE(out[2].prompt_logprobs.empty()); // not requested
  ASSERT_EQ(out[0].prompt_logprobs.size(), 4u);
  auto lp = at::log_softmax(full_logits(*model, prompts[0]), 1);
  for (int64_t j = 1; j < 5; ++j)
    EXPECT_NEAR(out[0].prompt_logprobs[static_cast<size_t>(j - 1)],
                lp[j - 1][prompts[0][static_cast<size_t>(j)]].item<double>(), 1e-5);
}

// The k most likely tokens at each prompt position: the full forward's log-softmax sorted
// (ties by the lower id), k columns per position 1..n-1.
TEST(Generate, TopkPromptLogprobsAreTheFullForwardsBest) {
  auto model = tiny_model();
  const prompt_list prompts{{10, 20, 30, 40, 50}, {7}};
  std::vector<sampling_params> params(2, make_params(2, 0.0, std::nullopt));
  params[0].topk_prompt_logprobs = params[1].topk_prompt_logprobs = 3;
  auto out = generate(*model, prompts, params);
  EXPECT_TRUE(out[0].prompt_logprobs.empty()); // not requested: only the top-k
  EXPECT_TRUE(out[1].topk_prompt_ids.empty()); // one token: nothing to predict
  ASSERT_EQ(out[0].topk_prompt_ids.size(), 4u * 3);
  ASSERT_EQ(out[0].topk_prompt_logprobs.size(), 4u * 3);
  auto lp = at::log_softmax(full_logits(*model, prompts[0]), 1);
  for (int64_t j = 0; j < 4; ++j) {
    auto sorted = lp[j].sort(/*stable=*/true, 0, /*descending=*/true);
    for (int64_t c = 0; c < 3; ++c) {
      const auto at = static_cast<size_t>(j * 3 + c);
      EXPECT_EQ(out[0].topk_prompt_ids[at], std::get<1>(sorted)[c].item<int64_t>()) << j;
      EXPECT_NEAR(out[0].topk_prompt_logprobs[at], std::get<0>(sorted)[c].item<double>(), 1e-5);
    }
  }
  // Ties go to the lower id: equal logits.
  auto flat = top_token_logprobs(at::zeros({1, 5}), 3);
  EXPECT_EQ(flat.ids, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_NEAR(flat.logprobs[0], -std::log(5.0), 1e-6);
}

TEST(Generate, EmptyBatchGivesNoResults) {
  auto model = tiny_model();
  EXPECT_TRUE(generate(*model, {}, {}).empty());
}

TEST(Generate, RejectsBadRequestsNamingThem) {
  auto model = tiny_model(16);
  const auto ok = make_params(4, 1.0, 1);
  expect_error(
      [&] {
        generate(*model, {{1}, {2}}, {ok});
      },
      error_code::invalid_argument, {"2 prompts but 1 sampling_params"});
  expect_error(
      [&] {
        generate(*model, {{1}, {}}, {ok, ok});
      },
      error_code::invalid_argument, {"request 1: empty prompt"});
  expect_error(
      [&] {
        generate(*model, {{1, 512}}, {ok});
      },
      error_code::out_of_range, {"prompt token 1 is 512, outside the vocabulary [0, 512)"});
  expect_error([&] { generate(*model, {{-3}}, {ok}); }, error_code::out_of_range,
               {"prompt token 0 is -3"});
  expect_error(
      [&] { generate(*model, {std::vector<int64_t>(16, 1)}, {ok}); }, error_code::invalid_argument,
      {"prompt of 16 tokens leaves no room to generate within max_position_embeddings 16"});
  auto bad = ok;
  bad.top_p = 2.0;
  expect_error(
      [&] {
        generate(*model, {{1}, {2}}, {ok, bad});
      },
      error_code::invalid_argument, {"request 1: sampling_params: top_p must be in (0, 1], got 2"});
  bad = ok;
  bad.max_tokens = 0;
  expect_error([&] { generate(*model, {{1}}, {bad}); }, error_code::invalid_argument,
               {"max_tokens must be >= 1, got 0"});
  bad = ok;
  bad.stop_token_ids = {512};
  expect_error([&] { generate(*model, {{1}}, {bad}); }, error_code::invalid_argument,
               {"stop token id 512"});
}

TEST(Generate, SampledFrequenciesFollowTheFilteredDistribution) {
  auto model = tiny_model();
  const std::vector<int64_t> prompt{42, 43, 44};
  const int rows = 900;
  const prompt_list prompts(rows, prompt);
  std::vector<sampling_params> params;
  for (int i = 0; i < rows; ++i)
    params.push_back(make_params(1, 1.5, static_cast<uint64_t>(i), 4));
  auto out = generate(*model, prompts, params);

  // Expected: softmax(logits / 1.5) over the 4 most likely tokens, from a full forward pass.
  auto last = full_logits(*model, prompt)[static_cast<int64_t>(prompt.size()) - 1];
  std::map<int64_t, int> counts;
  for (const auto& o : out)
    counts[o.tokens.at(0)]++;
  double total_p = 0;
  for (const auto& [token, count] : counts) {
    const double p = std::exp(reference_logprob(last, token, 1.5, 4, 1.0));
    ASSERT_GT(p, 0.0) << "token " << token << " is outside the top-4 set";
    total_p += p;
    // Binomial count: within 5 standard deviations of its mean (deterministic seeds).
    const double mean = rows * p;
    const double sd = std::sqrt(rows * p * (1 - p));
    EXPECT_NEAR(count, mean, 5 * sd + 1) << "token " << token << " p=" << p;
  }
  EXPECT_LE(counts.size(), 4u);
  EXPECT_NEAR(total_p, 1.0, 1e-3); // every kept token was drawn at least once
}

TEST(SamplingMath, TopPOnLargeFlatVocabularyMatchesFullSortReference) {
  // A flat distribution over 5000 tokens makes top-p keep thousands of them (beyond any small
  // sorted window); a reference with a full sort, written here, must agree exactly on the set.
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<float> logits(5000);
  for (auto& x : logits)
    x = normal(rng);
  for (double top_p : {0.05, 0.5, 0.9, 0.999}) {
    for (int64_t top_k : {int64_t{-1}, int64_t{3000}}) {
      auto lp = sampling_log_probs(logits, params_with(1.0, top_k, top_p));
      auto p = softmax(logits, 1.0);
      std::vector<int64_t> ids(p.size());
      std::iota(ids.begin(), ids.end(), int64_t{0});
      std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
      if (top_k > 0)
        ids.resize(static_cast<size_t>(top_k));
      double mass = 0;
      for (int64_t id : ids)
        mass += p[id];
      double cumulative = 0;
      size_t keep = ids.size();
      for (size_t i = 0; i < ids.size(); ++i) {
        cumulative += p[ids[i]] / mass;
        if (cumulative >= top_p) {
          keep = i + 1;
          break;
        }
      }
      ids.resize(keep);
      std::sort(ids.begin(), ids.end());
      EXPECT_EQ(support(lp), ids) << "top_p=" << top_p << " top_k=" << top_k;
      double kept_mass = 0;
      for (int64_t id : ids)
        kept_mass += p[id];
      for (int64_t id : {ids.front(), ids.back()})
        EXPECT_NEAR(lp[id], std::log(p[id] / kept_mass), 1e-9);
    }
  }
}
