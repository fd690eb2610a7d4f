#include "backends/train/training_batch.hpp"

#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;

namespace {

std::vector<int64_t> row_of(const at::Tensor& t, int64_t i) {
  auto r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

std::vector<float> frow_of(const at::Tensor& t, int64_t i) {
  auto r = t[i].contiguous();
  return std::vector<float>(r.data_ptr<float>(), r.data_ptr<float>() + r.numel());
}

// Two rows: prompt 3 + response 2, prompt 1 + response 3.
training_batch two_rows() {
  return from_sequences({{1, 2, 3}, {4}}, {{5, 6}, {7, 8, 9}},
                        {{batch_keys::advantages, {{0.5f, -1.f}, {1.f, 2.f, 3.f}}}});
}

// A batch of five rows with every optional key, uids and group ids.
training_batch five_rows() {
  std::vector<std::vector<int64_t>> prompts = {{1, 2}, {3}, {4, 5, 6}, {7}, {8, 9}};
  std::vector<std::vector<int64_t>> responses = {{10}, {11, 12}, {13, 14}, {15, 16, 17}, {18}};
  per_token_values v;
  for (const auto& key : optional_response_keys()) {
    auto& rows = v[key];
    float x = 0.25f;
    for (const auto& r : responses) {
      rows.emplace_back();
      for (size_t k = 0; k < r.size(); ++k)
        rows.back().push_back(x += 0.5f);
    }
  }
  auto b = from_sequences(prompts, responses, v);
  b.uids = {100, 101, 102, 103, 104};
  b.group_ids = {0, 0, 1, 1, 2};
  return b;
}

void expect_same(const training_batch& a, const training_batch& b) {
  EXPECT_EQ(a.response_length, b.response_length);
  EXPECT_EQ(a.pad_size, b.pad_size);
  EXPECT_EQ(a.uids, b.uids);
  EXPECT_EQ(a.group_ids, b.group_ids);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto& [name, t] : a.tensors) {
    ASSERT_TRUE(b.has(name)) << name;
    EXPECT_TRUE(at::equal(t, b.get(name))) << name;
  }
}

} // namespace

