#pragma once
// The --env job's episodes in every mode of the RL loop (rl/rl_loop.hpp says what the modes
// are): worker threads each run one GRPO group at a time (the same task `group` times, stepped
// in lockstep by env_rollout.hpp), so several groups are in flight at once and the engines
// generate one group's turns while other groups' environments think. Finished groups wait in
// the order they finished; the trainer takes the first `count` of them that are fresh enough
// (streaming: a long episode holds no step back), and groups staler than the bound are dropped
// and counted, never trained on. Staleness is that of the oldest sampled token, as for
// single-turn rollouts (rl/rollout_buffer.hpp).
//
// Plain C++ (threads; no torch, no CAF): the runner hides the engines and the environments.
// Thread-safety: `add`, `take`, `held`, `accounting`, `state` and `restore` may be called from any thread; the runner is
// called from the worker threads, several groups at once. Ownership: the producer owns its
// threads and the groups it holds; the destructor forgets queued groups and waits for the
// running ones (a runner is not interrupted).
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "env/environment.hpp"
#include "examples/grpo/env_rollout.hpp"

namespace rlforge::examples::grpo {

/// One GRPO group: a task reset `group` times and the episodes that came of it.
struct episode_group {
  int64_t id = 0;                       ///< in the order the groups were asked for
  env::reset_request request;           ///< the reset of each of its episodes
  std::vector<episode_sample> episodes; ///< empty until it ran

  /// The oldest weight version among its episodes' sampled tokens; -1 when none has one.
  int64_t oldest_version() const;
};

/// How many versions behind `version` the oldest sampled token of `g` is (0 when none is older
/// or none has a version).
int64_t staleness_of(const episode_group& g, int64_t version);

/// Runs one group's episodes. May throw std::exception: the engines failed for good; the
/// producer keeps the message and the next `take` reports it.
using group_runner = std::function<std::vector<episode_sample>(const episode_group& group)>;

/// What one `take` hands the trainer.
struct taken_groups {
  std::vector<episode_group> groups; ///< ascending id
  std::vector<int64_t> staleness;    ///< per group
  int64_t dropped = 0;               ///< groups dropped as too stale since the previous take
  double wait_seconds = 0;           ///< how long the take waited
};

/// Groups taken and dropped so far, and the taken ones by staleness (index = staleness).
struct producer_totals {
  int64_t taken = 0;
  int64_t dropped = 0;
  std::vector<int64_t> staleness_counts;
};

/// What a checkpoint keeps of a producer (episode_json.hpp writes it): the groups not finished
/// (queued or running; their partial episodes are not kept: a resume runs them from the start)
/// and the finished ones not yet taken, with their episodes, and the accounting.
struct producer_state {
  std::vector<episode_group> unfinished; ///< ascending id, episodes empty
  std::vector<episode_group> finished;   ///< in the order they finished
  producer_totals totals;
};

class episode_producer {
public:
  /// Starts `workers` (>= 1) threads. Throws std::invalid_argument for 0 workers or no runner.
  episode_producer(group_runner run, size_t workers);
  ~episode_producer();
  episode_producer(const episode_producer&) = delete;
  episode_producer& operator=(const episode_producer&) = delete;

  /// Queues a group to run (its `episodes` are ignored). Throws std::invalid_argument for an id
  /// the producer holds already.
  void add(episode_group group);

  /// Waits up to `timeout` until `count` (>= 1) finished groups at most `max_staleness` (>= 0)
  /// versions behind `version` are there; finished groups staler than that are dropped and
  /// counted on the way. Returns the `count` that finished first, ordered by id. Throws
  /// std::runtime_error when a runner failed (its message, naming the group; the producer then
  /// refuses every later take), when fewer than `count` groups are held at all, or at the
  /// timeout (naming how many run and wait); std::invalid_argument for a bad count or bound.
  taken_groups take(size_t count, int64_t version, int64_t max_staleness,
                    std::chrono::milliseconds timeout);

  /// Groups queued, running, or finished and not yet taken.
  size_t held() const;

  producer_totals accounting() const;

  /// A snapshot for a checkpoint (see producer_state). The groups running now go on running.
  producer_state state() const;

  /// Loads `s` into a producer that holds nothing and has taken nothing yet: its finished
  /// groups wait to be taken (in their order), its unfinished ones are queued to run from their
  /// start, and the accounting goes on from its totals. Throws std::invalid_argument when the
  /// producer is not fresh or an id repeats (nothing is loaded then).
  void restore(producer_state s);

private:
  void work();

  group_runner run_;
  mutable std::mutex mutex_;
  std::condition_variable wake_workers_;
  std::condition_variable finished_cv_;
  std::deque<episode_group> queued_;
  std::map<int64_t, env::reset_request> running_; ///< by id
  std::deque<episode_group> done_;   ///< in the order they finished
  std::optional<std::string> failed_; ///< the first runner failure
  int64_t dropped_since_take_ = 0;
  producer_totals totals_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

} // namespace rlforge::examples::grpo
