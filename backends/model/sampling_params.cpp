#include "backends/model/sampling_params.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "backends/error.hpp"

namespace rlforge::backends {
namespace {

constexpr double neg_inf = -std::numeric_limits<double>::infinity();

std::string show(double x) {
  std::ostringstream out;
  out.precision(10);
  out << x;
  return out.str();
}

[[noreturn]] void bad(const std::string& what) {
  fail(error_code::invalid_argument, "sampling_params: " + what);
}

// log(sum(exp(x))) over the finite entries of `ids`; -inf when none is finite.
double log_sum_exp(const double* x, const std::vector<int64_t>& ids, size_t n) {
  double m = neg_inf;
  for (size_t i = 0; i < n; ++i)
    m = std::max(m, x[ids[i]]);
  if (m == neg_inf)
    return neg_inf;
  double s = 0.0;
  for (size_t i = 0; i < n; ++i)
    s += std::exp(x[ids[i]] - m);
  return m + std::log(s);
}

} // namespace

namespace {

uint64_t splitmix64(uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

} // namespace

uint64_t sample_seed(uint64_t seed, uint64_t sample_index) noexcept {
  // Two rounds: the index is mixed on its own before it meets the mixed seed, so no linear
  // relation between (seed, index) pairs survives.
  return splitmix64(splitmix64(seed) ^ splitmix64(sample_index ^ 0x6A09E667F3BCC909ull));
}

void validate(const sampling_params& p, int64_t vocab_size) {
  if (p.max_tokens <= 0)
    bad("max_tokens must be >= 1, got " + std::to_string(p.max_tokens));
  if (!std::isfinite(p.temperature) || p.temperature < 0.0)
    bad("temperature must be a finite number >= 0, got " + show(p.temperature));
  if (p.top_k == 0 || p.top_k < -1)
    bad("top_k must be -1 (off) or >= 1, got " + std::to_string(p.top_k));
  if (!(p.top_p > 0.0 && p.top_p <= 1.0))
    bad("top_p must be in (0, 1], got " + show(p.top_p));
  for (int64_t id : p.stop_token_ids)
    if (id < 0 || id >= vocab_size)
      bad("stop token id " + std::to_string(id) + " is outside the vocabulary [0, " +
          std::to_string(vocab_size) + ")");
  for (size_t i = 0; i < p.stop_strings.size(); ++i)
    if (p.stop_strings[i].empty())
      bad("stop string " + std::to_string(i) + " is empty");
  if (!p.stop_strings.empty() && !p.tokenizer)
    bad("stop strings need the model's tokenizer, and none was given");
  if (p.topk_prompt_logprobs < 0 || p.topk_prompt_logprobs > vocab_size)
    bad("topk_prompt_logprobs must be in 0.." + std::to_string(vocab_size) +
        " (the vocabulary size), got " + std::to_string(p.topk_prompt_logprobs));
}

void filter_log_probs(double* log_probs, int64_t vocab_size, int64_t top_k, double top_p) {
  if (vocab_size <= 0)
    fail(error_code::invalid_argument,
         "filter_log_probs: vocab_size must be >= 1, got " + std::to_string(vocab_size));
  if (top_k == 0 || top_k < -1)
    bad("top_k must be -1 (off) or >= 1, got " + std::to_string(top_k));
  if (!(top_p > 0.0 && top_p <= 1.0))
    bad("top_p must be in (0, 1], got " + show(top_p));
  const bool use_k = top_k > 0 && top_k < vocab_size;
  const bool use_p = top_p < 1.0;
  if (!use_k && !use_p)
    return;
  std::vector<int64_t> order(static_cast<size_t>(vocab_size));
  std::iota(order.begin(), order.end(), int64_t{0});
  // More likely first; equal values by ascending id, so the cut is deterministic.
  auto before = [log_probs](int64_t a, int64_t b) {
    return log_probs[a] > log_probs[b] || (log_probs[a] == log_probs[b] && a < b);
  };
  size_t kept = order.size();
  if (use_k) {
    kept = static_cast<size_t>(top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept), order.end(),
                      before);
  }
  double lse = log_sum_exp(log_probs, order, kept);
  if (use_p && lse != neg_inf) {
    // Only the most likely prefix needs ordering: sort a window of the candidates and widen it
    // (x8) until its cumulative probability reaches top_p. Peaked distributions stop early;
    // the result equals a full sort's because `before` is a strict total order.
    size_t sorted = use_k ? kept : 0;
    size_t prefix = kept;
    double cumulative = 0.0;
    size_t i = 0;
    bool reached = false;
    while (!reached && i < kept) {
      if (i == sorted) {
        const size_t window = std::min(kept, std::max<size_t>(256, sorted * 8));
        // Elements before `sorted` are already the largest, in order; sort what follows.
        std::partial_sort(order.begin() + static_cast<std::ptrdiff_t>(sorted),
                          order.begin() + static_cast<std::ptrdiff_t>(window),
                          order.begin() + static_cast<std::ptrdiff_t>(kept), before);
        sorted = window;
      }
      for (; i < sorted; ++i) {
        cumulative += std::exp(log_probs[order[i]] - lse);
        if (cumulative >= top_p) {
          prefix = i + 1;
          reached = true;
          break;
        }
      }
    }
    kept = prefix;
    lse = log_sum_exp(log_probs, order, kept);
  }
  std::vector<double> out(static_cast<size_t>(vocab_size), neg_inf);
  for (size_t i = 0; i < kept; ++i)
    out[order[i]] = log_probs[order[i]] - lse;
  std::copy(out.begin(), out.end(), log_probs);
}

std::vector<double> sampling_log_probs(const std::vector<float>& logits, const sampling_params& p) {
  if (logits.empty())
    fail(error_code::invalid_argument, "sampling_log_probs: empty logits row");
  if (!(p.temperature > 0.0) || !std::isfinite(p.temperature))
    bad("sampling_log_probs needs temperature > 0, got " + show(p.temperature));
  const auto n = static_cast<int64_t>(logits.size());
  std::vector<double> z(logits.size());
  double m = neg_inf;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]))
      fail(error_code::invalid_argument,
           "sampling_log_probs: logit " + std::to_string(i) + " is NaN");
    z[i] = static_cast<double>(logits[i]) / p.temperature;
    m = std::max(m, z[i]);
  }
  if (m == neg_inf)
    fail(error_code::invalid_argument, "sampling_log_probs: every logit is -inf");
  double s = 0.0;
  for (double v : z)
    s += std::exp(v - m);
  const double lse = m + std::log(s);
  for (double& v : z)
    v -= lse;
  filter_log_probs(z.data(), n, p.top_k, p.top_p);
  return z;
}

int64_t inverse_cdf(const double* probs, int64_t vocab_size, double u) {
  if (!(u >= 0.0 && u < 1.0))
    fail(error_code::invalid_argument, "inverse_cdf: u must be in [0, 1), got " + show(u));
  double total = 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < vocab_size; ++i) {
    if (probs[i] > 0.0) {
      total += probs[i];
      last = i;
    }
  }
  if (last < 0)
    fail(error_code::invalid_argument, "inverse_cdf: no token has positive probability");
  const double target = u * total;
  double cumulative = 0.0;
  for (int64_t i = 0; i < last; ++i) {
    if (probs[i] > 0.0) {
      cumulative += probs[i];
      if (cumulative > target)
        return i;
    }
  }
  // Rounding can leave the target just above the sum of all but the last token.
  return last;
}

int64_t greedy_token(const double* values, int64_t vocab_size) {
  if (vocab_size <= 0)
    fail(error_code::invalid_argument,
         "greedy_token: vocab_size must be >= 1, got " + std::to_string(vocab_size));
  int64_t best = 0;
  for (int64_t i = 1; i < vocab_size; ++i)
    if (values[i] > values[best])
      best = i;
  return best;
}

} // namespace rlforge::backends
