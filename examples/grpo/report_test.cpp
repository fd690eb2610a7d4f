#include "examples/grpo/report.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include "tests/support/temp_dir.hpp"

using namespace rlforge::examples::report;
using testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

template <class E = std::invalid_argument, class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "no exception";
}

step_stats sample_stats() {
  step_stats s;
  s.step = 3;
  s.total_steps = 10;
  s.reward = 0.4375;
  s.accuracy = 0.375;
  s.loss = -0.0123;
  s.kl = 0.0021;
  s.entropy = 0.5;
  s.grad_norm = 1.5;
  s.tokens = 1200;
  s.generate_seconds = 0.5;
  s.train_seconds = 0.25;
  s.sync_seconds = 0.125;
  s.weight_version = 3;
  return s;
}

using rlforge::test_support::temp_dir;

} // namespace

TEST(Report, ProgressLineShowsEveryFigure) {
  auto line = progress_line(sample_stats(), 10);
  EXPECT_THAT(line, HasSubstr("step  3/10 [###-------]"));
  EXPECT_THAT(line, HasSubstr("reward 0.438"));
  EXPECT_THAT(line, HasSubstr("loss -0.0123"));
  EXPECT_THAT(line, HasSubstr("kl 0.0021"));
  EXPECT_THAT(line, HasSubstr("tok/s 2400")); // 1200 tokens in 0.5 s of generation
  EXPECT_THAT(line, HasSubstr("gen 0.50s train 0.25s sync 0.12s"));
  auto s = sample_stats();
  s.step = s.total_steps;
  EXPECT_THAT(progress_line(s, 4), HasSubstr("[####]"));
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST(Report, RefusesBadStats) {
  auto s = sample_stats();
  s.step = 0;
  EXPECT_THAT(error_of([&] { progress_line(s); }), HasSubstr("step must be >= 1"));
  s = sample_stats();
  s.total_steps = 2;
  EXPECT_THAT(error_of([&] { to_json(s); }), HasSubstr("total_steps 2 is below step 3"));
  s = sample_stats();
  s.kl = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error_of([&] { progress_line(s); }), HasSubstr("kl is not finite"));
  s = sample_stats();
  s.sync_seconds = -1;
  EXPECT_THAT(error_of([&] { to_json(s); }), HasSubstr("sync_seconds is negative"));
  s = sample_stats();
  s.tokens = -5;
  EXPECT_THAT(error_of([&] { validate(s); }), HasSubstr("tokens is negative"));
  EXPECT_THAT(error_of([] { progress_line(sample_stats(), 0); }), HasSubstr("bar_width"));
  s = sample_stats();
  s.generate_seconds = 0;
  EXPECT_EQ(s.tokens_per_second(), 0.0);
}

TEST(Report, JsonlRecordsRoundTrip) {
  temp_dir dir;
  auto path = (dir.path() / "m.jsonl").string();
  {
    std::ofstream out(path);
    auto s = sample_stats();
    for (int i = 1; i <= 3; ++i) {
      s.step = i;
      out << to_json(s).dump() << "\n";
    }
  }
  auto records = read_metrics(path);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2]["step"], 3);
  EXPECT_DOUBLE_EQ(records[0]["reward"].get<double>(), 0.4375);
  EXPECT_DOUBLE_EQ(records[0]["tokens_per_second"].get<double>(), 2400.0);
  EXPECT_DOUBLE_EQ(records[0]["seconds"].get<double>(), 0.875);
  EXPECT_EQ(records[0]["weight_version"], 3);
}

TEST(Report, ReadMetricsNamesTheBadLine) {
  temp_dir dir;
  auto path = (dir.path() / "bad.jsonl").string();
  {
    std::ofstream out(path);
    out << to_json(sample_stats()).dump() << "\n{not json\n";
  }
  EXPECT_THAT(error_of<std::runtime_error>([&] { read_metrics(path); }),
              HasSubstr("line 2 is not JSON"));
  {
    std::ofstream out(path);
    out << R"({"step": 1, "reward": 0.5})" << "\n";
  }
  EXPECT_THAT(error_of<std::runtime_error>([&] { read_metrics(path); }),
              HasSubstr("line 1 has no numeric field 'loss'"));
  {
    std::ofstream out(path);
    out << "[1, 2]\n";
  }
  EXPECT_THAT(error_of<std::runtime_error>([&] { read_metrics(path); }),
              HasSubstr("not a JSON object"));
  EXPECT_THAT(error_of<std::runtime_error>([&] { read_metrics((dir.path() / "none").string()); }),
              HasSubstr("cannot be read"));
}

