// Runs the `rlforge` binary's model subcommands end to end: init-model, then score.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "cli_test_support.hpp"

using namespace rlforge::backends::testing;

namespace {

struct model_dir {
  std::filesystem::path path = std::filesystem::temp_directory_path()
                               / ("rlforge_cli_model_" + std::to_string(::getpid()));
  model_dir() { std::filesystem::remove_all(path); }
  ~model_dir() { std::filesystem::remove_all(path); }
};

} // namespace

TEST(ModelCli, InitModelThenScorePrintsOneLogprobPerPredictedToken) {
  model_dir dir;
  auto init = run_cli("init-model --preset tiny-qwen3 --seed 5 --out '" + dir.path.string() + "'");
  ASSERT_EQ(init.code, 0) << init.err;
  EXPECT_TRUE(std::filesystem::exists(dir.path / "config.json"));
  EXPECT_TRUE(std::filesystem::exists(dir.path / "model.safetensors"));
  auto info = nlohmann::json::parse(init.out);
  EXPECT_EQ(info.at("architecture"), "qwen3");
  EXPECT_EQ(info.at("num_parameters"), 139648);

  auto score = run_cli("score --model '" + dir.path.string() + "' --tokens 5,17,3,9,200,0");
  ASSERT_EQ(score.code, 0) << score.err;
  EXPECT_EQ(count_lines(score.out), 1u) << score.out;
  auto j = nlohmann::json::parse(score.out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 1u);
  auto& lp = j.at("logprobs");
  ASSERT_EQ(lp.size(), 5u);
  for (auto& x : lp) {
    EXPECT_LT(x.get<double>(), 0.0);
    // A freshly initialised model is close to uniform over its 512 tokens.
    EXPECT_NEAR(x.get<double>(), -std::log(512.0), 0.5);
  }
  // The same seed writes the same weights, so scores repeat exactly.
  auto again = run_cli("score --model '" + dir.path.string() + "' --tokens 5,17,3,9,200,0");
  EXPECT_EQ(again.out, score.out);
}

TEST(ModelCli, ScoreRejectsBadArgumentsWithOneLineOnStderr) {
  model_dir dir;
  ASSERT_EQ(run_cli("init-model --preset tiny --out '" + dir.path.string() + "'").code, 0);
  auto m = "--model '" + dir.path.string() + "' ";
  expect_rejected({
    {"score --tokens 1,2", 2, "usage"},
    {"score " + m + "--tokens 1,x,3", 2, "'x'"},
    {"score " + m + "--tokens 1,512", 2, "512"},
    {"score " + m + "--tokens 7", 2, "at least 2"},
    {"score " + m + "--tokens 1,2 --temperature 0", 2, "temperature"},
    {"score --model /nonexistent/rlforge --tokens 1,2", 1, "/nonexistent/rlforge"},
    {"score " + m + "--tokens 1,2 --frobnicate", 2, "--frobnicate"},
  });
}

TEST(ModelCli, InitModelRejectsBadArgumentsWithOneLineOnStderr) {
  model_dir dir;
  expect_rejected({
    {"init-model --preset tiny", 2, "usage"},
    {"init-model --preset tiny --config x.json --out '" + dir.path.string() + "'", 2, "usage"},
    {"init-model --preset nope --out '" + dir.path.string() + "'", 2, "nope"},
    {"init-model --preset tiny --seed -4 --out '" + dir.path.string() + "'", 2, "-4"},
    {"init-model --config /nonexistent/config.json --out '" + dir.path.string() + "'", 1,
     "/nonexistent/config.json"},
  });
}

TEST(ModelCli, InitModelAcceptsAConfigFile) {
  model_dir dir;
  std::filesystem::create_directories(dir.path);
  auto cfg = dir.path / "cfg.json";
  std::ofstream(cfg) << R"({"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2",
    "vocab_size":64,"hidden_size":32,"intermediate_size":48,"num_hidden_layers":1,
    "num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":16,
    "rms_norm_eps":1e-6,"rope_theta":10000.0,"tie_word_embeddings":true})";
  auto out = dir.path / "model";
  auto r = run_cli("init-model --config '" + cfg.string() + "' --out '" + out.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("architecture"), "qwen2");
  auto s = run_cli("score --model '" + out.string() + "' --tokens 1,2,3");
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_EQ(nlohmann::json::parse(s.out).at("logprobs").size(), 2u);
}
