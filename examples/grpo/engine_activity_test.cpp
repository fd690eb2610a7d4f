// The engines' activity from their `stats` answers: sums over ranks, busy time between two
// readings (also across a replacement of the ranks), a step record's fields (null where a
// reading is missing), and answers that are not usable.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <stdexcept>

#include "examples/grpo/engine_activity.hpp"

namespace rlforge::examples::grpo {
namespace {

using ::testing::HasSubstr;

TEST(EngineActivity, SumsTheRanksAndMeasuresBusyTimeBetweenReadings) {
  auto before = sum_engine_stats({R"({"busy_seconds": 1.5, "in_flight_tokens": 10, "running": 2})",
                                  R"({"busy_seconds": 0.5, "in_flight_tokens": 0})"});
  EXPECT_EQ(before.ranks, 2);
  EXPECT_DOUBLE_EQ(before.busy_seconds, 2.0);
  EXPECT_EQ(before.in_flight_tokens, 10);
  auto after = sum_engine_stats({R"({"busy_seconds": 2.5, "in_flight_tokens": 7})",
                                 R"({"busy_seconds": 1.0, "in_flight_tokens": 3})"});
  EXPECT_DOUBLE_EQ(busy_between(before, after), 1.5);
  // The ranks were replaced between the readings: the new ones count from 0.
  auto replaced = sum_engine_stats({R"({"busy_seconds": 0.25, "in_flight_tokens": 0})"});
  EXPECT_DOUBLE_EQ(busy_between(before, replaced), 0.25);
  EXPECT_EQ(sum_engine_stats({}).ranks, 0);
}

TEST(EngineActivity, StepFieldsAreNullWhereAReadingIsMissing) {
  engine_activity start{1, 2.0, 0}, take{1, 2.5, 40}, end{1, 3.5, 8};
  EXPECT_EQ(step_activity(start, take, end),
            (nlohmann::json{{"engine_ranks", 1}, {"engine_busy_seconds", 1.5},
                            {"tokens_in_flight", 40}}));
  auto no_end = step_activity(start, take, std::nullopt);
  EXPECT_TRUE(no_end.at("engine_busy_seconds").is_null());
  EXPECT_TRUE(no_end.at("engine_ranks").is_null());
  EXPECT_EQ(no_end.at("tokens_in_flight"), 40);
  auto no_take = step_activity(start, std::nullopt, end);
  EXPECT_TRUE(no_take.at("tokens_in_flight").is_null());
  EXPECT_EQ(no_take.at("engine_busy_seconds"), 1.5);
}

TEST(EngineActivity, RefusesAnswersItCannotRead) {
  auto error_of = [](const std::vector<std::string>& answers) -> std::string {
    try {
      sum_engine_stats(answers);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "accepted";
  };
  const std::string good = R"({"busy_seconds": 1, "in_flight_tokens": 1})";
  EXPECT_THAT(error_of({good, "not json"}), HasSubstr("engine stats of rank 1: not a JSON object"));
  EXPECT_THAT(error_of({R"({"in_flight_tokens": 1})"}),
              HasSubstr("rank 0: busy_seconds must be a number >= 0, got null"));
  EXPECT_THAT(error_of({R"({"busy_seconds": -1, "in_flight_tokens": 1})"}),
              HasSubstr("busy_seconds must be a number >= 0, got -1"));
  EXPECT_THAT(error_of({R"({"busy_seconds": 1, "in_flight_tokens": 1.5})"}),
              HasSubstr("in_flight_tokens must be an integer >= 0, got 1.5"));
  EXPECT_THAT(error_of({R"({"busy_seconds": 1, "in_flight_tokens": -2})"}),
              HasSubstr("in_flight_tokens must be an integer >= 0, got -2"));
  EXPECT_THAT(error_of({"[1, 2]"}), HasSubstr("not a JSON object: '[1, 2]'"));
}

} // namespace
} // namespace rlforge::examples::grpo