TEST(Report, PlotScriptHoldsTheDataAndRunningMean) {
  plot_spec spec;
  spec.rewards = {0.0, 1.0, 0.5};
  spec.smoothing = 2;
  spec.png_path = "/x/it's.png";
  spec.title = "t";
  auto g = plot_script(spec);
  EXPECT_THAT(g, HasSubstr("set output '/x/it''s.png'"));
  EXPECT_THAT(g, HasSubstr("1 0.000000 0.000000\n"));
  EXPECT_THAT(g, HasSubstr("2 1.000000 0.500000\n"));
  EXPECT_THAT(g, HasSubstr("3 0.500000 0.750000\n"));
  EXPECT_THAT(g, HasSubstr("running mean (2 steps)"));
}

TEST(Report, PlotScriptRefusesBadSpecs) {
  plot_spec spec;
  spec.png_path = "out.png";
  EXPECT_THAT(error_of([&] { plot_script(spec); }), HasSubstr("no rewards"));
  spec.rewards = {0.1, std::numeric_limits<double>::infinity()};
  EXPECT_THAT(error_of([&] { plot_script(spec); }), HasSubstr("step 2 is not finite"));
  spec.rewards = {0.1};
  spec.smoothing = 0;
  EXPECT_THAT(error_of([&] { plot_script(spec); }), HasSubstr("smoothing"));
  spec.smoothing = 1;
  spec.png_path = "";
  EXPECT_THAT(error_of([&] { plot_script(spec); }), HasSubstr("output path is empty"));
  spec.png_path = "a\nb.png";
  EXPECT_THAT(error_of([&] { plot_reward_curve(spec); }), HasSubstr("line break"));
}

TEST(Report, PlotWritesAPngWhenGnuplotExists) {
  if (!find_program("gnuplot"))
    GTEST_SKIP() << "gnuplot is not installed";
  temp_dir dir;
  plot_spec spec;
  for (int i = 0; i < 30; ++i)
    spec.rewards.push_back(0.3 + 0.02 * i);
  spec.png_path = (dir.path() / "reward curve.png").string();
  auto r = plot_reward_curve(spec);
  ASSERT_TRUE(r.written) << r.message;
  EXPECT_TRUE(r.message.empty());
  EXPECT_TRUE(is_png(spec.png_path));
  EXPECT_GT(fs::file_size(spec.png_path), 1000u);
  // Scratch files are cleaned up: only the PNG is left in the directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(Report, MissingGnuplotIsReportedNotThrown) {
  temp_dir dir;
  plot_spec spec;
  spec.rewards = {0.5};
  spec.png_path = (dir.path() / "p.png").string();
  auto r = plot_reward_curve(spec, (dir.path() / "no-such-gnuplot").string());
  EXPECT_FALSE(r.written);
  EXPECT_THAT(r.message, HasSubstr("gnuplot not found"));
  EXPECT_THAT(r.message, HasSubstr("gnuplot-nox"));
  EXPECT_FALSE(fs::exists(spec.png_path));
  r = plot_reward_curve(spec, "rlforge-no-such-program");
  EXPECT_THAT(r.message, HasSubstr("on PATH"));
}

TEST(Report, FailingGnuplotIsReportedWithItsStatus) {
  temp_dir dir;
  auto fake = dir.path() / "fake-gnuplot";
  {
    std::ofstream out(fake);
    out << "#!/bin/sh\necho 'cannot draw' >&2\nexit 3\n";
  }
  fs::permissions(fake, fs::perms::owner_all);
  plot_spec spec;
  spec.rewards = {0.5};
  spec.png_path = (dir.path() / "p.png").string();
  auto r = plot_reward_curve(spec, fake.string());
  EXPECT_FALSE(r.written);
  EXPECT_THAT(r.message, HasSubstr("exit status 3"));
  EXPECT_THAT(r.message, HasSubstr("cannot draw"));
}

TEST(Report, CountStalenessGrowsTheHistogramAndRefusesNegatives) {
  std::vector<int64_t> h;
  count_staleness(h, 2);
  count_staleness(h, 0);
  count_staleness(h, 2);
  EXPECT_EQ(h, (std::vector<int64_t>{1, 0, 2}));
  EXPECT_THROW(count_staleness(h, -1), std::invalid_argument);
  EXPECT_EQ(h, (std::vector<int64_t>{1, 0, 2}));
}

TEST(Report, IsPngChecksTheSignature) {
  temp_dir dir;
  auto p = (dir.path() / "x.png").string();
  EXPECT_FALSE(is_png(p));
  {
    std::ofstream out(p, std::ios::binary);
    out << "\x89PNG\r\n\x1a\n-rest";
  }
  EXPECT_TRUE(is_png(p));
  {
    std::ofstream out(p, std::ios::binary);
    out << "GIF89a..";
  }
  EXPECT_FALSE(is_png(p));
}
