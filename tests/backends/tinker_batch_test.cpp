// backends/train/tinker_batch.hpp: Tinker datums to the trainer's batch and per-row outputs back.
#include "backends/train/tinker_batch.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <vector>

#include "backends/error.hpp"

using namespace rlforge::backends;
namespace tinker = rlforge::tinker;

namespace {

std::vector<int64_t> row_of(const at::Tensor& t, int64_t i) {
  auto r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

std::vector<float> frow_of(const at::Tensor& t, int64_t i) {
  auto r = t[i].contiguous();
  return std::vector<float>(r.data_ptr<float>(), r.data_ptr<float>() + r.numel());
}

tinker::tensor_data floats(std::vector<double> v) {
  tinker::tensor_data t;
  t.type = tinker::dtype::float32;
  t.shape = {static_cast<int64_t>(v.size())};
  t.floats = std::move(v);
  return t;
}

tinker::datum make_datum(std::vector<int64_t> input, std::vector<int64_t> targets) {
  tinker::datum d;
  d.tokens = std::move(input);
  tinker::tensor_data t;
  t.type = tinker::dtype::int64;
  t.shape = {static_cast<int64_t>(targets.size())};
  t.ints = std::move(targets);
  d.loss_fn_inputs["target_tokens"] = t;
  return d;
}

TEST(TinkerBatch, BuildsTheFullSequenceAndMapsInputs) {
  auto d0 = make_datum({10, 11, 12}, {11, 12, 13});
  d0.loss_fn_inputs["weights"] = floats({0, 1, 0.5});
  d0.loss_fn_inputs["logprobs"] = floats({-0.1, -0.2, -0.3});
  d0.loss_fn_inputs["advantages"] = floats({1, 2, 3});
  auto d1 = make_datum({20}, {21});
  d1.loss_fn_inputs["logprobs"] = floats({-0.7});
  d1.loss_fn_inputs["advantages"] = floats({4});
  auto b = batch_from_datums({&d0, &d1});
  b.validate(batch_checks{-1, true});
  EXPECT_EQ(b.response_length, 3);
  EXPECT_EQ(row_of(b.get(batch_keys::sequences), 0), (std::vector<int64_t>{10, 11, 12, 13}));
  EXPECT_EQ(row_of(b.get(batch_keys::sequences), 1), (std::vector<int64_t>{0, 0, 20, 21}));
  EXPECT_EQ(row_of(b.get(batch_keys::attention_mask), 1), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(row_of(b.get(batch_keys::response_mask), 1), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(row_of(b.get(batch_keys::target_tokens), 0), (std::vector<int64_t>{11, 12, 13}));
  EXPECT_EQ(row_of(b.get(batch_keys::target_tokens), 1), (std::vector<int64_t>{0, 0, 21}));
  EXPECT_EQ(frow_of(b.get(batch_keys::loss_mask), 0), (std::vector<float>{0, 1, 0.5}));
  // A datum without weights weighs every target 1, also beside datums with weights.
  EXPECT_EQ(frow_of(b.get(batch_keys::loss_mask), 1), (std::vector<float>{0, 0, 1}));
  auto lp = std::vector<float>{-0.1f, -0.2f, -0.3f};
  EXPECT_EQ(frow_of(b.get(batch_keys::action_log_probs), 0), lp);
  EXPECT_EQ(frow_of(b.get(batch_keys::rollout_logprobs), 0), lp);
  EXPECT_EQ(frow_of(b.get(batch_keys::rollout_logprobs), 1), (std::vector<float>{0, 0, -0.7f}));
  EXPECT_EQ(frow_of(b.get(batch_keys::advantages), 1), (std::vector<float>{0, 0, 4}));
  EXPECT_FALSE(b.has(batch_keys::values));
  EXPECT_EQ(b.uids, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(frow_of(b.get(batch_keys::metric_mask), 0), (std::vector<float>{0, 1, 1}));
  EXPECT_EQ(frow_of(b.get(batch_keys::metric_mask), 1), (std::vector<float>{0, 0, 1}));
}

// The positions the loss metrics average over come from the datum's structure, never from its
// advantages: the weighted positions where weights are given, else those with a behaviour
// log-prob (the cookbook's RL datums put 0 at prompt positions), else every position.
TEST(TinkerBatch, MetricPositionsFollowTheDatumsStructure) {
  auto rl = make_datum({1, 2, 3, 4}, {2, 3, 4, 5});
  rl.loss_fn_inputs["logprobs"] = floats({0, 0, -0.4, -1.5});
  rl.loss_fn_inputs["advantages"] = floats({0, 0, 0, 0});
  auto weighted = make_datum({6, 7, 8}, {7, 8, 9});
  weighted.loss_fn_inputs["weights"] = floats({0, -2, 1});
  weighted.loss_fn_inputs["logprobs"] = floats({-1, -1, 0});
  weighted.loss_fn_inputs["advantages"] = floats({0, 1, 0});
  auto b = batch_from_datums({&rl, &weighted});
  EXPECT_EQ(frow_of(b.get(batch_keys::loss_mask), 0), (std::vector<float>{1, 1, 1, 1}));
  EXPECT_EQ(frow_of(b.get(batch_keys::metric_mask), 0), (std::vector<float>{0, 0, 1, 1}));
  EXPECT_EQ(frow_of(b.get(batch_keys::loss_mask), 1), (std::vector<float>{0, 0, -2, 1}));
  EXPECT_EQ(frow_of(b.get(batch_keys::metric_mask), 1), (std::vector<float>{0, 0, 1, 1}));
  rl.loss_fn_inputs["advantages"] = floats({0, 0, 1, -1});
  auto same = batch_from_datums({&rl, &weighted});
  EXPECT_TRUE(at::equal(same.get(batch_keys::metric_mask), b.get(batch_keys::metric_mask)));
  auto sft = make_datum({1, 2}, {2, 3});
  auto plain = batch_from_datums({&sft});
  EXPECT_EQ(frow_of(plain.get(batch_keys::metric_mask), 0), (std::vector<float>{1, 1}));
  plain.validate(batch_checks{-1, true});
}

// Tinker scores a datum on its own targets: placeholder 0s at weight-0 prompt positions and a
// weighted target that is not the next input are kept as given.
TEST(TinkerBatch, KeepsTargetsThatAreNotTheShiftedInputs) {
  auto d = make_datum({5, 6, 7}, {0, 0, 42});
  d.loss_fn_inputs["weights"] = floats({0, 0, 1});
  auto b = batch_from_datums({&d});
  b.validate(batch_checks{100, true});
  EXPECT_EQ(row_of(b.get(batch_keys::target_tokens), 0), (std::vector<int64_t>{0, 0, 42}));
  EXPECT_EQ(row_of(b.get(batch_keys::sequences), 0), (std::vector<int64_t>{5, 6, 7, 42}));
  EXPECT_THROW(batch_from_datums({}), rlforge::backends::error);
}

TEST(TinkerBatch, DatumOutputsTakeEachRowsOwnTail) {
  std::map<std::string, at::Tensor> outputs;
  outputs["logprobs"] = at::tensor({0.f, -1.f, -2.f, 0.f, 0.f, -3.f}).view({2, 3});
  auto out = datum_outputs(outputs, {3, 1});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].at("logprobs").floats, (std::vector<double>{0, -1, -2}));
  EXPECT_EQ(out[0].at("logprobs").shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(out[1].at("logprobs").floats, (std::vector<double>{-3}));
  EXPECT_EQ(out[1].at("logprobs").type, tinker::dtype::float32);
  EXPECT_THROW(datum_outputs(outputs, {4}), rlforge::backends::error);
}

} // namespace
