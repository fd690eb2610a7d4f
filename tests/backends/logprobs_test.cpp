#include "backends/model/logprobs.hpp"

#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;

namespace {

struct inputs {
  at::Tensor hidden, weight, targets;
};

inputs make_inputs(int64_t b, int64_t t, int64_t h, int64_t v, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  inputs in;
  in.hidden = at::empty({b, t, h}, at::kFloat).normal_(0, 1, gen);
  in.weight = at::empty({v, h}, at::kFloat).normal_(0, 0.5, gen);
  in.targets = at::empty({b, t}, at::kLong).random_(0, v, gen);
  return in;
}

// Straightforward per-position computation in double: full logits, explicit log-sum-exp.
void naive(const inputs& in, double temperature, std::vector<double>& lp, std::vector<double>& ent) {
  auto logits = at::matmul(in.hidden.to(at::kDouble), in.weight.to(at::kDouble).t()) / temperature;
  auto flat = logits.reshape({-1, logits.size(-1)});
  auto targets = in.targets.reshape({-1});
  lp.clear();
  ent.clear();
  for (int64_t i = 0; i < flat.size(0); ++i) {
    auto row = flat[i];
    double mx = row.max().item<double>();
    double z = (row - mx).exp().sum().item<double>();
    double lse = mx + std::log(z);
    lp.push_back(row[targets[i].item<int64_t>()].item<double>() - lse);
    auto logp = row - lse;
    ent.push_back(-(logp.exp() * logp).sum().item<double>());
  }
}

model_config tiny() {
  auto c = preset("tiny");
  c.vocab_size = 80;
  c.max_position_embeddings = 32;
  return c;
}

} // namespace

TEST(Logprobs, ChunkedValuesMatchNaiveComputationForAnyChunkSize) {
  auto in = make_inputs(3, 7, 16, 50, 1);
  for (double temperature : {1.0, 0.7, 2.5}) {
    std::vector<double> lp, ent;
    naive(in, temperature, lp, ent);
    for (int64_t chunk : {1, 4, 5, 21, 128}) {
      auto r = chunked_token_logprobs(in.hidden, in.weight, in.targets, temperature, chunk, true);
      ASSERT_EQ(r.logprobs.sizes(), (at::IntArrayRef{3, 7}));
      ASSERT_EQ(r.entropy.sizes(), (at::IntArrayRef{3, 7}));
      auto flp = r.logprobs.reshape({-1});
      auto fen = r.entropy.reshape({-1});
      for (int64_t i = 0; i < 21; ++i) {
        EXPECT_NEAR(flp[i].item<double>(), lp[i], 1e-5) << "chunk " << chunk << " i " << i;
        EXPECT_NEAR(fen[i].item<double>(), ent[i], 1e-5) << "chunk " << chunk << " i " << i;
      }
    }
  }
}

TEST(Logprobs, EntropyIsOmittedUnlessRequestedAndBoundedByLogVocab) {
  auto in = make_inputs(2, 3, 8, 20, 2);
  auto r = chunked_token_logprobs(in.hidden, in.weight, in.targets, 1.0, 2, false);
  EXPECT_FALSE(r.entropy.defined());
  r = chunked_token_logprobs(in.hidden, in.weight, in.targets, 1.0, 2, true);
  EXPECT_TRUE((r.entropy >= 0).all().item<bool>());
  EXPECT_TRUE((r.entropy <= std::log(20.0) + 1e-6).all().item<bool>());
  // A very high temperature makes the distribution uniform: entropy -> log V, logp -> -log V.
  r = chunked_token_logprobs(in.hidden, in.weight, in.targets, 1e6, 4, true);
  EXPECT_NEAR(r.entropy.min().item<double>(), std::log(20.0), 1e-4);
  EXPECT_NEAR(r.logprobs.max().item<double>(), -std::log(20.0), 1e-4);
}

TEST(Logprobs, GradientsMatchAutogradThroughTheFullLogits) {
  auto in = make_inputs(2, 5, 12, 30, 3);
  auto coef_lp = at::randn({2, 5}, at::kDouble).to(at::kFloat);
  auto coef_ent = at::randn({2, 5}, at::kDouble).to(at::kFloat);
  const double temperature = 0.8;
  // Reference: autograd through the unchunked log_softmax.
  auto h1 = in.hidden.clone().requires_grad_(true);
  auto w1 = in.weight.clone().requires_grad_(true);
  auto logp = at::log_softmax(at::matmul(h1, w1.t()) / temperature, -1);
  auto lp = logp.gather(-1, in.targets.unsqueeze(-1)).squeeze(-1);
  auto ent = -(logp.exp() * logp).sum(-1);
  ((lp * coef_lp).sum() + (ent * coef_ent).sum()).backward();
  // Chunked, with the log-probs kept for backward (they fit the default budget) and with the
  // logits recomputed in backward (budget 0).
  for (int64_t keep : {default_kept_logprob_bytes, int64_t{0}}) {
    SCOPED_TRACE(keep ? "kept" : "recomputed");
    auto h2 = in.hidden.clone().requires_grad_(true);
    auto w2 = in.weight.clone().requires_grad_(true);
    auto r = chunked_token_logprobs(h2, w2, in.targets, temperature, 3, true, -1, {}, {}, keep);
    ((r.logprobs * coef_lp).sum() + (r.entropy * coef_ent).sum()).backward();
    EXPECT_TRUE(at::allclose(h2.grad(), h1.grad(), 1e-4, 1e-5));
    EXPECT_TRUE(at::allclose(w2.grad(), w1.grad(), 1e-4, 1e-5));
  }
  // Only the log-probs contribute when entropy is not requested.
  auto h3 = in.hidden.clone().requires_grad_(true);
  auto w3 = in.weight.clone();
  auto r3 = chunked_token_logprobs(h3, w3, in.targets, temperature, 4, false);
  (r3.logprobs * coef_lp).sum().backward();
  auto h4 = in.hidden.clone().requires_grad_(true);
  auto lp4 = at::log_softmax(at::matmul(h4, in.weight.t()) / temperature, -1)
               .gather(-1, in.targets.unsqueeze(-1))
               .squeeze(-1);
  (lp4 * coef_lp).sum().backward();
  EXPECT_TRUE(at::allclose(h3.grad(), h4.grad(), 1e-4, 1e-5));
  EXPECT_FALSE(w3.grad().defined());
}

