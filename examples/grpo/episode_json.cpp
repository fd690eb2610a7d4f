#include "examples/grpo/episode_json.hpp"

#include <stdexcept>
#include <string>

#include "runtime/json_field.hpp"

namespace rlforge::examples::grpo {

namespace {

using nlohmann::json;

json episode_json(const episode_sample& e) {
  return {{"prompt", e.prompt},
          {"response", e.response},
          {"sampled", e.sampled},
          {"logprobs", e.logprobs},
          {"versions", e.versions},
          {"reward", e.reward},
          {"turns", e.turns},
          {"done", e.done},
          {"stopped", e.stopped},
          {"error", e.error ? json(*e.error) : json(nullptr)}};
}

json group_json(const episode_group& g) {
  json episodes = json::array();
  for (const auto& e : g.episodes)
    episodes.push_back(episode_json(e));
  return {{"id", g.id},
          {"seed", g.request.seed ? json(*g.request.seed) : json(nullptr)},
          {"task", g.request.task},
          {"episodes", episodes}};
}

/// Member `key` of object `j` at `path`, converted to T; throws naming the path.
template <class T> T get(const json& j, const std::string& path, const char* key) {
  return runtime::json_field<T>(j, "episode state", path, key);
}

const json& array_at(const json& j, const std::string& path, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j.at(key).is_array())
    throw std::invalid_argument("episode state: " + path + "." + key + " must be an array");
  return j.at(key);
}

episode_sample episode_from_json(const json& j, const std::string& path) {
  episode_sample e;
  e.prompt = get<std::vector<int64_t>>(j, path, "prompt");
  e.response = get<std::vector<int64_t>>(j, path, "response");
  e.sampled = get<std::vector<float>>(j, path, "sampled");
  e.logprobs = get<std::vector<double>>(j, path, "logprobs");
  e.versions = get<std::vector<int64_t>>(j, path, "versions");
  for (auto n : {e.sampled.size(), e.logprobs.size(), e.versions.size()})
    if (n != e.response.size())
      throw std::invalid_argument("episode state: " + path + " has " +
                                  std::to_string(e.response.size()) +
                                  " response tokens but per-token lists of " + std::to_string(n));
  e.reward = get<double>(j, path, "reward");
  e.turns = get<int>(j, path, "turns");
  e.done = get<bool>(j, path, "done");
  e.stopped = get<bool>(j, path, "stopped");
  if (!j.contains("error"))
    throw std::invalid_argument("episode state: " + path + ".error is missing");
  if (!j.at("error").is_null())
    e.error = get<std::string>(j, path, "error");
  return e;
}

episode_group group_from_json(const json& j, const std::string& path) {
  episode_group g;
  g.id = get<int64_t>(j, path, "id");
  if (!j.is_object() || !j.contains("seed"))
    throw std::invalid_argument("episode state: " + path + ".seed is missing");
  if (!j.at("seed").is_null())
    g.request.seed = get<int64_t>(j, path, "seed");
  g.request.task = get<json>(j, path, "task");
  const auto& episodes = array_at(j, path, "episodes");
  for (size_t i = 0; i < episodes.size(); ++i)
    g.episodes.push_back(
        episode_from_json(episodes[i], path + ".episodes[" + std::to_string(i) + "]"));
  return g;
}

} // namespace

json to_json(const producer_state& s) {
  json unfinished = json::array(), finished = json::array();
  for (const auto& g : s.unfinished)
    unfinished.push_back(group_json(g));
  for (const auto& g : s.finished)
    finished.push_back(group_json(g));
  return {{"unfinished", unfinished},
          {"finished", finished},
          {"taken", s.totals.taken},
          {"dropped", s.totals.dropped},
          {"staleness_counts", s.totals.staleness_counts}};
}

producer_state producer_state_from_json(const json& j) {
  producer_state s;
  if (!j.is_object())
    throw std::invalid_argument("episode state: not a JSON object");
  for (const char* part : {"unfinished", "finished"}) {
    const auto& groups = array_at(j, "state", part);
    auto& out = std::string{part} == "unfinished" ? s.unfinished : s.finished;
    for (size_t i = 0; i < groups.size(); ++i)
      out.push_back(group_from_json(groups[i], std::string{"state."} + part + "[" +
                                                   std::to_string(i) + "]"));
  }
  s.totals.taken = get<int64_t>(j, "state", "taken");
  s.totals.dropped = get<int64_t>(j, "state", "dropped");
  s.totals.staleness_counts = get<std::vector<int64_t>>(j, "state", "staleness_counts");
  return s;
}

} // namespace rlforge::examples::grpo
