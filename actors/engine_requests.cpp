#include "actors/engine_requests.hpp"

#include "actors/engine_weights.hpp"
#include "backends/error.hpp"
#include "backends/model/sampling_params.hpp"

namespace rlforge::actors {

namespace be = rlforge::backends;
using be::error_code;

std::vector<be::engine_request> check_requests(const std::vector<sample_request>& requests,
                                               const be::continuous_engine& engine,
                                               const engine_weights& weights,
                                               const engine_tokenizer& tok,
                                               const std::string& op) {
  if (requests.empty())
    be::fail(error_code::invalid_argument, op + ": no requests");
  std::vector<be::engine_request> out;
  out.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    const auto where = op + ": request " + std::to_string(i) + ": ";
    if (r.weight_version < 0)
      be::fail(error_code::invalid_argument,
               where + "weight_version must be >= 0, got " + std::to_string(r.weight_version));
    if (r.num_samples < 1)
      be::fail(error_code::invalid_argument,
               where + "num_samples must be >= 1, got " + std::to_string(r.num_samples));
    if (r.first_sample < 0)
      be::fail(error_code::invalid_argument,
               where + "first_sample must be >= 0, got " + std::to_string(r.first_sample));
    if (!r.generated.empty() && r.num_samples != 1)
      be::fail(error_code::invalid_argument,
               where + "a continuation (generated tokens) needs num_samples 1, got " +
                   std::to_string(r.num_samples));
    for (size_t k = 0; k < r.stop_strings.size(); ++k)
      if (r.stop_strings[k].empty())
        be::fail(error_code::invalid_argument,
                 where + "stop string " + std::to_string(k) + " is empty");
    if (!r.stop_strings.empty() && !tok.tokenizer)
      be::fail(error_code::invalid_argument,
               where + "stop strings need the model's tokenizer; " + tok.missing);
    be::engine_request e;
    e.prompt = r.prompt;
    e.params.max_tokens = r.max_tokens;
    e.params.temperature = r.temperature;
    e.params.top_k = r.top_k;
    e.params.top_p = r.top_p;
    e.params.stop_token_ids = r.stop_token_ids;
    if (!r.stop_strings.empty()) {
      e.params.stop_strings = r.stop_strings;
      e.params.tokenizer = tok.tokenizer;
    }
    e.params.prompt_logprobs = r.prompt_logprobs;
    e.params.topk_prompt_logprobs = r.topk_prompt_logprobs;
    for (int64_t j = 0; j < r.num_samples; ++j)
      e.seeds.push_back(r.has_seed ? std::optional<uint64_t>(be::sample_seed(
                                         r.seed, static_cast<uint64_t>(r.first_sample + j)))
                                   : std::nullopt);
    if (!r.generated.empty())
      e.generated.push_back(r.generated);
    e.key = r.weight_version;
    try {
      engine.check(e);
    } catch (const be::error& err) {
      be::fail(err.code(), where + err.what());
    }
    if (!weights.available(r.weight_version))
      be::fail(error_code::not_found,
               where + "weights version " + std::to_string(r.weight_version) +
                   " are no longer held by this engine (it holds version " +
                   std::to_string(weights.current()) + " and keeps the " +
                   std::to_string(weights.max_retained()) +
                   " most recently used retained versions)");
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<sample_output> to_outputs(be::engine_output&& out) {
  std::vector<sample_output> rows;
  rows.reserve(out.samples.size());
  for (auto& s : out.samples)
    rows.push_back({std::move(s.tokens), std::move(s.logprobs), std::move(s.stop_reason),
                    out.prompt_logprobs, std::move(s.versions), out.topk_prompt_ids,
                    out.topk_prompt_logprobs});
  return rows;
}

} // namespace rlforge::actors