TEST(TrainingBatch, FromSequencesLeftPadsAndRightAlignsResponses) {
  auto b = two_rows();
  EXPECT_EQ(b.batch_size(), 2);
  EXPECT_EQ(b.sequence_length(), 5);
  EXPECT_EQ(b.response_length, 3);
  EXPECT_EQ(b.pad_size, 0);
  EXPECT_EQ(row_of(b.get(batch_keys::sequences), 0), (std::vector<int64_t>{1, 2, 3, 5, 6}));
  EXPECT_EQ(row_of(b.get(batch_keys::sequences), 1), (std::vector<int64_t>{0, 4, 7, 8, 9}));
  EXPECT_EQ(row_of(b.get(batch_keys::attention_mask), 0), (std::vector<int64_t>{1, 1, 1, 1, 1}));
  EXPECT_EQ(row_of(b.get(batch_keys::attention_mask), 1), (std::vector<int64_t>{0, 1, 1, 1, 1}));
  EXPECT_EQ(row_of(b.get(batch_keys::response_mask), 0), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(row_of(b.get(batch_keys::response_mask), 1), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(frow_of(b.get(batch_keys::loss_mask), 0), (std::vector<float>{0, 1, 1}));
  EXPECT_EQ(frow_of(b.get(batch_keys::advantages), 0), (std::vector<float>{0, 0.5f, -1.f}));
  EXPECT_EQ(frow_of(b.get(batch_keys::advantages), 1), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(b.uids, (std::vector<int64_t>{0, 1}));
  EXPECT_FALSE(b.has(batch_keys::values));
}

TEST(TrainingBatch, ShiftedLogitWindowTargetsExactlyTheResponseTokens) {
  // Position p's logits predict token p+1, so the per-position targets are sequences[:, 1:];
  // the window -R-1:-1 of the logits is their last R columns. Where response_mask is 1 those
  // must be the response tokens, in order.
  std::vector<std::vector<int64_t>> prompts = {{3, 1}, {2, 2, 2, 2}, {9}};
  std::vector<std::vector<int64_t>> responses = {{7, 8, 9, 10}, {11}, {12, 13}};
  auto b = from_sequences(prompts, responses);
  const int64_t s = b.sequence_length(), r = b.response_length;
  ASSERT_EQ(r, 4);
  auto per_position_targets = b.get(batch_keys::sequences).narrow(1, 1, s - 1);
  auto targets = response_columns(per_position_targets, r);
  ASSERT_EQ(targets.sizes(), b.get(batch_keys::response_mask).sizes());
  for (int64_t i = 0; i < 3; ++i) {
    std::vector<int64_t> picked;
    auto mask = row_of(b.get(batch_keys::response_mask), i);
    auto t = row_of(targets, i);
    for (int64_t j = 0; j < r; ++j)
      if (mask[j])
        picked.push_back(t[j]);
    EXPECT_EQ(picked, responses[i]) << "row " << i;
  }
}

TEST(TrainingBatch, ModelLogprobsInTheResponseWindowMatchUnpaddedScoring) {
  auto model = causal_lm::random(preset("tiny"), 5);
  std::vector<std::vector<int64_t>> prompts = {{5, 6, 7}, {8}, {9, 10}};
  std::vector<std::vector<int64_t>> responses = {{11, 12}, {13, 14, 15, 16}, {17}};
  auto b = from_sequences(prompts, responses);
  c10::NoGradGuard no_grad;
  auto lp =
      sequence_logprobs(*model, b.get(batch_keys::sequences), b.get(batch_keys::attention_mask))
          .logprobs;
  auto window = response_columns(lp, b.response_length);
  const int64_t r = b.response_length;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int64_t> tokens = prompts[i];
    tokens.insert(tokens.end(), responses[i].begin(), responses[i].end());
    auto scored = score_tokens(*model, tokens); // scored[k] = log p(tokens[k+1] | prefix)
    const int64_t n = static_cast<int64_t>(responses[i].size());
    for (int64_t k = 0; k < n; ++k) {
      double expected = scored[scored.size() - static_cast<size_t>(n - k)];
      EXPECT_NEAR(window[i][r - n + k].item<double>(), expected, 1e-4)
          << "row " << i << " response token " << k;
    }
  }
  expect_error([] { response_columns(at::zeros({3}), 1); }, error_code::invalid_argument, {"[3]"});
  expect_error(
      [] {
        response_columns(at::zeros({2, 3}), 4);
      },
      error_code::invalid_argument, {"response_length 4", "[1, 3]"});
  expect_error(
      [] {
        response_columns(at::zeros({2, 3}), 0);
      },
      error_code::invalid_argument, {"response_length 0"});
  expect_error([] { response_columns(at::Tensor(), 1); }, error_code::invalid_argument,
               {"undefined"});
}

TEST(TrainingBatch, FromSequencesRejectsBadInputs) {
  expect_error([] { from_sequences({}, {}); }, error_code::invalid_argument, {"empty"});
  expect_error(
      [] {
        from_sequences({{1}}, {{2}, {3}});
      },
      error_code::invalid_argument, {"1 prompts", "2 responses"});
  expect_error(
      [] {
        from_sequences({{1}, {}}, {{2}, {3}});
      },
      error_code::invalid_argument, {"prompt 1", "empty"});
  expect_error(
      [] {
        from_sequences({{1}, {2}}, {{}, {}});
      },
      error_code::invalid_argument, {"every response is empty"});
  expect_error(
      [] {
        from_sequences({{1}}, {{2}}, {{"advantage", {{1.f}}}});
      },
      error_code::invalid_argument, {"unknown per-token key", "'advantage'"});
  expect_error(
      [] {
        from_sequences({{1}, {2}}, {{3}, {4}}, {{batch_keys::values, {{1.f}}}});
      },
      error_code::invalid_argument, {"'values'", "1 rows", "2 responses"});
  expect_error(
      [] {
        from_sequences({{1}, {2}}, {{3}, {4, 5}}, {{batch_keys::returns, {{1.f}, {2.f}}}});
      },
      error_code::invalid_argument, {"'returns'", "row 1", "1 values", "2 tokens"});
  expect_error(
      [] {
        from_sequences({{1}}, {{2}}, {{batch_keys::rewards, {{NAN}}}});
      },
      error_code::invalid_argument, {"'rewards'", "nan"});
  expect_error(
      [] {
        from_sequences({{1}, {1, 2}}, {{2}, {3}}, {}, -1);
      },
      error_code::out_of_range, {"'sequences'[0, 0] = -1", "negative token id"});
}

TEST(TrainingBatch, ValidateNamesTheTensorAndBothShapes) {
  auto b = two_rows();
  b.tensors[batch_keys::advantages] = at::zeros({2, 4});
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'advantages'", "[2, 4]", "[2, 3]"});
  b = two_rows();
  b.tensors[batch_keys::attention_mask] = at::ones({2, 6}, at::kLong);
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'attention_mask'", "[2, 6]", "[2, 5]"});
  b = two_rows();
  b.tensors["logits_scale"] = at::ones({3});
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'logits_scale'", "[3]", "2 rows"});
  b = two_rows();
  b.tensors.erase(batch_keys::loss_mask);
  expect_error([&] { b.validate(); }, error_code::invalid_argument, {"'loss_mask'", "missing"});
  b = two_rows();
  b.tensors[batch_keys::values] = at::Tensor();
  expect_error([&] { b.validate(); }, error_code::invalid_argument, {"'values'", "undefined"});
  b = two_rows();
  b.tensors[batch_keys::rewards] = at::scalar_tensor(1.0);
  expect_error([&] { b.validate(); }, error_code::invalid_argument, {"'rewards'", "row"});
}

TEST(TrainingBatch, ValidateChecksDtypesSizesAndMetadata) {
  auto b = two_rows();
  b.tensors[batch_keys::sequences] = b.get(batch_keys::sequences).to(at::kFloat);
  expect_error([&] { b.validate(); }, error_code::invalid_argument, {"'sequences'", "Long"});
  b = two_rows();
  b.tensors[batch_keys::advantages] = b.get(batch_keys::advantages).to(at::kDouble);
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'advantages'", "Float", "Double"});
  b = two_rows();
  for (auto& [name, t] : b.tensors)
    t = t.narrow(0, 0, 0);
  b.uids.clear();
  expect_error([&] { b.validate(); }, error_code::invalid_argument, {"empty"});
  for (int64_t r : {0, 5, -1}) {
    b = two_rows();
    b.response_length = r;
    expect_error([&] { b.validate(); }, error_code::invalid_argument,
                 {"response_length " + std::to_string(r), "[1, 4]"});
  }
  b = two_rows();
  b.pad_size = 3;
  expect_error([&] { b.validate(); }, error_code::invalid_argument, {"pad_size 3", "[0, 2]"});
  b = two_rows();
  b.uids = {1, 2, 3};
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"uids", "3 entries", "2 rows"});
  b = two_rows();
  b.group_ids = {1};
  expect_error([&] { b.validate(); }, error_code::invalid_argument, {"group_ids", "1 entries"});
}

