#include "examples/grpo/engine_reading.hpp"

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/engine.hpp"

namespace rlforge::examples::grpo {

std::optional<engine_activity> read_engine_activity(actors::actor_group& engines) {
  auto texts = engines.call_all(actors::engine_ops::stats, std::chrono::seconds(10));
  if (!texts)
    return std::nullopt;
  try {
    return sum_engine_stats(*texts);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "grpo: %s\n", e.what());
    return std::nullopt;
  }
}

} // namespace rlforge::examples::grpo
