// bf16 mixed precision (backends/model/compute_dtype.hpp, mixed_linear.hpp and the bf16 mode of
// causal_lm): log-probs close to fp32, gradients on the fp32 weights close to fp32's, bf16 copies
// refreshed after in-place updates, bf16 storage for inference holders, and bad input.
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/compute_dtype.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/mixed_linear.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using rlforge::backends::testing::temp_dir;

namespace {

model_config small_config(const std::string& preset_name) {
  auto c = preset(preset_name);
  c.max_position_embeddings = 64;
  return c;
}

at::Tensor tokens(int64_t rows, int64_t len, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {rows, len}, gen, at::kLong);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

} // namespace

TEST(ComputeDtype, ParsesNamesAndRefusesOthers) {
  EXPECT_EQ(parse_compute_dtype("fp32"), compute_dtype::fp32);
  EXPECT_EQ(parse_compute_dtype("float32"), compute_dtype::fp32);
  EXPECT_EQ(parse_compute_dtype("bf16"), compute_dtype::bf16);
  EXPECT_EQ(parse_compute_dtype("bfloat16"), compute_dtype::bf16);
  EXPECT_STREQ(to_string(compute_dtype::bf16), "bf16");
  try {
    parse_compute_dtype("fp16");
    FAIL() << "fp16 accepted";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("'fp16'"), std::string::npos) << e.what();
  }
  // The default follows RLFORGE_COMPUTE_DTYPE where it is set, else the detection, whatever
  // the machine.
  EXPECT_FALSE(detect_bf16_support().reason.empty());
  const char* before = std::getenv("RLFORGE_COMPUTE_DTYPE");
  const std::string saved = before ? before : "";
  ::unsetenv("RLFORGE_COMPUTE_DTYPE");
  EXPECT_EQ(compute_dtype_from_environment(), std::nullopt);
  EXPECT_EQ(default_compute_dtype(),
            detect_bf16_support().fast ? compute_dtype::bf16 : compute_dtype::fp32);
  for (auto [name, dtype] : {std::pair{"fp32", compute_dtype::fp32},
                             std::pair{"bf16", compute_dtype::bf16}}) {
    ::setenv("RLFORGE_COMPUTE_DTYPE", name, 1);
    EXPECT_EQ(default_compute_dtype(), dtype) << name;
  }
  ::setenv("RLFORGE_COMPUTE_DTYPE", "fp8", 1);
  try {
    default_compute_dtype();
    ADD_FAILURE() << "RLFORGE_COMPUTE_DTYPE=fp8 accepted";
  } catch (const error& e) {
    EXPECT_NE(std::string(e.what()).find("RLFORGE_COMPUTE_DTYPE: compute dtype must be fp32 or "
                                         "bf16, got 'fp8'"),
              std::string::npos)
        << e.what();
  }
  if (before)
    ::setenv("RLFORGE_COMPUTE_DTYPE", saved.c_str(), 1);
  else
    ::unsetenv("RLFORGE_COMPUTE_DTYPE");
}

TEST(MixedLinear, MatchesFp32WithinBf16RoundingAndRoutesGradientsToTheFp32Weight) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto x = at::randn({2, 5, 32}, gen).requires_grad_(true);
  auto w = (at::randn({24, 32}, gen) * 0.1).requires_grad_(true);
  auto b = at::randn({24}, gen).requires_grad_(true);
  bf16_copy copy;
  auto y = mixed_linear(x, w, copy.of(w), b);
  EXPECT_EQ(y.scalar_type(), at::kFloat);
  EXPECT_EQ(y.sizes(), (at::IntArrayRef{2, 5, 24}));
  auto ref = at::linear(x, w, b);
  EXPECT_LT(max_abs_diff(y, ref), 2e-2);
  auto g = at::randn({2, 5, 24}, gen);
  auto grads = torch::autograd::grad({y}, {x, w, b}, {g});
  auto ref_grads = torch::autograd::grad({ref}, {x, w, b}, {g});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(grads[i].scalar_type(), at::kFloat) << i;
    auto scale = ref_grads[i].abs().max().item<double>();
    EXPECT_LT(max_abs_diff(grads[i], ref_grads[i]), 2e-2 * scale) << "grad " << i;
  }
}

