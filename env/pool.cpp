#include "env/pool.hpp"

#include <atomic>
#include <thread>

namespace rlforge::env {

namespace {

/// Runs fn(i) for i in [0, n) on up to `threads` threads.
void parallel_for(std::size_t n, std::size_t threads, const std::function<void(std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < n; i = next++)
      fn(i);
  };
  std::vector<std::thread> pool;
  const std::size_t count = std::min(n, std::max<std::size_t>(threads, 1));
  for (std::size_t t = 1; t < count; ++t)
    pool.emplace_back(worker);
  worker();
  for (auto& t : pool)
    t.join();
}

} // namespace

environment_factory subprocess_factory(subprocess_options options) {
  return [options]() -> std::unique_ptr<environment> {
    return std::make_unique<subprocess_environment>(options);
  };
}

environment_pool::environment_pool(environment_factory factory, std::size_t max_environments)
    : factory_(std::move(factory)), max_(max_environments) {
  if (max_ == 0)
    throw env_error(failure::usage, "an environment pool needs room for at least one");
}

environment_pool::~environment_pool() {
  for (auto& e : idle_)
    e->close();
}

environment_pool::lease::lease(environment_pool* pool, std::unique_ptr<environment> env)
    : pool_(pool), env_(std::move(env)) {}

environment_pool::lease::lease(lease&& other) noexcept
    : pool_(other.pool_), env_(std::move(other.env_)) {}

environment_pool::lease::~lease() {
  if (env_)
    pool_->give_back(std::move(env_));
}

environment_pool::lease environment_pool::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  available_.wait(lock, [&] { return !idle_.empty() || live_ < max_; });
  if (!idle_.empty()) {
    auto env = std::move(idle_.back());
    idle_.pop_back();
    return lease(this, std::move(env));
  }
  ++live_;
  lock.unlock();
  try {
    return lease(this, factory_());
  } catch (...) {
    lock.lock();
    --live_;
    available_.notify_one();
    throw;
  }
}

void environment_pool::give_back(std::unique_ptr<environment> env) {
  if (!env->usable()) {
    env->close();
    env.reset();
    std::lock_guard<std::mutex> lock(mutex_);
    --live_;
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    idle_.push_back(std::move(env));
  }
  available_.notify_one();
}

std::vector<episode_record>
environment_pool::run_episodes(const std::vector<reset_request>& requests, const policy& act,
                               int max_turns) {
  std::vector<episode_record> records(requests.size());
  parallel_for(requests.size(), max_, [&](std::size_t i) {
    episode_record& rec = records[i];
    try {
      lease env = acquire();
      rec.start = env->reset(requests[i]);
      while (max_turns <= 0 || static_cast<int>(rec.turns.size()) < max_turns) {
        turn_record t;
        t.action = act(i, rec);
        t.result = env->step(t.action);
        rec.total_reward += t.result.reward;
        const bool done = t.result.done;
        rec.turns.push_back(std::move(t));
        if (done) {
          rec.done = true;
          break;
        }
      }
    } catch (const env_error& e) {
      rec.error = e;
    }
  });
  return records;
}

episode_batch::episode_batch(environment_pool& pool, const std::vector<reset_request>& requests)
    : pool_(pool), records_(requests.size()), leases_(requests.size()) {
  if (requests.size() > pool.max_environments())
    throw env_error(failure::usage, "a batch of " + std::to_string(requests.size()) +
                                        " episodes needs a pool of at least that many "
                                        "environments (it has " +
                                        std::to_string(pool.max_environments()) + ")");
  parallel_for(requests.size(), requests.size(), [&](std::size_t i) {
    try {
      leases_[i].emplace(pool_.acquire());
      records_[i].start = (*leases_[i])->reset(requests[i]);
    } catch (const env_error& e) {
      records_[i].error = e;
      leases_[i].reset();
    }
  });
}

std::vector<std::size_t> episode_batch::running() const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < records_.size(); ++i)
    if (!records_[i].done && !records_[i].error && !records_[i].stopped)
      out.push_back(i);
  return out;
}

void episode_batch::stop(std::size_t i) {
  if (i >= records_.size())
    throw env_error(failure::usage, "stop: no episode " + std::to_string(i) + " in a batch of " +
                                        std::to_string(records_.size()));
  auto& rec = records_[i];
  if (rec.done || rec.error || rec.stopped)
    throw env_error(failure::usage, "stop: episode " + std::to_string(i) + " is not running");
  rec.stopped = true;
  leases_[i].reset();
}

const std::string& episode_batch::last_observation(std::size_t i) const {
  const auto& r = records_.at(i);
  return r.turns.empty() ? r.start.observation : r.turns.back().result.observation;
}

std::vector<std::size_t> episode_batch::step(const std::vector<std::string>& actions) {
  if (actions.size() != records_.size())
    throw env_error(failure::usage, "step needs one action per episode (" +
                                        std::to_string(records_.size()) + "), got " +
                                        std::to_string(actions.size()));
  const auto active = running();
  std::vector<char> ended(records_.size(), 0);
  parallel_for(active.size(), active.size(), [&](std::size_t k) {
    const std::size_t i = active[k];
    episode_record& rec = records_[i];
    try {
      turn_record t;
      t.action = actions[i];
      t.result = (*leases_[i])->step(t.action);
      rec.total_reward += t.result.reward;
      rec.done = t.result.done;
      rec.turns.push_back(std::move(t));
    } catch (const env_error& e) {
      rec.error = e;
    }
    if (rec.done || rec.error) {
      leases_[i].reset(); // back to the pool (or replaced, if it failed)
      ended[i] = 1;
    }
  });
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < ended.size(); ++i)
    if (ended[i])
      out.push_back(i);
  return out;
}

} // namespace rlforge::env
