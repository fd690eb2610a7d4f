#include "backends/model/token_sampler.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <string>

#include "backends/error.hpp"
#include "backends/model/logprobs.hpp"

namespace rlforge::backends {

namespace {

// Seeds for rows that bring none: a process-wide counter, mixed (splitmix64) so neighbouring
// counter values give unrelated generator states.
uint64_t next_default_seed() {
  static std::atomic<uint64_t> counter{0};
  uint64_t z = 0x5eed5eed5eed5eedULL + counter.fetch_add(1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// True when top-k or top-p changes the distribution a row samples from.
bool filters(const sampling_params& p) {
  return p.top_k > 0 || p.top_p < 1.0;
}

// `sample_tokens` for logits on a CUDA device: the vocabulary-wide work (log-softmax in double,
// cumulative sums, argmax, the reported fp32 log-prob) runs there, and only a token and a
// log-prob per row come back. Rows with top-k / top-p take their filtered row to the host and
// the CPU path. Same draws as the CPU path (one uniform per sampling row, in row order); the
// cumulative sums are a parallel scan, so a draw within rounding of a boundary may pick the
// neighbouring token that the host's sequential sum would not.
std::vector<sampled_token> sample_on_device(const at::Tensor& logits,
                                            const std::vector<const sampling_params*>& params,
                                            const std::vector<row_generator*>& generators) {
  const auto a = static_cast<int64_t>(params.size());
  const int64_t vocab = logits.size(1);
  std::vector<double> temperatures(static_cast<size_t>(a));
  std::vector<int64_t> filtered;
  for (int64_t k = 0; k < a; ++k) {
    const auto& p = *params[static_cast<size_t>(k)];
    temperatures[static_cast<size_t>(k)] = p.temperature > 0.0 ? p.temperature : 1.0;
    if (p.temperature > 0.0 && filters(p))
      filtered.push_back(k);
  }
  auto temperature = at::tensor(temperatures, at::kDouble).to(logits.device()).unsqueeze(1);
  auto raw = logits.to(at::kDouble);
  auto log_probs = at::log_softmax(raw / temperature, 1);
  auto cumulative = log_probs.exp().cumsum(1);
  // One uniform per sampling row, in row order (filtered rows draw on the host, below, in the
  // same order).
  std::vector<double> host_uniform(static_cast<size_t>(a), 0.0);
  for (int64_t k = 0; k < a; ++k)
    if (params[static_cast<size_t>(k)]->temperature > 0.0)
      host_uniform[static_cast<size_t>(k)] = generators[static_cast<size_t>(k)]->next_uniform();
  auto u = at::tensor(host_uniform, at::kDouble).to(logits.device()).unsqueeze(1);
  auto threshold = u * cumulative.narrow(1, vocab - 1, 1);
  // The first id whose cumulative probability exceeds u * total: the count of those that do not.
  auto drawn = cumulative.le(threshold).sum(1).clamp_max(vocab - 1);
  auto greedy = raw.argmax(1);
  std::vector<uint8_t> sampling(static_cast<size_t>(a));
  for (int64_t k = 0; k < a; ++k)
    sampling[static_cast<size_t>(k)] = params[static_cast<size_t>(k)]->temperature > 0.0;
  auto is_sampling = at::tensor(std::vector<int64_t>(sampling.begin(), sampling.end()), at::kLong)
                         .to(logits.device())
                         .to(at::kBool);
  auto tokens = at::where(is_sampling, drawn, greedy);
  // The trainer's log-prob (fp32 tempered log-softmax) of each chosen token.
  auto reported = at::log_softmax(logits.to(at::kFloat) / temperature.to(at::kFloat), 1)
                      .gather(1, tokens.unsqueeze(1))
                      .squeeze(1)
                      .to(at::kDouble);
  auto host_tokens = tokens.to(at::kCPU).contiguous();
  auto host_logprobs = reported.to(at::kCPU).contiguous();
  std::vector<sampled_token> out(static_cast<size_t>(a));
  for (int64_t k = 0; k < a; ++k)
    out[static_cast<size_t>(k)] = {host_tokens.data_ptr<int64_t>()[k],
                                   host_logprobs.data_ptr<double>()[k]};
  // Top-k / top-p rows: their filtered distribution on the host, drawn with the uniform each
  // already took.
  if (!filtered.empty()) {
    auto index = at::tensor(filtered, at::kLong).to(logits.device());
    auto rows = log_probs.index_select(0, index).to(at::kCPU).contiguous();
    for (size_t j = 0; j < filtered.size(); ++j) {
      const auto k = static_cast<size_t>(filtered[j]);
      const auto& p = *params[k];
      double* lp = rows.data_ptr<double>() + static_cast<int64_t>(j) * vocab;
      filter_log_probs(lp, vocab, p.top_k, p.top_p);
      std::vector<double> probs(static_cast<size_t>(vocab));
      for (int64_t i = 0; i < vocab; ++i)
        probs[static_cast<size_t>(i)] = std::exp(lp[i]);
      const int64_t token = inverse_cdf(probs.data(), vocab, host_uniform[k]);
      out[k] = {token, lp[token]};
    }
  }
  return out;
}

} // namespace

row_generator::row_generator(std::optional<uint64_t> seed)
    : generator_(at::make_generator<at::CPUGeneratorImpl>(seed ? *seed : next_default_seed())) {}

double row_generator::next_uniform() {
  const uint64_t bits = generator_.get<at::CPUGeneratorImpl>()->random64();
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

std::vector<sampled_token> sample_tokens(const at::Tensor& logits,
                                         const std::vector<const sampling_params*>& params,
                                         const std::vector<row_generator*>& generators) {
  if (!logits.defined() || logits.dim() != 2 ||
      logits.size(0) != static_cast<int64_t>(params.size()) ||
      params.size() != generators.size())
    fail(error_code::internal, "sample_tokens: " + std::to_string(params.size()) +
                                   " params and " + std::to_string(generators.size()) +
                                   " generators for logits of another row count");
  const auto a = static_cast<int64_t>(params.size());
  std::vector<sampled_token> out(static_cast<size_t>(a));
  if (a == 0)
    return out;
  if (logits.is_cuda())
    return sample_on_device(logits, params, generators);
  const int64_t vocab = logits.size(1);
  auto raw = logits.to(at::kDouble).contiguous();
  // Per-row temperatures (1 for greedy rows, whose log-probs are reported at temperature 1).
  auto temperature = at::empty({a, 1}, at::kDouble);
  auto t_acc = temperature.accessor<double, 2>();
  for (int64_t k = 0; k < a; ++k) {
    const double t = params[static_cast<size_t>(k)]->temperature;
    t_acc[k][0] = t > 0.0 ? t : 1.0;
  }
  auto log_probs = at::log_softmax(raw / temperature, 1).contiguous();
  double* lp = log_probs.data_ptr<double>();
  const double* raw_p = raw.data_ptr<double>();
  for (int64_t k = 0; k < a; ++k) {
    const auto& p = *params[static_cast<size_t>(k)];
    if (p.temperature > 0.0 && filters(p))
      filter_log_probs(lp + k * vocab, vocab, p.top_k, p.top_p);
  }
  // The log-prob reported for a row without top-k/top-p is the trainer's: fp32 log-softmax of
  // the fp32 logits divided by the temperature (logprobs.hpp), the same function on the same
  // numbers, so a batch-invariant engine and trainer report identical bits. Filtered rows
  // report the log-prob under the filtered distribution they sampled from.
  auto logits_fp32 = logits.to(at::kFloat);
  auto probs = log_probs.exp().contiguous();
  const double* pr = probs.data_ptr<double>();
  for (int64_t k = 0; k < a; ++k) {
    const auto& p = *params[static_cast<size_t>(k)];
    const int64_t token =
        p.temperature > 0.0
            ? inverse_cdf(pr + k * vocab, vocab, generators[static_cast<size_t>(k)]->next_uniform())
            : greedy_token(raw_p + k * vocab, vocab);
    const double logprob =
        p.temperature > 0.0 && filters(p)
            ? lp[k * vocab + token]
            : tempered_log_softmax(logits_fp32[k], p.temperature > 0.0 ? p.temperature : 1.0)[token]
                  .item<double>();
    out[static_cast<size_t>(k)] = {token, logprob};
  }
  return out;
}

std::vector<double> token_logprobs(const at::Tensor& logits, const std::vector<int64_t>& tokens) {
  if (!logits.defined() || logits.dim() != 2 ||
      logits.size(0) != static_cast<int64_t>(tokens.size()))
    fail(error_code::internal, "token_logprobs: " + std::to_string(tokens.size()) +
                                   " tokens for logits of another row count");
  // As the trainer scores targets (fp32 log-softmax of the fp32 logits), on the logits' device;
  // only the targets' entries come back.
  auto targets = at::tensor(tokens, at::kLong).to(logits.device()).unsqueeze(1);
  auto lp = tempered_log_softmax(logits.to(at::kFloat), 1.0)
                .gather(1, targets)
                .squeeze(1)
                .to(at::kCPU, at::kDouble)
                .contiguous();
  return std::vector<double>(lp.data_ptr<double>(), lp.data_ptr<double>() + lp.numel());
}

topk_logprobs top_token_logprobs(const at::Tensor& logits, int64_t k) {
  if (!logits.defined() || logits.dim() != 2 || k < 1 || k > logits.size(1))
    fail(error_code::internal, "top_token_logprobs: k = " + std::to_string(k) +
                                   " for logits that are not [R, vocab >= k]");
  auto lp = tempered_log_softmax(logits.to(at::kFloat), 1.0);
  // A stable descending sort keeps the lower id first among equal log-probs.
  auto sorted = lp.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
  auto values = std::get<0>(sorted).narrow(1, 0, k).to(at::kCPU, at::kDouble).contiguous();
  auto ids = std::get<1>(sorted).narrow(1, 0, k).to(at::kCPU, at::kLong).contiguous();
  topk_logprobs out;
  out.ids.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  out.logprobs.assign(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
  return out;
}

} // namespace rlforge::backends
