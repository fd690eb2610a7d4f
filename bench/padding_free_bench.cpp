// Padding-free micro-batches (backends/train/micro_batches.hpp, veRL's dynamic batch size)
// against one padded pass: a batch of rows whose lengths vary as RL responses do (prompt 32,
// response uniform in 16..--longest), forward + backward of the masked response log-probs of
// the "small" preset in bf16, (a) as one batch left-padded to its longest row, (b) split into
// micro-batches of at most --max-tokens tokens, each trimmed to its own longest row. Prints
// both medians, the ratio and the positions each computes (padding included).
//
//   padding_free_bench [--rows 32] [--longest 512] [--max-tokens 4096] [--reps 3] [--threads 2]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "backends/model/causal_lm.hpp"
#include "backends/model/compute_dtype.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "backends/threads.hpp"
#include "backends/train/micro_batches.hpp"
#include "backends/train/training_batch.hpp"

namespace be = rlforge::backends;
namespace keys = be::batch_keys;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Forward + backward of the masked response log-probs of `mb`; returns its positions.
int64_t pass(be::causal_lm& model, const be::training_batch& mb) {
  const auto& ids = mb.get(keys::sequences);
  const auto& mask = mb.get(keys::attention_mask);
  const int64_t s = ids.size(1), r = mb.response_length;
  auto positions = (mask.cumsum(1) - 1).clamp_min(0);
  auto hidden = model.forward_hidden(ids, mask, positions);
  auto lp = be::token_logprobs(model, hidden.narrow(1, s - r - 1, r), ids.narrow(1, s - r, r))
                .logprobs;
  (lp * mb.get(keys::loss_mask)).sum().backward();
  return ids.numel();
}

} // namespace

int main(int argc, char** argv) {
  int64_t rows = 32, longest = 512, max_tokens = 4096;
  int reps = 3, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (a == "--rows") rows = v;
    else if (a == "--longest") longest = v;
    else if (a == "--max-tokens") max_tokens = v;
    else if (a == "--reps") reps = static_cast<int>(v);
    else if (a == "--threads") threads = static_cast<int>(v);
    else {
      std::fprintf(stderr, "usage: padding_free_bench [--rows N] [--longest L] [--max-tokens T] "
                           "[--reps R] [--threads T]\n");
      return 2;
    }
  }
  if (argc % 2 == 0 || rows < 1 || longest < 16 || max_tokens < 1 || reps < 1 || threads < 1) {
    std::fprintf(stderr, "padding_free_bench: each flag takes a value; sizes >= 1 (--longest "
                         ">= 16)\n");
    return 2;
  }
  be::set_intra_op_threads(threads);
  auto model = be::causal_lm::random(be::preset("small"), 1);
  model->set_compute_dtype(be::compute_dtype::bf16);
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> length(16, longest), token(1, 4000);
  std::vector<std::vector<int64_t>> prompts, responses;
  for (int64_t i = 0; i < rows; ++i) {
    prompts.emplace_back(32);
    responses.emplace_back(length(rng));
    for (auto& t : prompts.back())
      t = token(rng);
    for (auto& t : responses.back())
      t = token(rng);
  }
  auto batch = be::from_sequences(prompts, responses);
  auto plan = be::plan_micro_batches(batch, {max_tokens, 0});
  std::vector<double> padded, packed;
  int64_t padded_positions = 0, packed_positions = 0;
  for (int r = 0; r <= reps; ++r) {
    for (auto& p : model->named_parameters())
      p.second.mutable_grad() = at::Tensor();
    auto t0 = std::chrono::steady_clock::now();
    padded_positions = pass(*model, batch);
    auto t1 = std::chrono::steady_clock::now();
    for (auto& p : model->named_parameters())
      p.second.mutable_grad() = at::Tensor();
    auto t2 = std::chrono::steady_clock::now();
    packed_positions = 0;
    for (const auto& mb : plan)
      packed_positions += pass(*model, mb.batch);
    auto t3 = std::chrono::steady_clock::now();
    if (r > 0) {
      padded.push_back(std::chrono::duration<double>(t1 - t0).count());
      packed.push_back(std::chrono::duration<double>(t3 - t2).count());
    }
  }
  std::printf("padding_free_bench: %lld rows, prompt 32, responses 16..%lld, small preset, bf16, "
              "%d threads\n",
              static_cast<long long>(rows), static_cast<long long>(longest), threads);
  std::printf("  padded: one pass, %lld positions: %.3f s\n",
              static_cast<long long>(padded_positions), median(padded));
  std::printf("  padding-free: %zu micro-batches of <= %lld tokens, %lld positions: %.3f s\n",
              plan.size(), static_cast<long long>(max_tokens),
              static_cast<long long>(packed_positions), median(packed));
  std::printf("  speed-up %.2fx (positions %.2fx fewer)\n", median(padded) / median(packed),
              static_cast<double>(padded_positions) / static_cast<double>(packed_positions));
  return 0;
}
