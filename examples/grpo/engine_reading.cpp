#include "examples/grpo/engine_reading.hpp"

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/all.hpp>

namespace rlforge::examples::grpo {

std::optional<engine_activity> read_engine_activity(actors::actor_group& engines) {
  auto answers = engines.call_all("stats", caf::message{}, std::chrono::seconds(10));
  if (!answers)
    return std::nullopt;
  std::vector<std::string> texts;
  for (auto& m : *answers)
    texts.push_back(m.match_elements<std::string>() ? m.get_as<std::string>(0)
                                                    : caf::to_string(m));
  try {
    return sum_engine_stats(texts);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "grpo: %s\n", e.what());
    return std::nullopt;
  }
}

} // namespace rlforge::examples::grpo
