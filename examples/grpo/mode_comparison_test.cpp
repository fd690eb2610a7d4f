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
  nlohmann::json r{{"mode", mode},        {"step", step},
                   {"samples", samples},  {"wall_seconds", wall},
                   {"staleness_counts", staleness}, {"logprob_gap", gap},
                   {"logprob_gap_corrected", gap / 10}, {"dropped", step == 2 ? 1 : 0},
                   {"requeued", 0},
                   {"seconds", wall / step},       {"generate_seconds", wall / step / 4},
                   {"engine_ranks", 1},            {"engine_busy_seconds", wall / step / 2},
                   {"tokens_in_flight", 100 * step}};
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
  EXPECT_DOUBLE_EQ(seconds_to_reach(fast, 0.6), 12);
  EXPECT_LT(seconds_to_reach(sync, 0.9), 0);
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
  for (const char* key : {"generate_seconds", "engine_busy_seconds", "tokens_in_flight"}) {
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
