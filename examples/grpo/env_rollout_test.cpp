// examples/grpo/env_rollout.hpp: multi-turn episodes on the guessing game (in C++ and as the
// Python example), with a scripted generator standing in for the engines.
#include "examples/grpo/env_rollout.hpp"

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "chat/template_renderer.hpp"
#include "env/in_process_environment.hpp"
#include "env/number_guess.hpp"
#include "text/model_tokenizer.hpp"

namespace rlforge::examples::grpo {
namespace {

using json = nlohmann::ordered_json;
using testing::HasSubstr;

/// The tokenizer and ChatML template init-model writes for a model of `vocab` ids.
prompt::chat_prompt model_chat(size_t vocab = 512) {
  const auto files = text::train_model_tokenizer(vocab);
  return prompt::chat_prompt(
      text::tokenizer::from_json(files.tokenizer_json, files.tokenizer_config_json),
      chat::template_renderer::from_tokenizer_config_json(
          json::parse(files.tokenizer_config_json)));
}

env::environment_pool guessing_pool(size_t n) {
  return env::environment_pool([] { return std::make_unique<env::number_guess>(); }, n);
}

env::reset_request task(const json& t) {
  env::reset_request r;
  r.task = t;
  return r;
}

/// A generator that answers every turn with `text` (and the end-of-turn token unless `cut`),
/// recording what it was asked.
struct scripted {
  scripted(const prompt::chat_prompt& c, std::string t, bool cut_turns = false)
      : chat(c), text(std::move(t)), cut(cut_turns) {}

  const prompt::chat_prompt& chat;
  std::string text;
  bool cut;
  std::vector<std::vector<turn_request>> calls;

