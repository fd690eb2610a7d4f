#pragma once
// What the GRPO job's engines did during a step, from their own counters (the `stats` op of
// actors/engine.hpp): busy seconds in forward passes, summed over the ranks, and the tokens of
// the partial rows in flight. The job reads them around each step to report idle time per
// resource (mode_comparison.hpp sums them per run). Plain C++ on nlohmann-json; reentrant.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rlforge::examples::grpo {

/// One reading of every engine rank's counters.
struct engine_activity {
  int64_t ranks = 0;           ///< engine ranks that answered
  double busy_seconds = 0;     ///< wall time in forward passes since each rank started, summed
  int64_t in_flight_tokens = 0; ///< tokens sampled so far by requests not finished, summed
};

/// Sums the engines' `stats` answers, one JSON text per rank. Throws std::invalid_argument
/// naming the rank and the field when an answer is not a JSON object or lacks a non-negative
/// `busy_seconds` or `in_flight_tokens`.
engine_activity sum_engine_stats(const std::vector<std::string>& per_rank);

/// The engines' busy seconds between two readings: the difference, or `after`'s own figure when
/// it is smaller than `before`'s (the ranks were replaced in between and count from 0 again).
double busy_between(const engine_activity& before, const engine_activity& after);

/// A step record's fields for where the time went, from the readings at the step's start, when
/// it took its batch and at its end (nullopt: the engines did not answer): `engine_ranks` and
/// `engine_busy_seconds` (null unless the start and the end were read) and `tokens_in_flight`
/// (null unless the take was read).
nlohmann::json step_activity(const std::optional<engine_activity>& start,
                             const std::optional<engine_activity>& take,
                             const std::optional<engine_activity>& end);

} // namespace rlforge::examples::grpo
