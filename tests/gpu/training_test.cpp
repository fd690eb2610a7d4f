// Training on a CUDA device against the same model on the CPU in fp32 (the reference every
// other parity test uses): log-probs, the loss's gradients and one AdamW step, for fp32 on the
// device (tight) and for bf16 mixed precision (within bf16 tolerance), through both attention
// paths (the fused causal kernel on an unpadded batch, the masked one on a left-padded batch),
// with activation checkpointing, and the model's move to the device and back.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "backends/error.hpp"
#include "backends/model/compute_dtype.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/train/optimizer.hpp"
#include "gpu_support.hpp"

using namespace rlforge;
namespace be = rlforge::backends;

namespace {

struct batch {
  at::Tensor ids, mask;
};

/// `rows` x `len` random ids; with `padded`, row i is left-padded by 3 * i positions.
batch make_batch(int64_t rows, int64_t len, bool padded, int64_t vocab) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  batch b;
  b.ids = at::randint(1, vocab, {rows, len}, gen, at::kLong);
  b.mask = at::ones({rows, len}, at::kLong);
  if (padded)
    for (int64_t i = 0; i < rows; ++i)
      b.mask[i].narrow(0, 0, 3 * i).zero_();
  return b;
}

struct step_out {
  at::Tensor logprobs;                        ///< [B, T-1] on the CPU, masked
  std::vector<std::pair<std::string, at::Tensor>> grads; ///< on the CPU
  std::vector<std::pair<std::string, at::Tensor>> params_after; ///< after one AdamW step
};

/// Forward, backward of the masked sum of log-probs, one AdamW step; everything read back.
step_out train_step(be::causal_lm& model, const batch& b) {
  const auto dev = model.device();
  auto r = be::sequence_logprobs(model, b.ids.to(dev), b.mask.to(dev));
  auto valid = b.mask.narrow(1, 1, b.mask.size(1) - 1).to(dev).to(at::kFloat);
  (r.logprobs * valid).sum().backward();
  step_out out;
  out.logprobs = (r.logprobs.detach() * valid).cpu();
  be::named_parameters params;
  for (auto& [name, p] : model.named_parameters()) {
    out.grads.emplace_back(name, p.grad().detach().cpu());
    params.emplace_back(name, p);
  }
  be::adamw opt;
  be::adam_params hp;
  hp.learning_rate = 1e-3;
  hp.weight_decay = 0.01;
  opt.step(params, hp);
  for (auto& [name, p] : model.named_parameters())
    out.params_after.emplace_back(name, p.detach().cpu());
  return out;
}

/// max |a - b| / max(1, max |b|) over every tensor: errors relative to the tensors' scale.
double relative_error(const at::Tensor& a, const at::Tensor& b) {
  auto scale = std::max(1.0, b.abs().max().item<double>());
  return (a - b).abs().max().item<double>() / scale;
}

void expect_close(const step_out& got, const step_out& want, double logprob_tol, double grad_tol,
                  double param_tol, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_LE(relative_error(got.logprobs, want.logprobs), logprob_tol);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_EQ(got.grads[i].first, want.grads[i].first);
    EXPECT_LE(relative_error(got.grads[i].second, want.grads[i].second), grad_tol)
        << got.grads[i].first;
    EXPECT_LE(relative_error(got.params_after[i].second, want.params_after[i].second), param_tol)
        << got.params_after[i].first;
  }
}

step_out on_cpu(const batch& b) {
  auto m = gpu_test::random_model();
  return train_step(*m, b);
}

step_out on_device(const batch& b, be::compute_dtype dtype, bool checkpointing = false) {
  auto m = gpu_test::random_model();
  m->to(gpu_test::cuda0());
  m->set_compute_dtype(dtype);
  m->set_gradient_checkpointing(checkpointing);
  m->set_training(true);
  EXPECT_EQ(m->device(), gpu_test::cuda0());
  return train_step(*m, b);
}

} // namespace

TEST(GpuTraining, Fp32OnTheDeviceIsTheCpuStep) {
  RLFORGE_REQUIRE_DEVICE();
  for (bool padded : {false, true}) {
    auto b = make_batch(4, 48, padded, gpu_test::small_config().vocab_size);
    auto want = on_cpu(b);
    // One AdamW step moves a weight by at most the learning rate (1e-3) whatever its gradient:
    // a gradient within rounding of zero may point either way, so weights agree within 2.1e-3.
    expect_close(on_device(b, be::compute_dtype::fp32), want, 1e-4, 1e-3, 2.1e-3,
                 padded ? "left-padded (masked attention)" : "unpadded (causal kernel)");
  }
}

TEST(GpuTraining, Bf16MixedPrecisionIsTheCpuFp32StepWithinBf16Tolerance) {
  RLFORGE_REQUIRE_DEVICE();
  for (bool padded : {false, true}) {
    auto b = make_batch(4, 48, padded, gpu_test::small_config().vocab_size);
    auto want = on_cpu(b);
    // bf16 keeps 8 bits of mantissa: log-probs within 2e-2 (as the CPU's bf16 tests), the
    // gradients' largest entries within 5e-2 of their scale; AdamW moves each weight by about
    // the learning rate whatever the gradient's rounding.
    expect_close(on_device(b, be::compute_dtype::bf16), want, 2e-2, 5e-2, 2.1e-3,
                 padded ? "bf16, left-padded" : "bf16, unpadded");
  }
}

TEST(GpuTraining, ActivationCheckpointingGivesTheSameGradients) {
  RLFORGE_REQUIRE_DEVICE();
  auto b = make_batch(2, 32, false, gpu_test::small_config().vocab_size);
  auto plain = on_device(b, be::compute_dtype::fp32, false);
  expect_close(on_device(b, be::compute_dtype::fp32, true), plain, 1e-6, 1e-5, 2.1e-3,
               "checkpointed vs kept activations");
}

TEST(GpuTraining, AModelMovesToTheDeviceAndBackKeepingItsParameters) {
  RLFORGE_REQUIRE_CUDA();
  auto m = gpu_test::random_model();
  std::vector<at::Tensor> handles, values;
  for (auto& [name, p] : m->named_parameters()) {
    handles.push_back(p);
    values.push_back(p.detach().clone());
  }
  m->to(gpu_test::cuda0());
  size_t i = 0;
  for (auto& [name, p] : m->named_parameters()) {
    EXPECT_TRUE(p.is_cuda()) << name;
    // The same tensor objects (what an optimizer holds), now on the device.
    EXPECT_TRUE(p.is_same(handles[i])) << name;
    EXPECT_TRUE(at::equal(p.detach().cpu(), values[i])) << name;
    ++i;
  }
  // Batch-invariant attention is a CPU kernel: refused on the device, in either order.
  EXPECT_THROW(m->set_batch_invariant(true), be::error);
  m->to(c10::Device(c10::kCPU));
  i = 0;
  for (auto& [name, p] : m->named_parameters())
    EXPECT_TRUE(at::equal(p.detach(), values[i++])) << name;
  m->set_batch_invariant(true);
  EXPECT_THROW(m->to(gpu_test::cuda0()), be::error);
  EXPECT_TRUE(m->device().is_cpu());
}
