// The training step of a model on one device, as rlforge's trainers run it: forward, the fused
// chunked lm_head + log-prob (no [tokens x vocab] logits kept), backward, AdamW, in bf16 mixed
// precision (bf16 GEMMs and attention, fp32 master weights, gradients, optimizer state and
// log-probs) or fp32. Prints the median step time, tokens/s, TFLOP/s and MFU against a bf16
// GEMM measured in the same run, and peak device memory, as one JSON object
// (figure "train_step", impl "rlforge"); bench/gpu/pytorch_peer.py `train` is its peer on the
// same GPU (bench/gpu/run computes the ratio). FLOPs as bench/train_bench.cpp counts them.
//
//   gpu_train_bench [--device cuda|cpu] [--preset qwen2.5-0.5b] [--batch 8] [--seq 1024]
//                   [--steps 5] [--dtype bf16|fp32] [--chunk 1024] [--checkpointing]
#include <cstdio>
#include <cstdlib>
#include <string>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "backends/devices.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/compute_dtype.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "backends/train/optimizer.hpp"
#include "bench/gpu/bench_json.hpp"

namespace be = rlforge::backends;
namespace gb = rlforge::gpu_bench;

int main(int argc, char** argv) {
  std::string device_name = "cuda", preset = "qwen2.5-0.5b", dtype_name = "bf16";
  int64_t batch = 8, seq = 1024, chunk = 1024;
  int steps = 5;
  bool checkpointing = false;
  gb::flags f(argc, argv,
              "gpu_train_bench [--device cuda|cpu] [--preset NAME] [--batch B] [--seq S] "
              "[--steps K] [--dtype bf16|fp32] [--chunk C] [--checkpointing]");
  while (f.next()) {
    if (f.is("--device")) device_name = f.value();
    else if (f.is("--preset")) preset = f.value();
    else if (f.is("--dtype")) dtype_name = f.value();
    else if (f.is("--batch")) batch = f.integer();
    else if (f.is("--seq")) seq = f.integer();
    else if (f.is("--chunk")) chunk = f.integer();
    else if (f.is("--steps")) steps = static_cast<int>(f.integer());
    else if (f.is("--checkpointing")) checkpointing = true;
    else f.unknown();
  }
  if (batch < 1 || seq < 2 || chunk < 1 || steps < 1) {
    std::fprintf(stderr, "gpu_train_bench: --batch, --steps, --chunk >= 1 and --seq >= 2\n");
    return 2;
  }
  const auto device = gb::parse_device(device_name);
  be::bind_thread_to(device);
  const auto dtype = be::parse_compute_dtype(dtype_name);
  const auto config = be::preset(preset);

  auto model = be::causal_lm::random(config, 1);
  model->to(device);
  model->set_compute_dtype(dtype);
  model->set_gradient_checkpointing(checkpointing);
  model->set_training(true);
  be::named_parameters params;
  for (auto& [name, p] : model->named_parameters())
    params.emplace_back(name, p);
  be::adamw optimizer;
  be::adam_params hp;
  hp.learning_rate = 1e-5;
  hp.weight_decay = 0.01;
  hp.grad_clip_norm = 1.0;

  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  auto data = at::randint(0, config.vocab_size, {batch, seq + 1}, gen, at::kLong).to(device);
  auto inputs = data.narrow(1, 0, seq), targets = data.narrow(1, 1, seq);
  double loss_value = 0;
  auto step = [&] {
    for (auto& [name, p] : params)
      p.mutable_grad() = at::Tensor();
    auto hidden = model->forward_hidden(inputs);
    auto lp = be::token_logprobs(*model, hidden, targets, 1.0, chunk, false).logprobs;
    auto loss = -lp.mean();
    loss.backward();
    optimizer.step(params, hp);
    loss_value = loss.item<double>();
  };
  if (!device.is_cpu())
    be::reset_peak_memory(device);
  const double seconds = gb::timed(device, steps, 2, step);

  // FLOPs per token: 6 per weight in the products (all projections and the lm_head; the tied
  // embedding lookup is no product) + the attention's 12 x layers x seq x width.
  const int64_t h = config.hidden_size, kv = config.num_key_value_heads * config.head_dim;
  const int64_t q = config.num_attention_heads * config.head_dim;
  const int64_t per_layer = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size;
  const double matmul_params =
      static_cast<double>(config.num_hidden_layers * per_layer + h * config.vocab_size);
  const double tokens = static_cast<double>(batch * seq);
  const double flops =
      tokens * (6.0 * matmul_params +
                12.0 * static_cast<double>(config.num_hidden_layers * seq * q));
  const double gemm = gb::gemm_tflops(device, device.is_cpu() ? 1024 : 8192, at::kBFloat16);
  nlohmann::json j{{"figure", "train_step"},
                   {"impl", "rlforge"},
                   {"device", be::describe(device)},
                   {"preset", preset},
                   {"dtype", dtype_name},
                   {"batch", batch},
                   {"seq", seq},
                   {"chunk", chunk},
                   {"checkpointing", checkpointing},
                   {"seconds", seconds},
                   {"tokens_per_s", tokens / seconds},
                   {"tflops", flops / seconds / 1e12},
                   {"bf16_gemm_tflops", gemm},
                   {"mfu", flops / seconds / 1e12 / gemm},
                   {"loss", loss_value}};
  if (!device.is_cpu())
    j["peak_gib"] = static_cast<double>(be::cuda_memory(device).peak_allocated) / (1 << 30);
  gb::emit(j);
  return 0;
}
