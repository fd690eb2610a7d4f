#include "strings/format.hpp"
#include "tinker/datum_check.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "tinker/error.hpp"

namespace rlforge::tinker {

namespace {

using strings::join;
using strings::number_text;
using strings::shape_text;

void check_id(int64_t id, const model_limits& limits, const std::string& what) {
  if (id < 0)
    fail_user(what + " = " + std::to_string(id) + " is a negative token id");
  if (limits.vocab_size > 0 && id >= limits.vocab_size)
    fail_user(what + " = " + std::to_string(id) + " is outside the vocabulary [0, " +
              std::to_string(limits.vocab_size) + ")");
}

} // namespace

checked_request check_request(const forward_backward_request& request, model_role role,
                              const model_limits& limits, const std::string& where) {
  checked_request out;
  try {
    out.loss_ = resolve_loss(request.loss_fn, request.loss_fn_config, role);
  } catch (const request_error& e) {
    fail_user(where + ": " + e.what());
  }
  check_datums(request.data, out.loss_, limits, where);
  out.model_id_ = request.model_id;
  out.data_ = request.data;
  out.forward_only_ = request.forward_only;
  return out;
}

checked_request checked_request::slice(size_t begin, size_t end) const {
  checked_request out;
  out.model_id_ = model_id_;
  out.loss_ = loss_;
  out.forward_only_ = forward_only_;
  end = std::min(end, data_.size());
  if (begin < end)
    out.data_.assign(data_.begin() + static_cast<std::ptrdiff_t>(begin),
                     data_.begin() + static_cast<std::ptrdiff_t>(end));
  return out;
}

void check_datums(const std::vector<datum>& data, const resolved_loss& loss,
                  const model_limits& limits, const std::string& where) {
  if (data.empty())
    fail_user(where + ": no data; send at least one datum");
  const auto& known = loss_input_names();
  for (size_t i = 0; i < data.size(); ++i) {
    const auto& d = data[i];
    const std::string at = where + " datum " + std::to_string(i);
    const auto n = static_cast<int64_t>(d.tokens.size());
    if (n == 0)
      fail_user(at + ": model_input has no tokens");
    if (limits.max_context_length > 0 && n + 1 > limits.max_context_length)
      fail_user(at + ": " + std::to_string(n) +
                " input tokens and the last target do not fit "
                "the context of " +
                std::to_string(limits.max_context_length) + " tokens");
    for (int64_t k = 0; k < n; ++k)
      check_id(d.tokens[k], limits, at + ": model_input token " + std::to_string(k));
    for (const auto& [name, t] : d.loss_fn_inputs)
      if (std::find(known.begin(), known.end(), name) == known.end())
        fail_user(at + ": unknown loss_fn_inputs entry '" + name + "'; accepted: " + join(known));
    for (const auto& need : loss.required_inputs)
      if (!d.loss_fn_inputs.count(need))
        fail_user(at + ": loss_fn_inputs lacks '" + need + "', which loss '" + loss.tinker_name +
                  "' needs");
    for (const auto& [name, t] : d.loss_fn_inputs) {
      const std::string in = at + " loss_fn_inputs." + name;
      const bool target = name == "target_tokens";
      if (target == is_floating(t.type))
        fail_user(in + ": dtype " + to_string(t.type) + " is not accepted (expected " +
                  (target ? "int64 or int32" : "float32 or bfloat16") + ")");
      const size_t count = target ? t.ints.size() : t.floats.size();
      if (t.shape.size() != 1 || t.shape[0] != n || count != static_cast<size_t>(n))
        fail_user(in + ": shape " + shape_text(t.shape) + " with " + std::to_string(count) +
                  " values; expected [" + std::to_string(n) +
                  "], one value per model_input "
                  "token");
      for (size_t k = 0; k < t.ints.size(); ++k)
        check_id(t.ints[k], limits, in + "[" + std::to_string(k) + "]");
      for (size_t k = 0; k < t.floats.size(); ++k) {
        const double v = t.floats[k];
        if (!std::isfinite(v))
          fail_user(in + "[" + std::to_string(k) + "] is not finite (" + number_text(v) + ")");
      }
    }
  }
}

void check_sample(const sample_request& r, const model_limits& limits, const std::string& where) {
  const auto& p = r.params;
  const auto n = static_cast<int64_t>(r.prompt.size());
  if (n == 0)
    fail_user(where + ": empty prompt");
  for (int64_t k = 0; k < n; ++k)
    check_id(r.prompt[k], limits, where + ": prompt token " + std::to_string(k));
  if (r.num_samples < 1)
    fail_user(where + ": num_samples must be >= 1, got " + std::to_string(r.num_samples));
  if (r.first_sample < 0)
    fail_user(where + ": first_sample must be >= 0, got " + std::to_string(r.first_sample));
  if (p.max_tokens < 1)
    fail_user(where + ": max_tokens must be >= 1, got " + std::to_string(p.max_tokens));
  if (limits.max_context_length > 0 && n + p.max_tokens > limits.max_context_length)
    fail_user(where + ": a prompt of " + std::to_string(n) + " tokens plus max_tokens " +
              std::to_string(p.max_tokens) + " exceeds the model's context of " +
              std::to_string(limits.max_context_length) + " tokens; lower max_tokens to at most " +
              std::to_string(std::max<int64_t>(limits.max_context_length - n, 0)));
  if (!std::isfinite(p.temperature) || p.temperature < 0)
    fail_user(where + ": temperature must be finite and >= 0, got " + number_text(p.temperature));
  if (!(p.top_p > 0 && p.top_p <= 1))
    fail_user(where + ": top_p must be in (0, 1], got " + number_text(p.top_p));
  if (p.top_k != -1 && p.top_k < 1)
    fail_user(where + ": top_k must be -1 (off) or >= 1, got " + std::to_string(p.top_k));
  if (p.has_seed && p.seed < 0)
    fail_user(where + ": seed must be >= 0, got " + std::to_string(p.seed));
  for (size_t k = 0; k < p.stop_tokens.size(); ++k)
    check_id(p.stop_tokens[k], limits, where + ": stop token " + std::to_string(k));
  for (size_t k = 0; k < p.stop_strings.size(); ++k)
    if (p.stop_strings[k].empty())
      fail_user(where + ": stop string " + std::to_string(k) + " is empty");
  if (r.topk_prompt_logprobs < 0 || r.topk_prompt_logprobs > limits.vocab_size)
    fail_user(where + ": topk_prompt_logprobs must be in 0.." + std::to_string(limits.vocab_size) +
              " (0 = off, at most the vocabulary size), got " +
              std::to_string(r.topk_prompt_logprobs));
  if (!r.generated.empty()) {
    if (r.num_samples != 1)
      fail_user(where + ": a continuation (generated tokens) needs num_samples 1, got " +
                std::to_string(r.num_samples));
    if (static_cast<int64_t>(r.generated.size()) >= p.max_tokens)
      fail_user(where + ": a continuation of " + std::to_string(r.generated.size()) +
                " tokens leaves nothing to generate under max_tokens " +
                std::to_string(p.max_tokens));
    for (size_t k = 0; k < r.generated.size(); ++k)
      check_id(r.generated[k], limits, where + ": continuation token " + std::to_string(k));
  }
}

} // namespace rlforge::tinker
