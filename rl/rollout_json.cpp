#include "rl/rollout_json.hpp"

#include <stdexcept>
#include <string>

#include "runtime/json_field.hpp"

namespace rlforge::rl {

namespace {

using nlohmann::json;

json request_json(const sample_request& r) {
  return {{"prompt", r.prompt},
          {"max_tokens", r.max_tokens},
          {"temperature", r.temperature},
          {"top_k", r.top_k},
          {"top_p", r.top_p},
          {"has_seed", r.has_seed},
          {"seed", r.seed},
          {"stop_token_ids", r.stop_token_ids},
          {"stop_strings", r.stop_strings},
          {"prompt_logprobs", r.prompt_logprobs},
          {"topk_prompt_logprobs", r.topk_prompt_logprobs},
          {"num_samples", r.num_samples},
          {"first_sample", r.first_sample},
          {"weight_version", r.weight_version}};
}

json sample_json(const sample_output& s) {
  return {{"tokens", s.tokens},
          {"logprobs", s.logprobs},
          {"stop_reason", s.stop_reason},
          {"prompt_logprobs", s.prompt_logprobs},
          {"token_versions", s.token_versions},
          {"topk_prompt_ids", s.topk_prompt_ids},
          {"topk_prompt_logprobs", s.topk_prompt_logprobs}};
}

json rollout_json(const rollout& r) {
  json samples = json::array();
  for (const auto& s : r.samples)
    samples.push_back(sample_json(s));
  return {{"id", r.id},
          {"request", request_json(r.request)},
          {"samples", samples},
          {"submissions", r.submissions}};
}

/// Member `key` of object `j` at `path`, converted to T; throws naming the path.
template <class T> T get(const json& j, const std::string& path, const char* key) {
  return runtime::json_field<T>(j, "rollout state", path, key);
}

/// As `get`, or `fallback` when `key` is absent (state written before the key existed).
template <class T> T get_or(const json& j, const std::string& path, const char* key, T fallback) {
  return j.is_object() && j.contains(key) ? get<T>(j, path, key) : fallback;
}

rollout rollout_of(const json& j, const std::string& path) {
  rollout r;
  r.id = get<int64_t>(j, path, "id");
  r.submissions = get<int64_t>(j, path, "submissions");
  auto q = get<json>(j, path, "request");
  auto qp = path + ".request";
  auto& req = r.request;
  req.prompt = get<std::vector<int64_t>>(q, qp, "prompt");
  req.max_tokens = get<int64_t>(q, qp, "max_tokens");
  req.temperature = get<double>(q, qp, "temperature");
  req.top_k = get<int64_t>(q, qp, "top_k");
  req.top_p = get<double>(q, qp, "top_p");
  req.has_seed = get<bool>(q, qp, "has_seed");
  req.seed = get<uint64_t>(q, qp, "seed");
  req.stop_token_ids = get<std::vector<int64_t>>(q, qp, "stop_token_ids");
  req.stop_strings = get<std::vector<std::string>>(q, qp, "stop_strings");
  req.prompt_logprobs = get<bool>(q, qp, "prompt_logprobs");
  req.topk_prompt_logprobs = get_or<int64_t>(q, qp, "topk_prompt_logprobs", 0);
  req.num_samples = get<int64_t>(q, qp, "num_samples");
  req.first_sample = get<int64_t>(q, qp, "first_sample");
  req.weight_version = get<int64_t>(q, qp, "weight_version");
  auto samples = get<json>(j, path, "samples");
  if (!samples.is_array())
    throw std::invalid_argument("rollout state: " + path + ".samples is not an array");
  for (size_t i = 0; i < samples.size(); ++i) {
    auto sp = path + ".samples[" + std::to_string(i) + "]";
    sample_output s;
    s.tokens = get<std::vector<int64_t>>(samples[i], sp, "tokens");
    s.logprobs = get<std::vector<double>>(samples[i], sp, "logprobs");
    s.stop_reason = get<std::string>(samples[i], sp, "stop_reason");
    s.prompt_logprobs = get<std::vector<double>>(samples[i], sp, "prompt_logprobs");
    s.token_versions = get<std::vector<int64_t>>(samples[i], sp, "token_versions");
    s.topk_prompt_ids = get_or<std::vector<int64_t>>(samples[i], sp, "topk_prompt_ids", {});
    s.topk_prompt_logprobs =
        get_or<std::vector<double>>(samples[i], sp, "topk_prompt_logprobs", {});
    r.samples.push_back(std::move(s));
  }
  return r;
}

std::vector<rollout> rollouts_of(const json& j, const char* key) {
  auto list = get<json>(j, "state", key);
  if (!list.is_array())
    throw std::invalid_argument(std::string{"rollout state: state."} + key + " is not an array");
  std::vector<rollout> out;
  for (size_t i = 0; i < list.size(); ++i)
    out.push_back(rollout_of(list[i], std::string{"state."} + key + "[" + std::to_string(i) + "]"));
  return out;
}

} // namespace

json to_json(const rollout_state& s) {
  json waiting = json::array(), done = json::array();
  for (const auto& r : s.waiting)
    waiting.push_back(rollout_json(r));
  for (const auto& r : s.done)
    done.push_back(rollout_json(r));
  return {{"waiting", waiting},         {"done", done},
          {"taken", s.taken},           {"dropped", s.dropped},
          {"requeued", s.requeued},     {"staleness_counts", s.staleness_counts}};
}

rollout_state rollout_state_from_json(const json& j) {
  if (!j.is_object())
    throw std::invalid_argument("rollout state: expected a JSON object, got " +
                                std::string{j.type_name()});
  rollout_state s;
  s.waiting = rollouts_of(j, "waiting");
  s.done = rollouts_of(j, "done");
  s.taken = get<int64_t>(j, "state", "taken");
  s.dropped = get<int64_t>(j, "state", "dropped");
  s.requeued = get<int64_t>(j, "state", "requeued");
  s.staleness_counts = get<std::vector<int64_t>>(j, "state", "staleness_counts");
  for (auto c : s.staleness_counts)
    if (c < 0)
      throw std::invalid_argument("rollout state: state.staleness_counts has a negative count");
  if (s.taken < 0 || s.dropped < 0 || s.requeued < 0)
    throw std::invalid_argument("rollout state: a negative count in taken, dropped or requeued");
  return s;
}

} // namespace rlforge::rl
