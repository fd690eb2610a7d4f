// backends/train/micro_batches.hpp: padding-free micro-batches (rows sorted by length, packed
// under a token budget, trimmed) cover every row once, keep the layout's alignment, and scatter
// back to the batch's rows and columns.
#include "backends/train/micro_batches.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <set>

#include "backends/error.hpp"

using namespace rlforge::backends;

namespace {

/// Rows with prompts of 2 tokens and responses of the given lengths.
training_batch batch_of(const std::vector<int64_t>& response_lengths) {
  std::vector<std::vector<int64_t>> prompts, responses;
  per_token_values per_token;
  for (size_t i = 0; i < response_lengths.size(); ++i) {
    prompts.push_back({1, 2});
    std::vector<int64_t> r;
    std::vector<float> adv;
    for (int64_t t = 0; t < response_lengths[i]; ++t) {
      r.push_back(3 + static_cast<int64_t>(i) + t);
      adv.push_back(static_cast<float>(10 * i + t));
    }
    responses.push_back(r);
    per_token["advantages"].push_back(adv);
  }
  return from_sequences(prompts, responses, per_token);
}

} // namespace

TEST(MicroBatches, WithoutLimitsOrByRowsTheyAreConsecutiveSlices) {
  auto b = batch_of({3, 1, 4, 2, 5});
  auto whole = plan_micro_batches(b, {});
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].rows, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  auto rows = plan_micro_batches(b, {0, 2});
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[2].rows, (std::vector<int64_t>{4}));
  EXPECT_EQ(rows[0].batch.sequence_length(), b.sequence_length());
}

TEST(MicroBatches, TokenBudgetPacksSortedRowsAndTrimsEachMicroBatch) {
  const std::vector<int64_t> response{1, 6, 2, 5, 1, 6};
  auto b = batch_of(response);
  // Sequences are 2 + response: 3, 8, 4, 7, 3, 8; longest first: rows 1, 5 (8), 3 (7), 2 (4),
  // 0, 4 (3). Budget 16: {1, 5} (2 x 8), {3, 2} (2 x 7), {0, 4} (2 x 3); rows keep their order.
  auto plan = plan_micro_batches(b, {16, 0});
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].rows, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(plan[1].rows, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(plan[2].rows, (std::vector<int64_t>{0, 4}));
  std::set<int64_t> seen;
  for (auto& m : plan) {
    const auto& mb = m.batch;
    int64_t longest = 0;
    for (auto r : m.rows) {
      seen.insert(r);
      longest = std::max<int64_t>(longest, 2 + response[static_cast<size_t>(r)]);
    }
    EXPECT_EQ(mb.sequence_length(), longest);
    EXPECT_LE(mb.batch_size() * mb.sequence_length(), 16);
    mb.validate(); // the trimmed layout is still a valid batch
    // Response tensors stay right-aligned with their tokens.
    for (int64_t i = 0; i < mb.batch_size(); ++i) {
      auto row = m.rows[static_cast<size_t>(i)];
      auto adv = mb.get("advantages")[i];
      EXPECT_FLOAT_EQ(adv[mb.response_length - 1].item<float>(),
                      b.get("advantages")[row][b.response_length - 1].item<float>());
      EXPECT_TRUE(at::equal(mb.get("sequences")[i].narrow(0, mb.sequence_length() - 1, 1),
                            b.get("sequences")[row].narrow(0, b.sequence_length() - 1, 1)));
    }
  }
  EXPECT_EQ(seen.size(), 6u);
  // A row longer than the budget goes alone.
  auto tiny = plan_micro_batches(b, {4, 0});
  EXPECT_EQ(tiny.front().rows.size(), 1u);
}

TEST(MicroBatches, ScatterPutsOutputsBackInRowOrderRightAligned) {
  auto b = batch_of({1, 6, 2, 5});
  auto plan = plan_micro_batches(b, {16, 0});
  std::vector<at::Tensor> outs;
  for (auto& m : plan) {
    // Each output is the row's advantages: scattering must reproduce the batch's tensor.
    outs.push_back(m.batch.get("advantages"));
  }
  auto whole = scatter_response_outputs(plan, outs, b.batch_size(), b.response_length);
  EXPECT_TRUE(at::equal(whole, b.get("advantages")));
  outs.pop_back();
  EXPECT_THROW(scatter_response_outputs(plan, outs, b.batch_size(), b.response_length), error);
}

TEST(MicroBatches, RefusesNegativeLimits) {
  auto b = batch_of({1, 2});
  EXPECT_THROW(plan_micro_batches(b, {-1, 0}), error);
  EXPECT_THROW(plan_micro_batches(b, {0, -3}), error);
}
