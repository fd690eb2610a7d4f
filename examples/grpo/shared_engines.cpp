#include "examples/grpo/shared_engines.hpp"

#include <chrono>
#include <cstdio>

#include <caf/all.hpp>

#include "runtime/errc.hpp"

namespace rlforge::examples::grpo {

shared_engines::shared_engines(engine_recovery& recovery, caf::actor_system& sys,
                               int restarts_allowed)
    : recovery_(recovery), sys_(sys), restarts_allowed_(restarts_allowed) {
}

int64_t shared_engines::generation() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return generation_;
}

actors::actor_group shared_engines::group() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recovery_.group();
}

int64_t shared_engines::synced_version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return synced_version_;
}

caf::expected<bool> shared_engines::recover(actors::trainer_client& client, int64_t seen,
                                            const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (generation_ != seen)
    return true; // replaced while the caller's call ran, or while it waited for the lock
  if (!recovery_.budget().can_restart() || !recovery_.engines_lost())
    return false;
  const auto t0 = std::chrono::steady_clock::now();
  std::printf("\ngrpo: the engines are lost (%s); replacing them (restart %d of %d); the "
              "episodes in flight wait and resume at the turn that failed\n",
              why.c_str(), recovery_.budget().used + 1, restarts_allowed_);
  std::fflush(stdout);
  auto node = recovery_.replace(client);
  if (!node)
    return make_error(errc::rank_failed,
                      "the engines were lost (" + why + ") and could not be replaced: " +
                          sys_.render(node.error()));
  auto version = client.save_weights_for_sampler("policy");
  if (!version)
    return make_error(errc::rank_failed, "the engines were replaced on node '" + *node +
                                             "' but the weight sync to them failed: " +
                                             sys_.render(version.error()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("grpo: engines on node '%s' at weight version %lld after %.2f s\n", node->c_str(),
              static_cast<long long>(*version), seconds);
  std::fflush(stdout);
  ++generation_;
  synced_version_ = *version;
  recoveries_.push_back({{"lost", why},
                         {"engines_node", *node},
                         {"weight_version", *version},
                         {"seconds", seconds}});
  return true;
}

nlohmann::json shared_engines::take_recoveries() {
  std::lock_guard<std::mutex> lock(mutex_);
  auto out = std::move(recoveries_);
  recoveries_ = nlohmann::json::array();
  return out;
}

} // namespace rlforge::examples::grpo