TEST(MixedLinear, CopiesFollowInPlaceUpdatesOfTheMaster) {
  auto w = at::ones({4, 4});
  bf16_copy copy;
  auto first = copy.of(w);
  EXPECT_EQ(first.scalar_type(), at::kBFloat16);
  EXPECT_EQ(copy.bytes(), 4 * 4 * 2);
  EXPECT_TRUE(copy.of(w).is_same(first)); // unchanged master: the same copy
  {
    c10::NoGradGuard no_grad;
    w.mul_(3); // as an optimizer step does
  }
  EXPECT_DOUBLE_EQ(copy.of(w)[0][0].item<double>(), 3.0);
  w.set_data(at::full({4, 4}, 5.0)); // new storage
  EXPECT_DOUBLE_EQ(copy.of(w)[0][0].item<double>(), 5.0);
  copy.reset();
  EXPECT_EQ(copy.bytes(), 0);
  auto stored = at::ones({2, 2}, at::kBFloat16);
  EXPECT_TRUE(copy.of(stored).is_same(stored)); // bf16 masters are used as they are
}

// Every supported family: bf16 log-probs within 2e-2 of fp32 (the promise of `--dtype bf16`).
TEST(MixedPrecision, Bf16LogprobsAreWithinTwoHundredthsOfFp32) {
  for (const char* name : {"tiny", "tiny-qwen2", "tiny-qwen3"}) {
    auto c = small_config(name);
    auto model = causal_lm::random(c, 11);
    auto ids = tokens(3, 24, c.vocab_size, 5);
    c10::NoGradGuard no_grad;
    auto mask = at::ones_like(ids);
    auto fp32 = sequence_logprobs(*model, ids, mask).logprobs;
    model->set_compute_dtype(compute_dtype::bf16);
    EXPECT_EQ(model->compute_precision(), compute_dtype::bf16);
    auto bf16 = sequence_logprobs(*model, ids, mask).logprobs;
    EXPECT_GT(model->compute_copy_bytes(), 0);
    EXPECT_EQ(bf16.scalar_type(), at::kFloat);
    EXPECT_LT(max_abs_diff(bf16, fp32), 2e-2) << name;
    EXPECT_GT(max_abs_diff(bf16, fp32), 0.0) << name << ": bf16 mode computed in fp32";
    model->set_compute_dtype(compute_dtype::fp32);
    EXPECT_EQ(model->compute_copy_bytes(), 0);
    EXPECT_EQ(max_abs_diff(sequence_logprobs(*model, ids, mask).logprobs, fp32), 0.0) << name;
  }
}

TEST(MixedPrecision, GradientsReachTheFp32WeightsAndAStepChangesTheBf16Outputs) {
  auto c = small_config("tiny");
  auto fp = causal_lm::random(c, 2);
  auto mixed = causal_lm::random(c, 2);
  mixed->set_compute_dtype(compute_dtype::bf16);
  auto ids = tokens(2, 16, c.vocab_size, 9);
  auto mask = at::ones_like(ids);
  auto loss_of = [&](causal_lm& m) { return -sequence_logprobs(m, ids, mask).logprobs.sum(); };
  loss_of(*fp).backward();
  loss_of(*mixed).backward();
  auto fp_params = fp->named_parameters();
  auto mixed_params = mixed->named_parameters();
  ASSERT_EQ(fp_params.size(), mixed_params.size());
  for (size_t i = 0; i < fp_params.size(); ++i) {
    const auto& g = mixed_params[i].second.grad();
    ASSERT_TRUE(g.defined()) << mixed_params[i].first;
    EXPECT_EQ(g.scalar_type(), at::kFloat) << mixed_params[i].first;
    const auto& ref = fp_params[i].second.grad();
    auto scale = std::max(1e-6, ref.abs().max().item<double>());
    EXPECT_LT(max_abs_diff(g, ref), 0.05 * scale) << mixed_params[i].first;
  }
  // An SGD step on the fp32 weights: the next bf16 forward sees it (copies are refreshed).
  at::Tensor before;
  {
    c10::NoGradGuard no_grad;
    before = sequence_logprobs(*mixed, ids, mask).logprobs;
    for (auto& [name, p] : mixed->named_parameters())
      p.sub_(p.grad(), 1e-2);
    auto after = sequence_logprobs(*mixed, ids, mask).logprobs;
    EXPECT_GT(after.sum().item<double>(), before.sum().item<double>());
  }
}