TEST(TrainingBatch, ValidateRejectsNonFiniteValuesNamingThePosition) {
  auto b = two_rows();
  b.get(batch_keys::advantages)[1][2] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'advantages'[1, 2]", "nan", "not finite"});
  b = two_rows();
  b.tensors[batch_keys::values] = at::zeros({2, 3});
  b.get(batch_keys::values)[0][1] = -std::numeric_limits<float>::infinity();
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'values'[0, 1]", "inf", "not finite"});
}

TEST(TrainingBatch, ValidateChecksMasks) {
  auto b = two_rows();
  b.get(batch_keys::attention_mask)[1][2] = 2;
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'attention_mask'[1, 2] = 2", "not 0 or 1"});
  b = two_rows();
  b.get(batch_keys::response_mask)[0][0] = -1;
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'response_mask'[0, 0] = -1", "not 0 or 1"});
  // Right padding is not this layout.
  b = two_rows();
  b.get(batch_keys::attention_mask)[0][4] = 0;
  expect_error([&] { b.validate(); }, error_code::invalid_argument, {"'attention_mask'"});
  b = two_rows();
  b.get(batch_keys::attention_mask)[0][2] = 0;
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'attention_mask'[0, 2]", "left-padded"});
  // A response position over left padding: row 1 is [0, 0, 0, 0, 4, 8], the response window
  // covers positions 3..5.
  auto c = from_sequences({{1, 2, 3}, {4}}, {{5, 6, 7}, {8}});
  c.get(batch_keys::response_mask)[1][0] = 1;
  expect_error([&] { c.validate(); }, error_code::invalid_argument,
               {"'response_mask'[1, 0]", "attention_mask is 0"});
  // Loss on a non-response position.
  b = two_rows();
  b.get(batch_keys::loss_mask)[0][0] = 1;
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'loss_mask'[0, 0]", "response_mask is 0"});
  // Weights: 0/1 by default, any finite value (Tinker's may be negative) when asked.
  b = two_rows();
  b.get(batch_keys::loss_mask)[1][1] = 0.5;
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'loss_mask'[1, 1] = 0.5", "not 0 or 1"});
  EXPECT_NO_THROW(b.validate(batch_checks{-1, true}));
  b.get(batch_keys::loss_mask)[1][1] = -0.5;
  EXPECT_NO_THROW(b.validate(batch_checks{-1, true}));
  expect_error([&] { b.validate(); }, error_code::invalid_argument,
               {"'loss_mask'[1, 1] = -0.5", "not 0 or 1"});
  b.get(batch_keys::loss_mask)[1][1] = std::numeric_limits<float>::infinity();
  expect_error([&] { b.validate(batch_checks{-1, true}); }, error_code::invalid_argument,
               {"'loss_mask'[1, 1]", "not finite"});
}

