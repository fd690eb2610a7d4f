#pragma once
// Multi-turn rollouts of the GRPO job's --env mode: episodes of an environment (env/) driven in
// lockstep, the model's turns sampled by a generator the job supplies, with the model's
// tokenizer and chat template (prompt/) turning sampled tokens into action text and
// observations into the tokens of the next prompt. Plain C++: no torch, no CAF (the generator
// hides the engines), so it is tested on its own.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "env/pool.hpp"
#include "prompt/chat_prompt.hpp"

namespace rlforge::examples::grpo {

/// One turn to sample: an episode's tokens so far and the most new tokens it may take.
struct turn_request {
  std::vector<int64_t> prompt;
  int64_t max_tokens = 1;
};

/// One sampled turn: the ids, with the stop token (when one ended the turn) last, and per id
/// the log-prob of the weights that sampled it and their version (the engines' `sample_output`
/// `logprobs` / `token_versions`). Either list may be empty when the generator has none (a
/// scripted one); otherwise each has one entry per id.
struct sampled_turn {
  std::vector<int64_t> ids;
  std::vector<double> logprobs;
  std::vector<int64_t> versions;
};

/// Samples one turn per request and returns them in request order. Called from the thread that
/// runs the rollout.
using turn_generator = std::function<std::vector<sampled_turn>(const std::vector<turn_request>&)>;

struct rollout_options {
  int max_turns = 5;        ///< turns before the driver stops a running episode, >= 1
  int64_t turn_tokens = 24; ///< most tokens sampled per turn, >= 1
  int64_t context = 512;    ///< the model's context: an episode's tokens never exceed it
};

/// One episode as training data: `prompt` is the chat template's rendering of the first
/// observation (with the generation prompt), `response` every token after it up to the last
/// sampled turn — the sampled turns and, between them, the tokens the template wraps the next
/// observation in. Only sampled tokens are trained on.
struct episode_sample {
  std::vector<int64_t> prompt;
  std::vector<int64_t> response;
  std::vector<float> sampled;       ///< per response token: 1 = sampled by the model, 0 = not
  /// Per response token: the behaviour log-prob and the weight version of a sampled token (as
  /// the generator reported them; 0 and -1 when it reported none), 0 and -1 for the others.
  std::vector<double> logprobs;
  std::vector<int64_t> versions;
  double reward = 0;                ///< the episode's total reward
  int turns = 0;                    ///< actions sent to the environment
  bool done = false;                ///< the environment ended the episode
  bool stopped = false;             ///< the driver ended it: turn limit or context full
  std::optional<std::string> error; ///< what failed it; failed episodes are not trained on

  /// Whether the episode can be trained on: not failed, and at least one sampled token.
  bool trainable() const { return !error && !response.empty(); }

  /// The oldest weight version among its sampled tokens; -1 when none has one.
  int64_t oldest_version() const;
};

/// Runs one episode per request in lockstep on environments of `pool` (which must hold at
/// least `requests.size()`): resets them all, then repeatedly renders each running episode's
/// next prompt, samples all turns with one call of `generate` (which should stop on
/// `stop_ids(chat)`), decodes them into actions (special tokens and ids without a token left
/// out) and steps every episode at once.
/// An episode ends when its environment says done, after `max_turns` turns, when its next turn
/// would not fit the context, or when it fails: an environment error (crash, timeout, garbage,
/// an error it reports) or a conversation the chat template cannot continue is recorded in that
/// episode only. Exceptions of `generate` propagate (the engines failing is the job's failure),
/// and so does std::runtime_error for a generator that answers the wrong number of turns or a
/// turn whose log-probs or versions do not match its ids.
std::vector<episode_sample> run_rollout(env::environment_pool& pool,
                                        const std::vector<env::reset_request>& requests,
                                        const prompt::chat_prompt& chat,
                                        const turn_generator& generate,
                                        const rollout_options& options);

/// The ids a generator must stop on for `chat`: its end-of-turn token, when it has one.
std::vector<int64_t> stop_ids(const prompt::chat_prompt& chat);

} // namespace rlforge::examples::grpo