TEST(MixedPrecision, LoraTrainsInBf16WithTheBaseFrozen) {
  auto c = small_config("tiny-qwen2");
  auto model = causal_lm::random(c, 4);
  lora_config lc;
  lc.rank = 4;
  model->enable_lora(lc, 1);
  model->set_compute_dtype(compute_dtype::bf16);
  auto ids = tokens(2, 12, c.vocab_size, 1);
  auto lp = sequence_logprobs(*model, ids, at::ones_like(ids)).logprobs;
  (-lp.sum()).backward();
  int adapters = 0;
  for (auto& [name, p] : model->named_parameters()) {
    if (name.find("lora_") != std::string::npos) {
      ++adapters;
      ASSERT_TRUE(p.grad().defined()) << name;
      if (name.find("lora_B") != std::string::npos) {
        EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0) << name;
      }
    } else {
      EXPECT_FALSE(p.grad().defined()) << name << " is frozen";
    }
  }
  EXPECT_GT(adapters, 0);
}

TEST(MixedPrecision, Bf16StorageHalvesTheWeightsAndGeneratesLikeBf16Compute) {
  auto c = small_config("tiny");
  auto compute = causal_lm::random(c, 8);
  compute->set_compute_dtype(compute_dtype::bf16);
  auto stored = causal_lm::random(c, 8);
  stored->store_weights_in_bf16();
  EXPECT_TRUE(stored->weights_in_bf16());
  EXPECT_EQ(stored->compute_precision(), compute_dtype::bf16);
  EXPECT_EQ(stored->num_trainable_parameters(), 0);
  EXPECT_EQ(stored->compute_copy_bytes(), 0);
  auto ids = tokens(2, 10, c.vocab_size, 3);
  c10::NoGradGuard no_grad;
  auto mask = at::ones_like(ids);
  // Both multiply the same bf16-rounded weights in the same kernels: identical results.
  EXPECT_EQ(max_abs_diff(sequence_logprobs(*compute, ids, mask).logprobs,
                         sequence_logprobs(*stored, ids, mask).logprobs),
            0.0);
  sampling_params p;
  p.max_tokens = 6;
  p.temperature = 0.8;
  p.seed = 17;
  auto a = generate(*compute, {{1, 2, 3}}, {p});
  auto b = generate(*stored, {{1, 2, 3}}, {p});
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  // Exported weights are fp32 whatever the storage.
  for (auto& [name, t] : stored->state_dict())
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
  EXPECT_THROW(stored->set_compute_dtype(compute_dtype::fp32), error);
  auto lora = causal_lm::random(c, 8);
  lora_config lc;
  lc.rank = 2;
  lora->enable_lora(lc, 1);
  EXPECT_THROW(lora->store_weights_in_bf16(), error);
}