TEST(TrainingBatch, ValidateChecksTokenIdsAgainstTheVocabulary) {
  auto b = two_rows();
  EXPECT_NO_THROW(b.validate(batch_checks{10, false}));
  expect_error(
      [&] {
        b.validate(batch_checks{9, false});
      },
      error_code::out_of_range, {"'sequences'[1, 4] = 9", "[0, 9)"});
  b.get(batch_keys::sequences)[0][1] = -4;
  expect_error([&] { b.validate(); }, error_code::out_of_range, {"'sequences'[0, 1] = -4"});
}

TEST(TrainingBatch, GetNamesMissingKeyAndPresentOnes) {
  auto b = two_rows();
  expect_error([&] { b.get("returns"); }, error_code::not_found, {"'returns'", "advantages"});
  EXPECT_TRUE(b.has(batch_keys::loss_mask));
  EXPECT_FALSE(b.has(batch_keys::returns));
}

TEST(TrainingBatch, PadShardConcatTrimRoundTripGivesTheOriginal) {
  auto original = five_rows();
  auto padded = pad_to_multiple(original, 4);
  ASSERT_NO_THROW(padded.validate());
  EXPECT_EQ(padded.batch_size(), 8);
  EXPECT_EQ(padded.pad_size, 3);
  EXPECT_EQ(padded.uids, (std::vector<int64_t>{100, 101, 102, 103, 104, 100, 101, 102}));
  EXPECT_EQ(padded.group_ids, (std::vector<int64_t>{0, 0, 1, 1, 2, 0, 0, 1}));
  // Padding rows copy real rows 0, 1, 2 except for zero loss and metric masks.
  for (int64_t i = 5; i < 8; ++i) {
    for (const auto& [name, t] : padded.tensors) {
      if (name == batch_keys::loss_mask || name == batch_keys::metric_mask)
        EXPECT_EQ(t[i].abs().sum().item<double>(), 0.0) << "row " << i;
      else
        EXPECT_TRUE(at::equal(t[i], original.get(name)[i - 5])) << name << " row " << i;
    }
  }
  auto shards = shard(padded, 4);
  ASSERT_EQ(shards.size(), 4u);
  std::vector<int64_t> pads;
  for (const auto& s : shards) {
    EXPECT_EQ(s.batch_size(), 2);
    EXPECT_NO_THROW(s.validate());
    pads.push_back(s.pad_size);
  }
  EXPECT_EQ(pads, (std::vector<int64_t>{0, 0, 1, 2}));
  EXPECT_EQ(shards[1].uids, (std::vector<int64_t>{102, 103}));
  auto joined = concat(shards);
  expect_same(joined, padded);
  auto trimmed = trim_padding(joined);
  expect_same(trimmed, original);
  // Per-row outputs of the padded batch trim to the real rows.
  auto out = at::arange(8 * 3).reshape({8, 3});
  EXPECT_TRUE(at::equal(trim_padding(out, padded.pad_size), out.narrow(0, 0, 5)));
  auto outs = trim_padding(std::map<std::string, at::Tensor>{{"logprobs", out}}, 3);
  EXPECT_EQ(outs.at("logprobs").size(0), 5);
}

