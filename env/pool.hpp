#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "env/environment.hpp"
#include "env/subprocess_environment.hpp"

/// Many episodes at once: a pool of environments (for out-of-process ones, a pool of processes)
/// and a runner that drives a batch of episodes concurrently.
///
/// A driver with a policy that answers one episode at a time uses `run_episodes`; a driver that
/// generates the actions of all running episodes in one batch (GRPO: `--env CMD`) uses
/// `episode_batch`: reset all, then repeatedly take the observations of the episodes still
/// running, generate, and `step` them all at once.
///
/// Failure isolation: an episode whose environment fails (crash, hang, garbage, or an error it
/// reports) records the env_error and stops; the other episodes go on, and the pool replaces an
/// environment that is no longer usable with a fresh one (a new process) for later episodes.
namespace rlforge::env {

/// Makes a new environment; may throw env_error (e.g. spawn).
using environment_factory = std::function<std::unique_ptr<environment>()>;

/// A factory of subprocess environments started with `options`.
environment_factory subprocess_factory(subprocess_options options);

struct turn_record {
  std::string action;
  step_result result;
};

/// One episode: its start, its turns, and how it ended.
struct episode_record {
  reset_result start;
  std::vector<turn_record> turns;
  double total_reward = 0;
  bool done = false;              ///< the environment ended the episode
  bool stopped = false;           ///< the driver ended it first (episode_batch::stop)
  std::optional<env_error> error; ///< what stopped it early, if anything
};

/// Chooses the next action of an episode from its record so far. Called from several threads
/// at once (for different episodes): it must be thread-safe.
using policy = std::function<std::string(std::size_t episode, const episode_record& so_far)>;

/// Thread safety: every member may be called from any thread.
class environment_pool {
public:
  /// At most `max_environments` (> 0) exist at once; they are created on demand and reused
  /// across episodes while usable.
  environment_pool(environment_factory factory, std::size_t max_environments);
  /// Closes the idle environments (leases must be gone).
  ~environment_pool();

  environment_pool(const environment_pool&) = delete;
  environment_pool& operator=(const environment_pool&) = delete;

  /// Exclusive use of one environment; back to the pool when destroyed (discarded instead if it
  /// is no longer usable).
  class lease {
  public:
    lease(lease&& other) noexcept;
    lease& operator=(lease&&) = delete;
    ~lease();
    environment& operator*() const { return *env_; }
    environment* operator->() const { return env_.get(); }

  private:
    friend class environment_pool;
    lease(environment_pool* pool, std::unique_ptr<environment> env);
    environment_pool* pool_;
    std::unique_ptr<environment> env_;
  };

  /// Waits for an idle environment or room for a new one. Throws env_error when a new one
  /// cannot be created (the room is given back).
  lease acquire();

  std::size_t max_environments() const noexcept { return max_; }

  /// Runs one episode per request, at most `max_environments` at a time, each for at most
  /// `max_turns` steps (0: until done). Records come back in request order.
  std::vector<episode_record> run_episodes(const std::vector<reset_request>& requests,
                                           const policy& act, int max_turns);

private:
  void give_back(std::unique_ptr<environment> env);

  environment_factory factory_;
  std::size_t max_;
  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<environment>> idle_;
  std::size_t live_ = 0;
};

/// A batch of episodes stepped in lockstep, one environment each (held for the whole episode).
/// Thread safety: one thread drives a batch; it steps its episodes concurrently.
class episode_batch {
public:
  /// Resets one episode per request concurrently. Requires requests.size() <=
  /// pool.max_environments() (throws env_error (usage) otherwise); an episode whose environment
  /// cannot be created or reset is recorded as failed.
  episode_batch(environment_pool& pool, const std::vector<reset_request>& requests);

  /// The episodes still running (neither done, failed nor stopped), in index order.
  std::vector<std::size_t> running() const;

  /// The text the policy answers next for episode `i`: the last observation.
  const std::string& last_observation(std::size_t i) const;

  /// Steps every running episode with `actions[i]` concurrently (`actions` has one entry per
  /// episode; entries of episodes not running are ignored). Returns the episodes that finished
  /// or failed in this step.
  std::vector<std::size_t> step(const std::vector<std::string>& actions);

  /// Ends running episode `i` on the driver's side (a turn limit, a full context window): it is
  /// no longer running, its record says `stopped`, and its environment goes back to the pool
  /// (the next `reset` there abandons the episode, as the protocol allows). Throws env_error
  /// (usage) when `i` is out of range or not running.
  void stop(std::size_t i);

  const std::vector<episode_record>& episodes() const noexcept { return records_; }

private:
  environment_pool& pool_;
  std::vector<episode_record> records_;
  std::vector<std::optional<environment_pool::lease>> leases_;
};

} // namespace rlforge::env
