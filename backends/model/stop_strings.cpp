#include "backends/model/stop_strings.hpp"

#include <algorithm>
#include <utility>

#include "backends/error.hpp"

namespace rlforge::backends {

stop_string_matcher::stop_string_matcher(const detokenizer& tok, std::vector<std::string> stops)
    : stream_(tok.stream()), stops_(std::move(stops)) {
  if (stops_.empty())
    fail(error_code::invalid_argument, "stop_string_matcher: no stop strings");
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty())
      fail(error_code::invalid_argument,
           "stop_string_matcher: stop string " + std::to_string(i) + " is empty");
    keep_ = std::max(keep_, stops_[i].size() - 1);
  }
}

std::optional<size_t> stop_string_matcher::push(int64_t id) {
  std::string fresh = stream_->push(id);
  if (fresh.empty())
    return std::nullopt;
  const size_t old = tail_.size();
  std::string window = std::move(tail_);
  window += fresh;
  std::optional<size_t> best;
  size_t best_end = 0, best_start = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const auto& s = stops_[i];
    // The first occurrence that ends in the fresh text: earlier ones ended before this token.
    const size_t from = old >= s.size() ? old - s.size() + 1 : 0;
    const size_t at = window.find(s, from);
    if (at == std::string::npos)
      continue;
    const size_t end = at + s.size();
    if (!best || end < best_end || (end == best_end && at < best_start)) {
      best = i;
      best_end = end;
      best_start = at;
    }
  }
  tail_ = window.size() > keep_ ? window.substr(window.size() - keep_) : std::move(window);
  return best;
}

} // namespace rlforge::backends