TEST(MixedPrecision, ABf16InferenceLoadHoldsTheWeightsStoreWeightsInBf16Makes) {
  // fp32 on disk, read straight into bf16 (no fp32 copy of a GEMM weight): the same tensors as
  // loading in fp32 and converting, and the same log-probs.
  for (const char* name : {"tiny", "tiny-qwen2"}) {
    SCOPED_TRACE(name);
    auto c = small_config(name);
    c.tie_word_embeddings = std::string(name) == "tiny-qwen2";
    temp_dir dir("bf16_load");
    causal_lm::random(c, 4)->save_hf(dir.str());
    auto converted = causal_lm::load(dir.str());
    converted->store_weights_in_bf16();
    auto direct = causal_lm::load_for_inference(dir.str(), compute_dtype::bf16);
    EXPECT_TRUE(direct->weights_in_bf16());
    EXPECT_EQ(direct->num_trainable_parameters(), 0);
    auto want = converted->named_parameters();
    auto got = direct->named_parameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].first, want[i].first);
      EXPECT_EQ(got[i].second.scalar_type(), want[i].second.scalar_type()) << got[i].first;
      EXPECT_TRUE(at::equal(got[i].second, want[i].second)) << got[i].first;
    }
    auto ids = tokens(2, 9, c.vocab_size, 5);
    c10::NoGradGuard no_grad;
    auto mask = at::ones_like(ids);
    EXPECT_EQ(max_abs_diff(sequence_logprobs(*converted, ids, mask).logprobs,
                           sequence_logprobs(*direct, ids, mask).logprobs),
              0.0);
    // fp32 inference is the plain load.
    auto fp32 = causal_lm::load_for_inference(dir.str(), compute_dtype::fp32);
    EXPECT_FALSE(fp32->weights_in_bf16());
    EXPECT_EQ(fp32->compute_precision(), compute_dtype::fp32);
  }
}

namespace {

/// The sampler's log-probs of `rows` (seeded, temperature 1) against the trainer's
/// `sequence_logprobs` of each prompt + completion scored alone: the largest |difference|.
/// `batched` samples all rows in one call (left-padded together), else one call per row; the
/// completions are returned in `out`.
double sampler_vs_trainer(causal_lm& model, const std::vector<std::vector<int64_t>>& prompts,
                          bool batched, std::vector<sample_result>& out) {
  std::vector<sampling_params> params(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    params[i].max_tokens = 8;
    params[i].temperature = 1.0;
    params[i].seed = 100 + i;
    params[i].prompt_logprobs = true;
  }
  out.clear();
  if (batched) {
    out = generate(model, prompts, params);
  } else {
    for (size_t i = 0; i < prompts.size(); ++i)
      out.push_back(generate(model, {prompts[i]}, {params[i]})[0]);
  }
  double worst = 0;
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto full = prompts[i];
    full.insert(full.end(), out[i].tokens.begin(), out[i].tokens.end());
    auto ids = at::tensor(at::ArrayRef<int64_t>(full), at::kLong).unsqueeze(0);
    auto lp = sequence_logprobs(model, ids, at::ones_like(ids)).logprobs[0];
    const auto n = static_cast<int64_t>(prompts[i].size());
    for (size_t t = 0; t < out[i].tokens.size(); ++t)
      worst = std::max(
          worst, std::abs(out[i].logprobs[t] - lp[n - 1 + static_cast<int64_t>(t)].item<double>()));
    for (int64_t j = 1; j < n; ++j)
      worst = std::max(worst, std::abs(out[i].prompt_logprobs[static_cast<size_t>(j - 1)] -
                                       lp[j - 1].item<double>()));
  }
  return worst;
}

} // namespace

// The #1 RL failure is a sampler/trainer mismatch. fp32: the sampler's log-probs equal the
// trainer's to 1e-5; bf16: to 1e-3; bf16 in batch-invariant mode: bit for bit, and a row's
// tokens and log-probs do not depend on its batch-mates.
TEST(MixedPrecision, SamplerMatchesTrainerInEveryModeAndExactlyWhenBatchInvariant) {
  for (const char* name : {"tiny", "tiny-qwen2", "tiny-qwen3"}) {
    auto c = small_config(name);
    auto model = causal_lm::random(c, 21);
    const std::vector<std::vector<int64_t>> prompts{{1, 5, 9}, {3, 4, 5, 6, 7, 8, 2}, {11}};
    std::vector<sample_result> batched, alone;
    EXPECT_LT(sampler_vs_trainer(*model, prompts, true, batched), 1e-5) << name << " fp32";
    model->set_compute_dtype(compute_dtype::bf16);
    EXPECT_LT(sampler_vs_trainer(*model, prompts, true, batched), 1e-3) << name << " bf16";
    model->set_batch_invariant(true);
    EXPECT_EQ(sampler_vs_trainer(*model, prompts, true, batched), 0.0)
        << name << " bf16 batch-invariant, batched";
    EXPECT_EQ(sampler_vs_trainer(*model, prompts, false, alone), 0.0)
        << name << " bf16 batch-invariant, alone";
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(batched[i].tokens, alone[i].tokens) << name << " row " << i;
      EXPECT_EQ(batched[i].logprobs, alone[i].logprobs) << name << " row " << i;
    }
  }
}

