// The comparison of GRPO runs by mode: sums and weighted means over the records, the time to
// the baseline's final accuracy, the shares of step time per resource (steps without engine
// readings left out), the printed table, the accuracy-vs-time plot script, and records that lack
// a field.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <stdexcept>

#include "examples/grpo/mode_comparison.hpp"
#include "examples/grpo/report.hpp"

namespace rlforge::examples::grpo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

nlohmann::json record(const std::string& mode, int step, int64_t samples, double wall,
                      std::vector<int64_t> staleness, double gap, double acc = -1) {
  nlohmann::json r{{"mode", mode},
                   {"step", step},
                   {"samples", samples},
                   {"wall_seconds", wall},
                   {"staleness_counts", staleness},
                   {"logprob_gap", gap},
                   {"logprob_gap_corrected", gap / 10},
                   {"dropped", step == 2 ? 1 : 0},
                   {"requeued", 0},
                   {"seconds", wall / step},
                   {"generate_seconds", wall / step / 4},
                   {"engine_ranks", 1},
                   {"engine_busy_seconds", wall / step / 2},
                   {"tokens_in_flight", 100 * step},
                   {"reward", 0.1 * step}};
  if (acc >= 0)
    r["held_out_accuracy"] = acc;
  return r;
}

TEST(ModeComparison, SummarizesAndComparesRuns) {
  auto sync = summarize({record("sync", 1, 100, 10, {4}, 0.0, 0.4),
                         record("sync", 2, 100, 20, {4}, 0.0, 0.6)});
  EXPECT_EQ(sync.samples, 200);
  EXPECT_DOUBLE_EQ(sync.samples_per_second, 10.0);
  EXPECT_EQ(sync.staleness_counts, (std::vector<int64_t>{8}));
  EXPECT_EQ(sync.dropped, 1);
  auto fast = summarize({record("fully_async", 1, 100, 5, {1, 3}, 0.2, 0.5),
                         record("fully_async", 2, 300, 12, {0, 4}, 0.1, 0.7)});
  EXPECT_DOUBLE_EQ(fast.logprob_gap, (0.2 * 100 + 0.1 * 300) / 400);
  EXPECT_EQ(fast.staleness_counts, (std::vector<int64_t>{1, 7}));
  EXPECT_DOUBLE_EQ(seconds_to_reach(fast.accuracy, 0.6), 12);
  EXPECT_LT(seconds_to_reach(sync.accuracy, 0.9), 0);
  auto text = compare_runs({sync, fast});
  EXPECT_THAT(text, HasSubstr("grpo: sync: 10.0 samples/s (1.00x sync)"));
  EXPECT_THAT(text, HasSubstr("grpo: fully_async: 33.3 samples/s (3.33x sync)"));
  EXPECT_THAT(text, HasSubstr("reached sync's final 60.0% at 12.0 s"));
  EXPECT_THAT(text, HasSubstr("staleness {0:12% 1:88%}"));
  EXPECT_THROW(compare_runs({}), std::invalid_argument);
  // Step times 10 and 10 s for sync, a quarter of each spent waiting, the engine busy half.
  EXPECT_DOUBLE_EQ(sync.trainer_wait_share, 0.25);
  EXPECT_DOUBLE_EQ(sync.engine_busy_share, 0.5);
  EXPECT_DOUBLE_EQ(sync.tokens_in_flight, 150);
  EXPECT_THAT(text, HasSubstr("trainer waiting 25% of the steps, engines busy 50%, 150 tokens "
                              "in flight at a take"));
}

