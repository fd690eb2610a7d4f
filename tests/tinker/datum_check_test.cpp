// tinker/datum_check.hpp: the one check of a request against the model that computes it.
#include <cmath>
#include <limits>
#include <map>
#include <string>

#include "tests/tinker/test_support.hpp"
#include "tinker/datum_check.hpp"

namespace rlforge::tinker::test {
namespace {

const model_limits limits{16, 8}; // vocabulary 16, context 8

resolved_loss loss(const std::string& name, model_role role = model_role::policy) {
  std::map<std::string, double> config;
  if (name == "dro")
    config["beta"] = 0.1;
  return resolve_loss(name, config, role);
}

datum rl_datum() {
  datum d = sft_datum({1, 2, 3}, 4);
  d.loss_fn_inputs.erase("weights");
  d.loss_fn_inputs["logprobs"] = floats({0, -1, -2});
  d.loss_fn_inputs["advantages"] = floats({0, 1, 1});
  return d;
}

void check(const std::vector<datum>& data, const resolved_loss& l) {
  check_datums(data, l, limits, "forward_backward(m) request 0");
}

TEST(TinkerDatumCheck, AcceptsTheSdkDatums) {
  EXPECT_NO_THROW(
      check({sft_datum({1, 2, 3, 4, 5}, 6), sft_datum({7, 8}, 9)}, loss("cross_entropy")));
  for (const char* l : {"importance_sampling", "ppo", "cispo", "dro", "gspo", "dppo"})
    EXPECT_NO_THROW(check({rl_datum()}, loss(l))) << l;
}

// SDK 0.25's forward_backward_custom sends cross_entropy with weights = -dLoss/dlogprob, negative
// wherever the custom loss pushes a log-prob down: Tinker accepts any finite weight.
TEST(TinkerDatumCheck, AcceptsNegativeWeights) {
  auto d = sft_datum({1, 2, 3}, 4);
  d.loss_fn_inputs["weights"] = floats({0.5, -1, -0.25});
  EXPECT_NO_THROW(check({d}, loss("cross_entropy")));
}

// Tinker scores a datum on its target_tokens, which need not be the shifted inputs: placeholder
// targets at weight-0 prompt positions and any id at weighted positions are accepted.
TEST(TinkerDatumCheck, TargetsNeedNotBeTheShiftedInputs) {
  datum d;
  d.tokens = {5, 6, 7, 8};
  d.loss_fn_inputs["target_tokens"] = ints({0, 0, 3, 15});
  d.loss_fn_inputs["weights"] = floats({0, 0, 1, 1});
  EXPECT_NO_THROW(check({d}, loss("cross_entropy")));
  d.loss_fn_inputs["target_tokens"] = ints({0, 0, 3, 9}, dtype::int32);
  EXPECT_NO_THROW(check({d}, loss("cross_entropy")));
}

TEST(TinkerDatumCheck, RefusesTokensOutsideTheVocabularyOrContext) {
  expect_user_error(
      [] {
        check({sft_datum({1, -3}, 2)}, loss("cross_entropy"));
      },
      {"datum 0: model_input token 1 = -3 is a negative token id"});
  expect_user_error(
      [] {
        check({sft_datum({1, 16}, 2)}, loss("cross_entropy"));
      },
      {"model_input token 1 = 16 is outside the vocabulary [0, 16)"});
  auto d = sft_datum({1, 2}, 3);
  d.loss_fn_inputs["target_tokens"] = ints({2, 16});
  expect_user_error([&] { check({d}, loss("cross_entropy")); },
                    {"loss_fn_inputs.target_tokens[1] = 16 is outside the vocabulary"});
  d.loss_fn_inputs["target_tokens"] = ints({2, -1});
  expect_user_error([&] { check({d}, loss("cross_entropy")); },
                    {"target_tokens[1] = -1 is a negative token id"});
  expect_user_error(
      [] {
        check({sft_datum({1, 2, 3, 4, 5, 6, 7, 8}, 9)}, loss("cross_entropy"));
      },
      {"8 input tokens and the last target do not fit the context of 8"});
  expect_user_error([] { check({datum{}}, loss("cross_entropy")); },
                    {"datum 0: model_input has no tokens"});
  expect_user_error([] { check({}, loss("cross_entropy")); }, {"no data"});
}

TEST(TinkerDatumCheck, RefusesInputsOfTheWrongKindLengthOrValue) {
  auto d = sft_datum({1, 2, 3}, 4);
  d.loss_fn_inputs["target_tokens"] = floats({2, 3, 4});
  expect_user_error(
      [&] { check({d}, loss("cross_entropy")); },
      {"loss_fn_inputs.target_tokens: dtype float32 is not accepted", "int64 or int32"});
  d = sft_datum({1, 2, 3}, 4);
  d.loss_fn_inputs["weights"] = ints({1, 1, 1});
  expect_user_error([&] { check({d}, loss("cross_entropy")); },
                    {"weights: dtype int64 is not accepted", "float32 or bfloat16"});
  d = sft_datum({1, 2, 3}, 4);
  d.loss_fn_inputs["target_tokens"] = ints({2, 3});
  expect_user_error([&] { check({d}, loss("cross_entropy")); },
                    {"target_tokens: shape [2] with 2 values; expected [3]"});
  d = sft_datum({1, 2, 3}, 4);
  d.loss_fn_inputs["weights"].shape = {1, 3};
  expect_user_error([&] { check({d}, loss("cross_entropy")); }, {"shape [1, 3]"});
  d = sft_datum({1, 2, 3}, 4);
  d.loss_fn_inputs["weights"] = floats({1, std::numeric_limits<double>::infinity(), 1});
  expect_user_error([&] { check({d}, loss("cross_entropy")); }, {"weights[1] is not finite"});
  auto r = rl_datum();
  r.loss_fn_inputs["advantages"] = floats({0, std::numeric_limits<double>::infinity(), 1});
  expect_user_error([&] { check({r}, loss("ppo")); }, {"advantages[1] is not finite (inf)"});
  r = rl_datum();
  r.loss_fn_inputs["advantages"] = floats({0, 1, std::nan("")});
  expect_user_error([&] { check({r}, loss("ppo")); }, {"advantages[2] is not finite"});
}

TEST(TinkerDatumCheck, RefusesUnknownAndMissingInputs) {
  auto d = sft_datum({1, 2, 3}, 4);
  d.loss_fn_inputs["mask"] = floats({1, 1, 1});
  expect_user_error([&] { check({d}, loss("cross_entropy")); },
                    {"datum 0: unknown loss_fn_inputs entry 'mask'", "target_tokens, weights"});
  d = sft_datum({1, 2, 3}, 4);
  d.loss_fn_inputs.erase("target_tokens");
  expect_user_error(
      [&] {
        check({sft_datum({1, 2}, 3), d}, loss("cross_entropy"));
      },
      {"datum 1: loss_fn_inputs lacks 'target_tokens'"});
  auto r = rl_datum();
  r.loss_fn_inputs.erase("advantages");
  expect_user_error([&] { check({r}, loss("importance_sampling")); },
                    {"lacks 'advantages'", "loss 'importance_sampling' needs"});
  expect_user_error([&] { check({r}, loss("ppo")); }, {"lacks 'advantages'", "'ppo'"});
  // A critic's ppo needs values and returns.
  r = rl_datum();
  r.loss_fn_inputs["returns"] = floats({1, 1, 1});
  expect_user_error([&] { check({r}, loss("ppo", model_role::critic)); },
                    {"lacks 'values'", "'ppo'"});
  r.loss_fn_inputs["values"] = floats({0, 0, 0});
  EXPECT_NO_THROW(check({r}, loss("ppo", model_role::critic)));
  EXPECT_NO_THROW(check({r}, loss("ppo_critic", model_role::critic)));
}

forward_backward_request fb_request(std::vector<datum> data, const std::string& loss_fn,
                                    std::map<std::string, double> config = {}) {
  forward_backward_request r;
  r.model_id = "m";
  r.seq_id = 3;
  r.data = std::move(data);
  r.loss_fn = loss_fn;
  r.loss_fn_config = std::move(config);
  return r;
}

// A request that passes is held as it was sent, with its loss resolved as resolve_loss resolves
// it; slices of it are requests of consecutive datums with the same loss.
TEST(TinkerCheckRequest, HoldsTheDatumsAndTheResolvedLoss) {
  auto r = fb_request({rl_datum(), sft_datum({4, 5}, 6), rl_datum()}, "ppo",
                      {{"clip_low_threshold", 0.7}});
  r.data[1].loss_fn_inputs["logprobs"] = floats({-1, -2});
  r.data[1].loss_fn_inputs["advantages"] = floats({1, 0});
  auto c = check_request(r, model_role::policy, limits, "forward_backward(m) request 0");
  EXPECT_EQ(c.model_id(), "m");
  EXPECT_FALSE(c.forward_only());
  EXPECT_EQ(c.data(), r.data);
  EXPECT_EQ(c.loss(), resolve_loss("ppo", {{"clip_low_threshold", 0.7}}, model_role::policy));
  auto tail = c.slice(1, 3);
  ASSERT_EQ(tail.data().size(), 2u);
  EXPECT_EQ(tail.data()[0], r.data[1]);
  EXPECT_EQ(tail.data()[1], r.data[2]);
  EXPECT_EQ(tail.loss(), c.loss());
  EXPECT_EQ(tail.model_id(), "m");
  EXPECT_TRUE(c.slice(2, 9).data().size() == 1u); // clamped to the datums there are
  EXPECT_TRUE(c.slice(3, 3).data().empty());
  EXPECT_TRUE(c.slice(0, 3) == c);
  EXPECT_FALSE(c.slice(0, 2) == c);
}

// It refuses what resolve_loss and check_datums refuse, each message starting with `where`.
TEST(TinkerCheckRequest, RefusesABadLossOrBadDatumsNamingTheRequest) {
  const std::string where = "forward_backward(m) request 2 (seq_id 3)";
  expect_user_error(
      [&] { check_request(fb_request({rl_datum()}, "nope"), model_role::policy, limits, where); },
      {where + ": ", "nope"});
  expect_user_error(
      [&] {
        check_request(fb_request({rl_datum()}, "ppo", {{"clip_low_threshold", 2}}),
                      model_role::policy, limits, where);
      },
      {where + ": ", "clip_low_threshold"});
  expect_user_error(
      [&] {
        check_request(fb_request({rl_datum()}, "ppo_critic"), model_role::policy, limits, where);
      },
      {where + ": ", "ppo_critic"});
  expect_user_error(
      [&] {
        check_request(fb_request({sft_datum({1, 2}, 3)}, "importance_sampling"), model_role::policy,
                      limits, where);
      },
      {where + " datum 0", "logprobs"});
  expect_user_error(
      [&] {
        check_request(fb_request({sft_datum({1, 99}, 3)}, "cross_entropy"), model_role::policy,
                      limits, where);
      },
      {where + " datum 0", "99"});
  expect_user_error(
      [&] { check_request(fb_request({}, "cross_entropy"), model_role::policy, limits, where); },
      {where + ": no data"});
}

sample_request sample(std::vector<int64_t> prompt, int64_t max_tokens) {
  sample_request r;
  r.prompt = std::move(prompt);
  r.params.max_tokens = max_tokens;
  return r;
}

TEST(TinkerSampleCheck, AcceptsValidRequestsAndRefusesBadOnesNamingTheValue) {
  auto where = "sample(s) request 0";
  EXPECT_NO_THROW(check_sample(sample({1, 2}, 6), limits, where));
  auto with_stops = sample({1, 2}, 6);
  with_stops.params.stop_strings = {"\n\n", "User:"};
  EXPECT_NO_THROW(check_sample(with_stops, limits, where));
  struct bad_case {
    std::function<void(sample_request&)> edit;
    std::string expect;
  };
  std::vector<bad_case> cases = {
      {[](sample_request& r) { r.prompt.clear(); }, "empty prompt"},
      {[](sample_request& r) { r.prompt[1] = -2; }, "prompt token 1 = -2 is a negative token id"},
      {[](sample_request& r) { r.prompt[0] = 16; }, "prompt token 0 = 16 is outside"},
      {[](sample_request& r) { r.num_samples = 0; }, "num_samples must be >= 1, got 0"},
      {[](sample_request& r) { r.first_sample = -1; }, "first_sample must be >= 0"},
      {[](sample_request& r) { r.params.max_tokens = 0; }, "max_tokens must be >= 1, got 0"},
      {[](sample_request& r) { r.params.max_tokens = 7; },
       "a prompt of 2 tokens plus max_tokens 7 exceeds the model's context of 8 tokens; lower "
       "max_tokens to at most 6"},
      {[](sample_request& r) { r.params.temperature = -0.1; }, "temperature must be finite"},
      {[](sample_request& r) { r.params.top_p = 0; }, "top_p must be in (0, 1], got 0"},
      {[](sample_request& r) { r.params.top_k = 0; }, "top_k must be -1 (off) or >= 1, got 0"},
      {[](sample_request& r) {
         r.params.stop_tokens = {3, 99};
       },
       "stop token 1 = 99"},
      {[](sample_request& r) {
         r.params.stop_strings = {"\n", ""};
       },
       "stop string 1 is empty"},
      {[](sample_request& r) {
         r.params.has_seed = true;
         r.params.seed = -5;
       },
       "seed must be >= 0"},
      {[](sample_request& r) { r.topk_prompt_logprobs = 17; },
       "topk_prompt_logprobs must be in 0..16 (0 = off, at most the vocabulary size), got 17"},
      {[](sample_request& r) { r.topk_prompt_logprobs = -1; },
       "topk_prompt_logprobs must be in 0..16"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    auto r = sample({1, 2}, 6);
    cases[i].edit(r);
    expect_user_error([&] { check_sample(r, limits, where); }, {where, cases[i].expect});
  }
}

} // namespace
} // namespace rlforge::tinker::test