  turn_generator fn() {
    return [this](const std::vector<turn_request>& turns) {
      calls.push_back(turns);
      std::vector<sampled_turn> out;
      for (const auto& t : turns) {
        auto ids = chat.tokenizer().encode(text, false);
        if (!cut)
          ids.push_back(*chat.end_of_turn_id());
        if (static_cast<int64_t>(ids.size()) > t.max_tokens)
          ids.resize(static_cast<size_t>(t.max_tokens));
        // Behaviour log-probs and versions that name the call and the position.
        sampled_turn turn{ids, {}, {}};
        for (size_t k = 0; k < ids.size(); ++k) {
          turn.logprobs.push_back(-0.5 * static_cast<double>(k + 1));
          turn.versions.push_back(static_cast<int64_t>(calls.size()));
        }
        out.push_back(std::move(turn));
      }
      return out;
    };
  }
};

std::vector<int64_t> concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int count_sampled(const episode_sample& s) {
  int n = 0;
  for (float x : s.sampled)
    n += x == 1.0f ? 1 : 0;
  return n;
}

TEST(EnvRollout, RunsEachEpisodeToItsEndKeepingTheSampledTokens) {
  const auto chat = model_chat();
  auto pool = guessing_pool(3);
  scripted gen{chat, "I guess 50"};
  rollout_options o;
  o.max_turns = 3;
  const auto out = run_rollout(
      pool,
      {task({{"secret", 50}}), task({{"secret", 70}, {"max_turns", 2}}), task({{"secret", 10}})},
      chat, gen.fn(), o);
  ASSERT_EQ(out.size(), 3u);
  const auto turn = concat(chat.tokenizer().encode("I guess 50", false), {*chat.end_of_turn_id()});

  // Named at once: done, rewarded, one turn of sampled tokens.
  EXPECT_TRUE(out[0].done && !out[0].error && !out[0].stopped);
  EXPECT_EQ(out[0].reward, 1.0);
  EXPECT_EQ(out[0].turns, 1);
  EXPECT_EQ(out[0].response, turn);
  EXPECT_EQ(count_sampled(out[0]), static_cast<int>(turn.size()));

  // The environment's own limit: two turns, the observation between them in the template's
  // layout, never trained on; the tokens are exactly the rendered conversation.
  EXPECT_TRUE(out[1].done && !out[1].stopped);
  EXPECT_EQ(out[1].reward, 0.0);
  EXPECT_EQ(out[1].turns, 2);
  EXPECT_EQ(count_sampled(out[1]), 2 * static_cast<int>(turn.size()));
  EXPECT_EQ(out[1].sampled.size(), out[1].response.size());
  EXPECT_EQ(out[1].sampled.back(), 1.0f);
  const json conversation = json::array(
      {{{"role", "user"},
        {"content", "I am thinking of a number between 1 and 100. You have 2 guesses. Answer "
                    "with a number."}},
       {{"role", "assistant"}, {"content", "I guess 50"}},
       {{"role", "user"}, {"content", "Higher than 50."}},
       {{"role", "assistant"}, {"content", "I guess 50"}}});
  EXPECT_EQ(chat.tokenizer().decode(concat(out[1].prompt, out[1].response)) + "\n",
            chat.render(conversation, false));
  // Each sampled token keeps the log-prob and version its turn was sampled with (the scripted
  // generator tags round k with version k); the observation's tokens have none.
  ASSERT_EQ(out[1].logprobs.size(), out[1].response.size());
  ASSERT_EQ(out[1].versions.size(), out[1].response.size());
  EXPECT_EQ(out[1].versions.front(), 1);
  EXPECT_EQ(out[1].versions.back(), 2);
  EXPECT_EQ(out[1].logprobs.front(), -0.5);
  EXPECT_EQ(out[1].logprobs.back(), -0.5 * static_cast<double>(turn.size()));
  for (size_t t = 0; t < out[1].response.size(); ++t)
    if (out[1].sampled[t] == 0.0f) {
      EXPECT_EQ(out[1].versions[t], -1) << t;
      EXPECT_EQ(out[1].logprobs[t], 0.0) << t;
    }
  EXPECT_EQ(out[1].oldest_version(), 1);
  EXPECT_EQ(out[2].oldest_version(), 1);

  // The driver's limit: stopped after three turns, not done.
  EXPECT_TRUE(out[2].stopped && !out[2].done && !out[2].error);
  EXPECT_EQ(out[2].turns, 3);
  EXPECT_TRUE(out[2].trainable());

  // One generate call per round, only for the episodes still running.
  ASSERT_EQ(gen.calls.size(), 3u);
  EXPECT_EQ(gen.calls[0].size(), 3u);
  EXPECT_EQ(gen.calls[1].size(), 2u);
  EXPECT_EQ(gen.calls[2].size(), 1u);
  EXPECT_EQ(gen.calls[0][0].prompt, out[0].prompt);
  EXPECT_EQ(gen.calls[0][0].max_tokens, o.turn_tokens);
}

/// An environment that never ends its episodes: "start", then "again" after every action.
class endless : public env::in_process_environment {
protected:
  env::reset_result on_reset(const env::reset_request&) override { return {"start", {}}; }
  env::step_result on_step(const std::string&) override { return {"again", 0.0, false, {}}; }
};

TEST(EnvRollout, ATurnCutOffIsClosedByTheTemplateAndTheContextBoundsEpisodes) {
  const auto chat = model_chat();
  env::environment_pool pool([] { return std::make_unique<endless>(); }, 1);
  scripted gen{chat, "I guess 50, or maybe 51, or 52, or 53.", /*cut=*/true};
  rollout_options o;
  o.max_turns = 10;
  o.turn_tokens = 6;
  // Room for one full turn, the template's wrapping of "again", and 3 tokens of a second turn.
  json history = json::array({{{"role", "user"}, {"content", "start"}}});
  const auto start = chat.encode(history, true);
  auto first = chat.tokenizer().encode(gen.text, false);
  first.resize(6);
  history.push_back({{"role", "assistant"}, {"content", chat.decode_generated(first, true)}});
  const auto wrap = chat.continuation(history, false, {{"role", "user"}, {"content", "again"}});
  o.context = static_cast<int64_t>(start.size() + first.size() + wrap.size()) + 3;

  const auto out = run_rollout(pool, {task({})}, chat, gen.fn(), o);
  ASSERT_EQ(out.size(), 1u);
  const auto& s = out[0];
  EXPECT_TRUE(s.stopped && !s.error && !s.done) << s.error.value_or("");
  EXPECT_EQ(s.turns, 2);
  EXPECT_EQ(static_cast<int64_t>(s.prompt.size() + s.response.size()), o.context);
  // The first turn hit its token limit: the end-of-turn token follows it, not trained on.
  EXPECT_EQ(s.response[6], *chat.end_of_turn_id());
  EXPECT_EQ(s.sampled[6], 0.0f);
  EXPECT_EQ(count_sampled(s), 6 + 3);
  // The second turn got only the room left.
  ASSERT_EQ(gen.calls.size(), 2u);
  EXPECT_EQ(gen.calls[1].front().max_tokens, 3);
  EXPECT_EQ(gen.calls[1].front().prompt, concat(concat(start, first), wrap));
}

TEST(EnvRollout, FailuresStayInTheirEpisode) {
  const auto chat = model_chat();
  auto pool = guessing_pool(3);
  scripted gen{chat, "I guess 50"};
  const auto out =
      run_rollout(pool, {task({{"secret", 50}}), task({{"secret", 500}}), task({{"secret", 50}})},
                  chat, gen.fn(), {});
  EXPECT_TRUE(out[0].done && out[2].done);
  ASSERT_TRUE(out[1].error);
  EXPECT_THAT(*out[1].error, HasSubstr("task.secret must be an integer in [1, 100]"));
  EXPECT_FALSE(out[1].trainable());
  EXPECT_TRUE(out[0].trainable());
}

TEST(EnvRollout, IdsWithoutATokenAreLeftOutOfTheAction) {
  // A 4096-id model whose tokenizer has fewer ids: the model may sample ids with no token.
  const auto chat = model_chat(4096);
  auto pool = guessing_pool(1);
  std::vector<std::string> actions_seen;
  turn_generator gen = [&](const std::vector<turn_request>& turns) {
    auto ids = chat.tokenizer().encode("I guess 42", false);
    ids.insert(ids.begin() + 1, 4000);
    ids.push_back(*chat.end_of_turn_id());
    return std::vector<sampled_turn>(turns.size(), sampled_turn{ids, {}, {}});
  };
  const auto out = run_rollout(pool, {task({{"secret", 42}})}, chat, gen, {});
  ASSERT_FALSE(out[0].error) << *out[0].error;
  EXPECT_EQ(out[0].reward, 1.0);
  EXPECT_NE(std::find(out[0].response.begin(), out[0].response.end(), 4000), out[0].response.end());
  // A generator without log-probs or versions: the episode has none either.
  EXPECT_EQ(out[0].oldest_version(), -1);
  EXPECT_EQ(out[0].logprobs, std::vector<double>(out[0].response.size(), 0.0));
}

TEST(EnvRollout, AGeneratorWhoseLogProbsDoNotMatchItsIdsIsAnError) {
  const auto chat = model_chat();
  auto pool = guessing_pool(1);
  turn_generator gen = [&](const std::vector<turn_request>& turns) {
    auto ids = chat.tokenizer().encode("I guess 42", false);
    return std::vector<sampled_turn>(turns.size(), sampled_turn{ids, {-1.0}, {}});
  };
  try {
    run_rollout(pool, {task({{"secret", 42}})}, chat, gen, {});
    ADD_FAILURE() << "accepted one log-prob for several ids";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("with 1 log-probs and 0 versions"));
  }
}

#ifdef RLFORGE_PYTHON
env::subprocess_options python_env(std::vector<std::string> args) {
  env::subprocess_options o;
  o.process.argv = {RLFORGE_PYTHON};
  o.process.argv.insert(o.process.argv.end(), args.begin(), args.end());
  o.call_timeout = std::chrono::seconds(20);
  return o;
}

TEST(EnvRollout, RunsThePythonExampleAndFailsEpisodesOfADeadEnvironment) {
  const auto chat = model_chat();
  scripted gen{chat, "I guess 50"};
  {
    env::environment_pool pool(
        env::subprocess_factory(python_env({RLFORGE_EXAMPLES_ENVS_DIR "/guess_number.py"})), 2);
    const auto out =
        run_rollout(pool, {task({{"secret", 50}}), task({{"secret", 7}, {"max_turns", 2}})}, chat,
                    gen.fn(), {});
    EXPECT_TRUE(out[0].done && !out[0].error);
    EXPECT_EQ(out[0].reward, 1.0);
    EXPECT_TRUE(out[1].done && !out[1].error);
    EXPECT_EQ(out[1].turns, 2);
  }
  env::environment_pool dead(env::subprocess_factory(python_env({"-c", "pass"})), 2);
  const auto out = run_rollout(dead, {task({}), task({})}, chat, gen.fn(), {});
  for (const auto& s : out) {
    ASSERT_TRUE(s.error);
    EXPECT_THAT(*s.error, HasSubstr("closed its stdout before the handshake"));
    EXPECT_FALSE(s.trainable());
  }
}
#endif

} // namespace
} // namespace rlforge::examples::grpo