TEST(TrainingBatch, PadToMultipleKeepsMultiplesAndCyclesOnlyRealRows) {
  auto b = five_rows();
  auto same = pad_to_multiple(b, 5);
  expect_same(same, b);
  auto once = pad_to_multiple(b, 3);     // 6 rows, 1 padding
  auto twice = pad_to_multiple(once, 4); // 8 rows, 3 padding: copies of rows 0, 1 (real)
  EXPECT_EQ(twice.pad_size, 3);
  EXPECT_EQ(twice.uids, (std::vector<int64_t>{100, 101, 102, 103, 104, 100, 100, 101}));
  EXPECT_EQ(trim_padding(twice).batch_size(), 5);
  auto one = slice_rows(b, 2, 3);
  auto wide = pad_to_multiple(one, 4);
  EXPECT_EQ(wide.uids, (std::vector<int64_t>{102, 102, 102, 102}));
  auto parts = shard(wide, 4);
  EXPECT_EQ(parts[3].pad_size, 1);
  EXPECT_EQ(trim_padding(parts[3]).batch_size(), 0);
}

TEST(TrainingBatch, SliceRowsCountsPaddingInsideTheRange) {
  auto padded = pad_to_multiple(five_rows(), 4);
  EXPECT_EQ(slice_rows(padded, 0, 5).pad_size, 0);
  EXPECT_EQ(slice_rows(padded, 4, 7).pad_size, 2);
  EXPECT_EQ(slice_rows(padded, 6, 8).pad_size, 2);
  EXPECT_EQ(slice_rows(padded, 4, 7).uids, (std::vector<int64_t>{104, 100, 101}));
  expect_error([&] { slice_rows(padded, 3, 3); }, error_code::invalid_argument, {"[3, 3)"});
  expect_error([&] { slice_rows(padded, -1, 2); }, error_code::invalid_argument, {"[-1, 2)"});
  expect_error([&] { slice_rows(padded, 2, 9); }, error_code::invalid_argument,
               {"[2, 9)", "8 rows"});
}

TEST(TrainingBatch, PaddingShardingAndConcatRejectBadInputs) {
  auto b = five_rows();
  expect_error([&] { pad_to_multiple(b, 0); }, error_code::invalid_argument, {"multiple", "0"});
  auto all_pad = b;
  all_pad.pad_size = 5;
  expect_error([&] { pad_to_multiple(all_pad, 2); }, error_code::invalid_argument,
               {"no real rows"});
  expect_error([&] { shard(b, 0); }, error_code::invalid_argument, {"got 0"});
  expect_error([&] { shard(b, 2); }, error_code::invalid_argument, {"5 rows", "2 equal shards"});
  expect_error([&] { concat({}); }, error_code::invalid_argument, {"no batches"});
  auto other = from_sequences({{1}}, {{2, 3, 4, 5}});
  expect_error([&] { concat({b, other}); }, error_code::invalid_argument, {"batch 1"});
  auto fewer = b;
  fewer.tensors.erase(batch_keys::rewards);
  expect_error([&] { concat({b, fewer}); }, error_code::invalid_argument, {"batch 1"});
  auto renamed = fewer;
  renamed.tensors["rewardz"] = b.get(batch_keys::rewards);
  expect_error(
      [&] {
        concat({b, renamed});
      },
      error_code::invalid_argument, {"batch 1", "'rewards'"});
  auto no_ids = b;
  no_ids.uids.clear();
  expect_error([&] { concat({b, no_ids}); }, error_code::invalid_argument, {"batch 1", "uids"});
  auto padded = pad_to_multiple(b, 2);
  expect_error(
      [&] {
        concat({padded, b});
      },
      error_code::invalid_argument, {"batch 1", "after padding rows"});
  auto r_differs = b;
  r_differs.response_length = 2;
  expect_error(
      [&] {
        concat({b, r_differs});
      },
      error_code::invalid_argument, {"response_length 2"});
  expect_error(
      [] {
        trim_padding(at::ones({3, 2}), 4);
      },
      error_code::invalid_argument, {"pad_size 4", "[0, 3]"});
  expect_error([] { trim_padding(at::ones({3}), -1); }, error_code::invalid_argument,
               {"pad_size -1"});
  expect_error([] { trim_padding(at::scalar_tensor(1.0), 0); }, error_code::invalid_argument,
               {"no row dimension"});
  expect_error(
      [] {
        trim_padding(std::map<std::string, at::Tensor>{{"values", at::ones({2})}}, 3);
      },
      error_code::invalid_argument, {"'values'", "pad_size 3"});
  auto bad = b;
  bad.pad_size = 6;
  expect_error([&] { trim_padding(bad); }, error_code::invalid_argument, {"pad_size 6"});
}
