// Runs `rlforge generate` end to end on a random checkpoint written by the test, and checks its
// output against the library's own generate() on the same weights.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "backends/model/causal_lm.hpp"
#include "backends/model/hf_checkpoint.hpp"
#include "backends/model/init.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "cli_test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;

namespace {

// `rlforge generate <args>` through the shell, capturing stdout and stderr.
run_result run_generate(const std::string& args) {
  return run_cli("generate " + args);
}

// A random "tiny" checkpoint in a temporary directory, removed at the end of the suite.
class GenerateCli : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("rlforge_generate_model_" + std::to_string(::getpid())));
    std::filesystem::remove_all(*dir_);
    const auto config = preset("tiny");
    save_hf_checkpoint(dir_->string(), config, random_hf_weights(config, 3, 0.2));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }
  static std::string model_flag() { return "--model '" + dir_->string() + "'"; }
  // Each bad `rlforge generate` invocation prints nothing on stdout, exactly one line on stderr
  // naming the problem, and exits with the case's code.
  static void expect_rejected(const std::vector<bad_case>& cases) {
    rlforge::backends::testing::expect_rejected(cases, "generate ");
  }
  static std::filesystem::path* dir_;
};

std::filesystem::path* GenerateCli::dir_ = nullptr;

} // namespace

TEST_F(GenerateCli, PrintsOneJsonObjectMatchingTheLibrary) {
  auto r = run_generate(model_flag() + " --prompt-tokens 5,6,7 --max-tokens 9 --temperature 0.8 "
                                       "--top-k 40 --top-p 0.95 --seed 77 --threads 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(count_lines(r.out), 1u) << r.out;
  EXPECT_EQ(r.out.rfind("{\"tokens\":[", 0), 0u) << "keys in the documented order: " << r.out;
  EXPECT_NE(r.out.find("],\"logprobs\":["), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("],\"stop_reason\":\""), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 3u) << r.out;

  auto model = causal_lm::load(dir_->string());
  sampling_params p;
  p.max_tokens = 9;
  p.temperature = 0.8;
  p.top_k = 40;
  p.top_p = 0.95;
  p.seed = 77;
  const auto want = generate(*model, {{5, 6, 7}}, {p})[0];
  EXPECT_EQ(j.at("tokens").get<std::vector<int64_t>>(), want.tokens);
  const auto logprobs = j.at("logprobs").get<std::vector<double>>();
  ASSERT_EQ(logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < logprobs.size(); ++i)
    EXPECT_NEAR(logprobs[i], want.logprobs[i], 1e-9) << "token " << i;
  EXPECT_EQ(j.at("stop_reason").get<std::string>(), "length");
}

TEST_F(GenerateCli, StopTokenEndsWithStop) {
  auto free_run =
      run_generate(model_flag() + " --prompt-tokens 1,2 --max-tokens 6 --temperature 0");
  ASSERT_EQ(free_run.code, 0) << free_run.err;
  const auto tokens = nlohmann::json::parse(free_run.out).at("tokens").get<std::vector<int64_t>>();
  ASSERT_EQ(tokens.size(), 6u);
  const int64_t stop = tokens[2];
  auto r = run_generate(model_flag() +
                        " --prompt-tokens 1,2 --max-tokens 6 --temperature 0 "
                        "--stop-tokens 511," +
                        std::to_string(stop));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("stop_reason").get<std::string>(), "stop");
  const auto got = j.at("tokens").get<std::vector<int64_t>>();
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back(), stop);
  EXPECT_EQ(got,
            std::vector<int64_t>(tokens.begin(), tokens.begin() + static_cast<long>(got.size())));
}

TEST_F(GenerateCli, MissingOrUnknownFlagsAreUsageErrors) {
  const std::string m = model_flag();
  expect_rejected({
      {"--prompt-tokens 1 --max-tokens 2", 2, "missing --model"},
      {m + " --max-tokens 2", 2, "missing --prompt-tokens"},
      {m + " --prompt-tokens 1", 2, "missing --max-tokens"},
      {m + " --prompt-tokens 1 --max-tokens 2 --bogus 1", 2, "unknown argument '--bogus'"},
  });
}

TEST_F(GenerateCli, MalformedValuesAreUsageErrors) {
  const std::string m = model_flag();
  expect_rejected({
      {m + " --prompt-tokens 1,,2 --max-tokens 2", 2, "--prompt-tokens expects"},
      {m + " --prompt-tokens 1,x --max-tokens 2", 2, "expects an integer, got 'x'"},
      {m + " --prompt-tokens 1 --max-tokens two", 2, "--max-tokens expects an integer, got 'two'"},
      {m + " --prompt-tokens 1 --max-tokens 2 --temperature abc", 2, "got 'abc'"},
  });
}

TEST_F(GenerateCli, MalformedOptionalValuesAreUsageErrors) {
  const std::string m = model_flag();
  expect_rejected({
      {m + " --prompt-tokens 1 --max-tokens 2 --seed -4", 2, "--seed expects an unsigned"},
      {m + " --prompt-tokens 1 --max-tokens 2 --threads 0", 2, "--threads must be in [1, 1024]"},
  });
}

TEST_F(GenerateCli, OutOfDomainParametersAreUsageErrors) {
  const std::string m = model_flag();
  expect_rejected({
      {m + " --prompt-tokens 1 --max-tokens 0", 2, "max_tokens must be >= 1, got 0"},
      {m + " --prompt-tokens 1 --max-tokens 2 --temperature -1", 2, "temperature"},
      {m + " --prompt-tokens 1 --max-tokens 2 --top-k 0", 2, "top_k must be -1 (off) or >= 1"},
  });
}

TEST_F(GenerateCli, OutOfDomainFilterAndTokenValuesAreUsageErrors) {
  const std::string m = model_flag();
  expect_rejected({
      {m + " --prompt-tokens 1 --max-tokens 2 --top-p 1.5", 2, "top_p must be in (0, 1], got 1.5"},
      {m + " --prompt-tokens 1 --max-tokens 2 --stop-tokens 512", 2, "stop token id 512"},
      {m + " --prompt-tokens 3,9999 --max-tokens 2", 2, "prompt token 1 is 9999"},
  });
}

TEST_F(GenerateCli, MissingModelIsARuntimeError) {
  expect_rejected({{"--model /nonexistent/rlforge-model --prompt-tokens 1 --max-tokens 2", 1,
                    "cannot load model from '/nonexistent/rlforge-model'"}});
}
