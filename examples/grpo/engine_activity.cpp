#include "examples/grpo/engine_activity.hpp"

#include <stdexcept>

namespace rlforge::examples::grpo {

engine_activity sum_engine_stats(const std::vector<std::string>& per_rank) {
  engine_activity out;
  for (size_t rank = 0; rank < per_rank.size(); ++rank) {
    const auto where = "engine stats of rank " + std::to_string(rank);
    auto j = nlohmann::json::parse(per_rank[rank], nullptr, /*allow_exceptions=*/false);
    if (!j.is_object())
      throw std::invalid_argument(where + ": not a JSON object: '" + per_rank[rank] + "'");
    const auto& busy = j["busy_seconds"];
    if (!busy.is_number() || busy.get<double>() < 0)
      throw std::invalid_argument(where + ": busy_seconds must be a number >= 0, got " +
                                  busy.dump());
    const auto& tokens = j["in_flight_tokens"];
    if (!tokens.is_number_integer() || tokens.get<int64_t>() < 0)
      throw std::invalid_argument(where + ": in_flight_tokens must be an integer >= 0, got " +
                                  tokens.dump());
    ++out.ranks;
    out.busy_seconds += busy.get<double>();
    out.in_flight_tokens += tokens.get<int64_t>();
  }
  return out;
}

double busy_between(const engine_activity& before, const engine_activity& after) {
  return after.busy_seconds >= before.busy_seconds ? after.busy_seconds - before.busy_seconds
                                                   : after.busy_seconds;
}

nlohmann::json step_activity(const std::optional<engine_activity>& start,
                             const std::optional<engine_activity>& take,
                             const std::optional<engine_activity>& end) {
  nlohmann::json out{{"engine_ranks", nullptr},
                     {"engine_busy_seconds", nullptr},
                     {"tokens_in_flight", nullptr}};
  if (start && end) {
    out["engine_ranks"] = end->ranks;
    out["engine_busy_seconds"] = busy_between(*start, *end);
  }
  if (take)
    out["tokens_in_flight"] = take->in_flight_tokens;
  return out;
}

} // namespace rlforge::examples::grpo
