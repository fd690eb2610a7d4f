#include "examples/grpo/episode_producer.hpp"

#include <algorithm>
#include <exception>
#include <set>
#include <stdexcept>
#include <utility>

#include "examples/grpo/report.hpp"

namespace rlforge::examples::grpo {

int64_t episode_group::oldest_version() const {
  int64_t oldest = -1;
  for (const auto& e : episodes) {
    const auto v = e.oldest_version();
    if (v >= 0 && (oldest < 0 || v < oldest))
      oldest = v;
  }
  return oldest;
}

int64_t staleness_of(const episode_group& g, int64_t version) {
  const auto oldest = g.oldest_version();
  return oldest < 0 ? 0 : std::max<int64_t>(0, version - oldest);
}

episode_producer::episode_producer(group_runner run, size_t workers) : run_(std::move(run)) {
  if (!run_)
    throw std::invalid_argument("episode producer: no group runner");
  if (workers == 0)
    throw std::invalid_argument("episode producer: needs at least one worker");
  for (size_t i = 0; i < workers; ++i)
    threads_.emplace_back([this] { work(); });
}

episode_producer::~episode_producer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    queued_.clear();
  }
  wake_workers_.notify_all();
  for (auto& t : threads_)
    t.join();
}

void episode_producer::add(episode_group group) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto id = group.id;
    auto same = [id](const episode_group& g) { return g.id == id; };
    if (std::any_of(queued_.begin(), queued_.end(), same) ||
        std::any_of(done_.begin(), done_.end(), same) ||
        running_.count(id) > 0)
      throw std::invalid_argument("episode producer: group " + std::to_string(id) +
                                  " is held already");
    group.episodes.clear();
    queued_.push_back(std::move(group));
  }
  wake_workers_.notify_one();
}

void episode_producer::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_workers_.wait(lock, [this] { return stopping_ || !queued_.empty(); });
    if (stopping_)
      return;
    auto group = std::move(queued_.front());
    queued_.pop_front();
    running_[group.id] = group.request;
    lock.unlock();
    std::optional<std::string> error;
    try {
      group.episodes = run_(group);
    } catch (const std::exception& e) {
      error = "group " + std::to_string(group.id) + ": " + e.what();
    }
    lock.lock();
    running_.erase(group.id);
    if (error) {
      if (!failed_)
        failed_ = std::move(error);
    } else {
      done_.push_back(std::move(group));
    }
    finished_cv_.notify_all();
  }
}

taken_groups episode_producer::take(size_t count, int64_t version, int64_t max_staleness,
                                    std::chrono::milliseconds timeout) {
  if (count == 0)
    throw std::invalid_argument("episode producer: take needs a count >= 1");
  if (max_staleness < 0)
    throw std::invalid_argument("episode producer: the staleness bound must be >= 0, got " +
                                std::to_string(max_staleness));
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (failed_)
      throw std::runtime_error("episode producer: " + *failed_);
    // Staler than the bound: dropped, never trained on.
    for (auto it = done_.begin(); it != done_.end();) {
      if (staleness_of(*it, version) > max_staleness) {
        ++dropped_since_take_;
        ++totals_.dropped;
        it = done_.erase(it);
      } else {
        ++it;
      }
    }
    if (done_.size() >= count)
      break;
    const size_t held = queued_.size() + running_.size() + done_.size();
    if (held < count)
      throw std::runtime_error("episode producer: " + std::to_string(count) +
                               " groups asked for, " + std::to_string(held) + " held");
    if (finished_cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
        std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("episode producer: no " + std::to_string(count) +
                               " finished groups after " + std::to_string(timeout.count()) +
                               " ms (" + std::to_string(running_.size()) + " running, " +
                               std::to_string(queued_.size()) + " queued, " +
                               std::to_string(done_.size()) + " finished)");
  }
  taken_groups out;
  for (size_t i = 0; i < count; ++i) {
    out.groups.push_back(std::move(done_.front()));
    done_.pop_front();
  }
  std::sort(out.groups.begin(), out.groups.end(),
            [](const episode_group& a, const episode_group& b) { return a.id < b.id; });
  for (const auto& g : out.groups) {
    const auto s = staleness_of(g, version);
    out.staleness.push_back(s);
    report::count_staleness(totals_.staleness_counts, s);
  }
  totals_.taken += static_cast<int64_t>(count);
  out.dropped = dropped_since_take_;
  dropped_since_take_ = 0;
  out.wait_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

size_t episode_producer::held() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_.size() + running_.size() + done_.size();
}

producer_totals episode_producer::accounting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return totals_;
}

producer_state episode_producer::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  producer_state s;
  for (const auto& g : queued_)
    s.unfinished.push_back(episode_group{g.id, g.request, {}});
  for (const auto& [id, request] : running_)
    s.unfinished.push_back(episode_group{id, request, {}});
  std::sort(s.unfinished.begin(), s.unfinished.end(),
            [](const episode_group& a, const episode_group& b) { return a.id < b.id; });
  s.finished.assign(done_.begin(), done_.end());
  s.totals = totals_;
  return s;
}

void episode_producer::restore(producer_state s) {
  std::set<int64_t> ids;
  for (const auto* part : {&s.unfinished, &s.finished})
    for (const auto& g : *part)
      if (!ids.insert(g.id).second)
        throw std::invalid_argument("episode producer: restore: group " + std::to_string(g.id) +
                                    " appears twice");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!queued_.empty() || !running_.empty() || !done_.empty() || totals_.taken > 0 ||
        totals_.dropped > 0)
      throw std::invalid_argument("episode producer: restore needs a fresh producer");
    for (auto& g : s.unfinished) {
      g.episodes.clear();
      queued_.push_back(std::move(g));
    }
    for (auto& g : s.finished)
      done_.push_back(std::move(g));
    totals_ = std::move(s.totals);
  }
  wake_workers_.notify_all();
}

} // namespace rlforge::examples::grpo
