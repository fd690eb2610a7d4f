#include "backends/model/sampling_params.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "backends/error.hpp"

using namespace rlforge::backends;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

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
  expect_invalid(with([](auto& p) { p.stop_token_ids = {3, 10}; }), 10,
                 "stop token id 10 is outside the vocabulary [0, 10)");
  expect_invalid(with([](auto& p) { p.stop_token_ids = {-1}; }), 10, "stop token id -1");
}
