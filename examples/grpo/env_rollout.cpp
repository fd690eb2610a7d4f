#include "examples/grpo/env_rollout.hpp"

#include <algorithm>
#include <exception>
#include <stdexcept>

namespace rlforge::examples::grpo {

namespace {

using json = nlohmann::ordered_json;

json message(const char* role, const std::string& content) {
  return json{{"role", role}, {"content", content}};
}

} // namespace

int64_t episode_sample::oldest_version() const {
  int64_t oldest = -1;
  for (size_t t = 0; t < versions.size(); ++t)
    if (sampled[t] == 1.0f && versions[t] >= 0 && (oldest < 0 || versions[t] < oldest))
      oldest = versions[t];
  return oldest;
}

std::vector<int64_t> stop_ids(const prompt::chat_prompt& chat) {
  if (auto eot = chat.end_of_turn_id())
    return {*eot};
  return {};
}

std::vector<episode_sample> run_rollout(env::environment_pool& pool,
                                        const std::vector<env::reset_request>& requests,
                                        const prompt::chat_prompt& chat,
                                        const turn_generator& generate,
                                        const rollout_options& options) {
  const size_t n = requests.size();
  std::vector<episode_sample> out(n);
  std::vector<json> history(n, json::array());
  std::vector<bool> ended_with_eot(n, false);
  env::episode_batch batch(pool, requests);
  // Fails episode i on the driver's side (its environment goes back to the pool).
  auto fail = [&](size_t i, const std::string& why) {
    out[i].error = why;
    if (!batch.episodes()[i].done && !batch.episodes()[i].error && !batch.episodes()[i].stopped)
      batch.stop(i);
  };
  for (size_t i = 0; i < n; ++i) {
    const auto& rec = batch.episodes()[i];
    if (rec.error) {
      out[i].error = rec.error->what();
      continue;
    }
    history[i].push_back(message("user", rec.start.observation));
    try {
      out[i].prompt = chat.encode(history[i], true);
    } catch (const std::exception& e) {
      fail(i, std::string("the first observation cannot be made a prompt: ") + e.what());
      continue;
    }
    if (static_cast<int64_t>(out[i].prompt.size()) >= options.context)
      fail(i, "the first prompt takes " + std::to_string(out[i].prompt.size()) +
                  " tokens; the model's context is " + std::to_string(options.context));
  }
  const auto eot = chat.end_of_turn_id();
  for (auto running = batch.running(); !running.empty(); running = batch.running()) {
    std::vector<turn_request> turns;
    std::vector<size_t> sampled_for;
    for (size_t i : running) {
      auto& s = out[i];
      const int64_t used = static_cast<int64_t>(s.prompt.size() + s.response.size());
      if (s.turns >= options.max_turns || used >= options.context) {
        s.stopped = true;
        batch.stop(i);
        continue;
      }
      turn_request t;
      t.prompt = s.prompt;
      t.prompt.insert(t.prompt.end(), s.response.begin(), s.response.end());
      t.max_tokens = std::min(options.turn_tokens, options.context - used);
      turns.push_back(std::move(t));
      sampled_for.push_back(i);
    }
    if (turns.empty())
      continue;
    const auto sampled = generate(turns);
    if (sampled.size() != turns.size())
      throw std::runtime_error("the turn generator answered " + std::to_string(sampled.size()) +
                               " of " + std::to_string(turns.size()) + " turns");
    for (const auto& turn : sampled)
      if ((!turn.logprobs.empty() && turn.logprobs.size() != turn.ids.size()) ||
          (!turn.versions.empty() && turn.versions.size() != turn.ids.size()))
        throw std::runtime_error("the turn generator answered " +
                                 std::to_string(turn.ids.size()) + " ids with " +
                                 std::to_string(turn.logprobs.size()) + " log-probs and " +
                                 std::to_string(turn.versions.size()) + " versions");
    std::vector<std::string> actions(n);
    for (size_t k = 0; k < sampled_for.size(); ++k) {
      const size_t i = sampled_for[k];
      const auto& turn = sampled[k];
      const auto& ids = turn.ids;
      ended_with_eot[i] = eot && !ids.empty() && ids.back() == *eot;
      std::vector<int64_t> body(ids.begin(), ids.end() - (ended_with_eot[i] ? 1 : 0));
      actions[i] = chat.decode_generated(body, /*skip_special_tokens=*/true);
      auto& s = out[i];
      s.response.insert(s.response.end(), ids.begin(), ids.end());
      s.sampled.insert(s.sampled.end(), ids.size(), 1.0f);
      if (turn.logprobs.empty())
        s.logprobs.insert(s.logprobs.end(), ids.size(), 0.0);
      else
        s.logprobs.insert(s.logprobs.end(), turn.logprobs.begin(), turn.logprobs.end());
      if (turn.versions.empty())
        s.versions.insert(s.versions.end(), ids.size(), int64_t{-1});
      else
        s.versions.insert(s.versions.end(), turn.versions.begin(), turn.versions.end());
      history[i].push_back(message("assistant", actions[i]));
    }
    batch.step(actions);
    for (size_t i : sampled_for) {
      const auto& rec = batch.episodes()[i];
      auto& s = out[i];
      s.turns = static_cast<int>(rec.turns.size());
      if (rec.error) {
        s.error = rec.error->what();
        continue;
      }
      if (rec.done)
        continue;
      // The template's end of the turn, the observation as a user message and the next
      // generation prompt; trained on never (0 in `sampled`).
      const auto observation = message("user", rec.turns.back().result.observation);
      try {
        const auto next = chat.continuation(history[i], ended_with_eot[i], observation);
        s.response.insert(s.response.end(), next.begin(), next.end());
        s.sampled.insert(s.sampled.end(), next.size(), 0.0f);
        s.logprobs.insert(s.logprobs.end(), next.size(), 0.0);
        s.versions.insert(s.versions.end(), next.size(), int64_t{-1});
        history[i].push_back(observation);
      } catch (const std::exception& e) {
        fail(i, std::string("the chat template cannot continue the conversation: ") + e.what());
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& rec = batch.episodes()[i];
    auto& s = out[i];
    s.reward = rec.total_reward;
    s.done = rec.done;
    s.turns = static_cast<int>(rec.turns.size());
    // What follows the last sampled turn (the wrapping of an observation the model never
    // answered) is not part of the episode's training row.
    size_t keep = s.sampled.size();
    while (keep > 0 && s.sampled[keep - 1] == 0.0f)
      --keep;
    s.response.resize(keep);
    s.sampled.resize(keep);
    s.logprobs.resize(keep);
    s.versions.resize(keep);
  }
  return out;
}

} // namespace rlforge::examples::grpo