TEST(Logprobs, SequenceLogprobsOfLeftPaddedRowsMatchScoreTokens) {
  auto model = causal_lm::random(tiny(), 3);
  std::vector<int64_t> a{5, 6, 7, 8, 9}, b{40, 41, 42};
  auto ids = at::zeros({2, 5}, at::kLong);
  auto mask = at::zeros({2, 5}, at::kLong);
  for (int64_t i = 0; i < 5; ++i) {
    ids[0][i] = a[i];
    mask[0][i] = 1;
  }
  for (int64_t i = 0; i < 3; ++i) {
    ids[1][2 + i] = b[i];
    mask[1][2 + i] = 1;
  }
  c10::NoGradGuard ng;
  auto r = sequence_logprobs(*model, ids, mask, 1.0, 3, true);
  ASSERT_EQ(r.logprobs.sizes(), (at::IntArrayRef{2, 4}));
  auto sa = score_tokens(*model, a);
  auto sb = score_tokens(*model, b);
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_NEAR(r.logprobs[0][i].item<double>(), sa[i], 1e-5);
  for (int64_t i = 0; i < 2; ++i)
    EXPECT_NEAR(r.logprobs[1][2 + i].item<double>(), sb[i], 1e-5);
  // score_tokens agrees with the full logits computed directly.
  auto logits = model->logits(model->forward_hidden(at::tensor(a, at::kLong).view({1, -1})));
  auto logp = at::log_softmax(logits.to(at::kDouble), -1);
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_NEAR(sa[i], logp[0][i][a[i + 1]].item<double>(), 1e-5);
}

TEST(Logprobs, RejectsTargetsOutsideTheVocabulary) {
  auto in = make_inputs(1, 4, 8, 20, 4);
  for (int64_t bad : {int64_t{20}, int64_t{-3}}) {
    auto t = in.targets.clone();
    t[0][2] = bad;
    expect_error([&] { chunked_token_logprobs(in.hidden, in.weight, t, 1.0, 2, false); },
                 error_code::out_of_range, {std::to_string(bad), "20"});
  }
}

TEST(Logprobs, RejectsNonPositiveOrNanTemperature) {
  auto in = make_inputs(1, 4, 8, 20, 5);
  for (double t : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    expect_error([&] { chunked_token_logprobs(in.hidden, in.weight, in.targets, t, 2, false); },
                 error_code::invalid_argument, {"temperature"});
  }
}

TEST(Logprobs, RejectsSequenceLongerThanMaxPositionEmbeddings) {
  auto model = causal_lm::random(tiny(), 1);
  auto hidden = at::zeros({1, 33, 64});
  auto targets = at::zeros({1, 33}, at::kLong);
  expect_error([&] { token_logprobs(*model, hidden, targets); }, error_code::invalid_argument,
               {"33", "32"});
}

TEST(Logprobs, RejectsBadShapesAndChunkSizes) {
  auto in = make_inputs(2, 4, 8, 20, 6);
  expect_error([&] { chunked_token_logprobs(in.hidden, in.weight, in.targets, 1.0, 0, false); },
               error_code::invalid_argument, {"chunk_size", "0"});
  expect_error([&] {
    chunked_token_logprobs(in.hidden, in.weight, in.targets.narrow(1, 0, 3), 1.0, 2, false);
  }, error_code::invalid_argument, {"targets", "[2, 3]"});
  expect_error([&] { chunked_token_logprobs(in.hidden[0], in.weight, in.targets, 1.0, 2, false); },
               error_code::invalid_argument, {"hidden", "[4, 8]"});
  expect_error([&] {
    chunked_token_logprobs(in.hidden, in.weight.narrow(1, 0, 7), in.targets, 1.0, 2, false);
  }, error_code::invalid_argument, {"weight", "[20, 7]"});
  auto model = causal_lm::random(tiny(), 1);
  expect_error([&] { score_tokens(*model, {3}); }, error_code::invalid_argument, {"2 tokens"});
  expect_error([&] { score_tokens(*model, {3, 80}); }, error_code::out_of_range, {"80"});
}

TEST(Logprobs, SequenceLogprobsRejectsBadShapes) {
  auto model = causal_lm::random(tiny(), 1);
  auto ids = at::ones({2, 4}, at::kLong);
  expect_error([&] { sequence_logprobs(*model, ids.narrow(1, 0, 1), at::ones({2, 1}, at::kLong)); },
               error_code::invalid_argument, {"S >= 2", "[2, 1]"});
  expect_error([&] { sequence_logprobs(*model, ids, at::ones({2, 3}, at::kLong)); },
               error_code::invalid_argument, {"attention_mask", "[2, 4]"});
  expect_error([&] { sequence_logprobs(*model, ids, at::ones({2, 4}, at::kLong), -1.0); },
               error_code::invalid_argument, {"temperature", "-1"});
}