// Batch-invariant mode, one sequence decoded a token at a time with the KV cache: every step's
// hidden state equals the full pass's row bit for bit. (A decode step projects a single row; on
// an AVX-512-BF16/AMX CPU the BLAS took another kernel for it, and position 11 of this sequence
// came out one ulp off before `project` padded such steps.)
TEST(MixedPrecision, BatchInvariantDecodeOfOneSequenceEqualsTheFullPassAtEveryStep) {
  for (const char* name : {"tiny", "tiny-qwen3"}) {
    auto model = causal_lm::random(small_config(name), 21);
    model->set_compute_dtype(compute_dtype::bf16);
    model->set_batch_invariant(true);
    c10::NoGradGuard no_grad;
    const std::vector<int64_t> seq{1,  5, 9, 33, 77, 100, 4,  8,  250, 31,
                                   17, 400, 3, 9, 12, 60, 61, 62, 63, 64};
    const auto n = static_cast<int64_t>(seq.size());
    auto ids = at::tensor(at::ArrayRef<int64_t>(seq), at::kLong).unsqueeze(0);
    auto full = model->forward_hidden(ids);
    kv_cache cache;
    auto prefix = ids.narrow(1, 0, 3);
    model->forward_hidden(prefix, at::ones_like(prefix), at::arange(3, at::kLong).unsqueeze(0),
                          &cache);
    for (int64_t t = 3; t < n; ++t) {
      auto step = model->forward_hidden(ids.narrow(1, t, 1), at::ones({1, t + 1}, at::kLong),
                                        at::full({1, 1}, t, at::kLong), &cache);
      EXPECT_TRUE(at::equal(step[0][0], full[0][t])) << name << " position " << t;
    }
  }
}

// Activation checkpointing recomputes each layer in backward: the same gradients, also with
// LoRA dropout (the recomputation replays the random stream) and in bf16.
TEST(GradientCheckpointing, GivesTheSameGradientsWithDropoutAndInBf16) {
  for (auto dtype : {compute_dtype::fp32, compute_dtype::bf16}) {
    auto c = small_config("tiny-qwen3");
    auto ids = tokens(2, 12, c.vocab_size, 4);
    std::vector<std::vector<at::Tensor>> grads;
    for (bool checkpoint : {false, true}) {
      auto model = causal_lm::random(c, 6);
      lora_config lc;
      lc.rank = 4;
      lc.dropout = 0.3;
      model->enable_lora(lc, 2);
      // A non-zero B so the adapters change the outputs (and dropout matters).
      for (auto& [name, p] : model->named_parameters())
        if (name.find("lora_B") != std::string::npos) {
          c10::NoGradGuard no_grad;
          p.fill_(0.05);
        }
      model->set_compute_dtype(dtype);
      model->set_training(true);
      model->set_gradient_checkpointing(checkpoint);
      at::manual_seed(123);
      auto lp = sequence_logprobs(*model, ids, at::ones_like(ids)).logprobs;
      (-lp.sum()).backward();
      std::vector<at::Tensor> g;
      for (auto& p : model->trainable_parameters())
        g.push_back(p.grad().clone());
      grads.push_back(g);
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      EXPECT_LT(max_abs_diff(grads[0][i], grads[1][i]), 1e-6)
          << to_string(dtype) << " parameter " << i;
  }
}
