#include "rl/rollout_buffer.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace rlforge::rl {

int64_t oldest_version(const rollout& r) {
  int64_t oldest = std::numeric_limits<int64_t>::max();
  bool any = false;
  for (const auto& s : r.samples) {
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      any = true;
      oldest = std::min(oldest, t < s.token_versions.size() ? s.token_versions[t] : int64_t{0});
    }
  }
  return any ? oldest : -1;
}

int64_t staleness_of(const rollout& r, int64_t version) {
  auto oldest = oldest_version(r);
  return oldest < 0 ? 0 : std::max<int64_t>(0, version - oldest);
}

void rollout_buffer::add(rollout r) {
  done_.push_back(std::move(r));
}

std::optional<rollout_batch> rollout_buffer::take(int64_t count, int64_t version,
                                                  int64_t max_staleness) {
  if (count < 1)
    throw std::invalid_argument("rollout_buffer::take: count must be >= 1, got " +
                                std::to_string(count));
  if (max_staleness < 0)
    throw std::invalid_argument("rollout_buffer::take: max_staleness must be >= 0, got " +
                                std::to_string(max_staleness));
  for (auto i = done_.begin(); i != done_.end();) {
    if (staleness_of(*i, version) > max_staleness) {
      dropped_since_take_.push_back(i->id);
      ++dropped_;
      i = done_.erase(i);
    } else {
      ++i;
    }
  }
  if (static_cast<int64_t>(done_.size()) < count)
    return std::nullopt;
  rollout_batch out;
  out.rollouts.assign(std::make_move_iterator(done_.begin()),
                      std::make_move_iterator(done_.begin() + count));
  done_.erase(done_.begin(), done_.begin() + count);
  std::sort(out.rollouts.begin(), out.rollouts.end(),
            [](const rollout& a, const rollout& b) { return a.id < b.id; });
  for (const auto& r : out.rollouts) {
    auto s = staleness_of(r, version);
    out.staleness.push_back(s);
    if (static_cast<int64_t>(staleness_counts_.size()) <= s)
      staleness_counts_.resize(static_cast<size_t>(s) + 1, 0);
    ++staleness_counts_[static_cast<size_t>(s)];
  }
  taken_ += count;
  out.dropped_ids = std::move(dropped_since_take_);
  dropped_since_take_.clear();
  out.requeued = requeued_since_take_;
  requeued_since_take_ = 0;
  return out;
}

rollout_state rollout_buffer::state() const {
  rollout_state s;
  s.done.assign(done_.begin(), done_.end());
  s.taken = taken_;
  s.dropped = dropped_;
  s.requeued = requeued_;
  s.staleness_counts = staleness_counts_;
  return s;
}

void rollout_buffer::restore(const rollout_state& s) {
  done_.assign(s.done.begin(), s.done.end());
  dropped_since_take_.clear();
  requeued_since_take_ = 0;
  taken_ = s.taken;
  dropped_ = s.dropped;
  requeued_ = s.requeued;
  staleness_counts_ = s.staleness_counts;
}

} // namespace rlforge::rl