TEST(ModeComparison, RunsWithoutHeldOutAccuracyCompareTheirTrailingMeanReward) {
  // Rewards 0.1, 0.2, ... by step (the record helper); a window of 5 steps.
  std::vector<nlohmann::json> slow, fast;
  for (int step = 1; step <= 7; ++step) {
    slow.push_back(record("sync", step, 10, 10.0 * step, {1}, 0));
    fast.push_back(record("fully_async", step, 10, 4.0 * step, {0, 1}, 0));
  }
  fast[6]["reward"] = 0.0; // the last step's reward drops: trailing mean (0.3+...+0.6+0)/5
  auto s = summarize(slow);
  ASSERT_EQ(s.reward.size(), 3u); // steps 5, 6, 7
  EXPECT_DOUBLE_EQ(s.reward.front().first, 50);
  EXPECT_NEAR(s.reward.front().second, 0.3, 1e-12);
  EXPECT_NEAR(s.reward.back().second, 0.5, 1e-12);
  auto f = summarize(fast);
  EXPECT_NEAR(f.reward.back().second, 0.36, 1e-12);
  EXPECT_TRUE(f.accuracy.empty());
  // fast's trailing means are 0.3, 0.4, 0.36: sync's final 0.5 is never reached; the other way
  // round sync reaches fast's final 0.36 at its step 6 (60 s).
  auto text = compare_runs({s, f});
  EXPECT_THAT(text, HasSubstr("grpo: sync: 1.0 samples/s (1.00x sync), final reward 0.500 (mean "
                              "of the last 5 steps) after 70.0 s, reached sync's final reward "
                              "0.500 at 70.0 s"));
  EXPECT_THAT(text, HasSubstr("final reward 0.360 (mean of the last 5 steps) after 28.0 s, never "
                              "reached sync's final reward 0.500"));
  EXPECT_THAT(compare_runs({f, s}), HasSubstr("reached fully_async's final reward 0.360 at 60.0 "
                                              "s"));
  // Fewer steps than the window: no reward curve, nothing printed about it.
  auto short_run = summarize({slow[0], slow[1]});
  EXPECT_TRUE(short_run.reward.empty());
  EXPECT_THAT(compare_runs({short_run}), Not(HasSubstr("final reward")));
}

TEST(ModeComparison, StepsWithoutEngineReadingsAreLeftOutOfTheShares) {
  auto a = record("fully_async", 1, 10, 4, {1}, 0);
  auto b = record("fully_async", 2, 10, 10, {1}, 0);
  b["engine_busy_seconds"] = nullptr; // the engines did not answer this step
  b["tokens_in_flight"] = nullptr;
  auto s = summarize({a, b});
  EXPECT_DOUBLE_EQ(s.engine_busy_share, 0.5); // step 1 alone: 2 s busy of 4
  EXPECT_DOUBLE_EQ(s.tokens_in_flight, 100);
  a["engine_busy_seconds"] = nullptr;
  a["tokens_in_flight"] = nullptr;
  auto none = summarize({a, b});
  EXPECT_EQ(none.engine_busy_share, -1);
  EXPECT_EQ(none.tokens_in_flight, -1);
  EXPECT_THAT(compare_runs({none}), ::testing::Not(HasSubstr("engines busy")));
}

TEST(ModeComparison, RefusesRecordsWithoutTheLoopsFields) {
  EXPECT_THROW(summarize({}), std::invalid_argument);
  auto r = record("sync", 3, 1, 1, {1}, 0);
  r.erase("wall_seconds");
  try {
    summarize({r});
    ADD_FAILURE() << "accepted a record without wall_seconds";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("step 3 has no 'wall_seconds'"));
  }
  for (const char* key :
       {"generate_seconds", "engine_busy_seconds", "tokens_in_flight", "reward"}) {
    auto without = record("sync", 4, 1, 1, {1}, 0);
    without.erase(key);
    try {
      summarize({without});
      ADD_FAILURE() << "accepted a record without " << key;
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr(std::string{"step 4 has no '"} + key + "'"));
    }
  }
  auto bad = record("sync", 1, 1, 1, {1}, 0);
  bad["samples"] = "many";
  EXPECT_THROW(summarize({bad}), std::invalid_argument);
}

TEST(ModeComparison, AccuracyPlotScript) {
  auto g = report::accuracy_plot_script({{"sync", {{1.0, 0.4}, {2.0, 0.5}}},
                                         {"fully_async", {{0.5, 0.45}}}},
                                        "/tmp/x.png", "modes");
  EXPECT_THAT(g, HasSubstr("set output '/tmp/x.png'"));
  EXPECT_THAT(g, HasSubstr("2.000 0.5000"));
  EXPECT_THAT(g, HasSubstr("title 'fully_async'"));
  // Labels are drawn as written (an underscore is not a subscript).
  EXPECT_THAT(g, HasSubstr(" noenhanced "));
  EXPECT_THAT(g, Not(HasSubstr(" enhanced ")));
  EXPECT_THROW(report::accuracy_plot_script({}, "/tmp/x.png", "t"), std::invalid_argument);
  EXPECT_THROW(report::accuracy_plot_script({{"a", {}}}, "/tmp/x.png", "t"),
               std::invalid_argument);
  EXPECT_THROW(report::accuracy_plot_script({{"a", {{1.0, 0.1}}}}, "", "t"),
               std::invalid_argument);
}

} // namespace
} // namespace rlforge::examples::grpo
