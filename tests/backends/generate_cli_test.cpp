// Runs `rlforge generate` end to end on a random checkpoint written by the test, and checks its
// output against the library's own generate() on the same weights; then text prompts (--prompt,
// --chat, --messages) on a model written by `rlforge init-model`, with its tokenizer.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
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
      {"--prompt-tokens 1 --max-tokens 2", 2, "--model is required"},
      {m + " --max-tokens 2", 2, "missing --prompt-tokens"},
      {m + " --prompt-tokens 1", 2, "--max-tokens is required"},
      {m + " --prompt-tokens 1 --max-tokens 2 --bogus 1", 2, "--bogus"},
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

// `--dtype bf16` generates with the library's bf16 model; fp32 stays the default.
TEST_F(GenerateCli, DtypeSelectsThePrecisionOfTheLibrary) {
  const std::string run = model_flag() + " --prompt-tokens 5,6,7 --max-tokens 6 --temperature 0.9 "
                                         "--seed 11 --threads 1";
  auto bf16 = run_generate(run + " --dtype bf16");
  ASSERT_EQ(bf16.code, 0) << bf16.err;
  auto model = causal_lm::load(dir_->string());
  model->set_compute_dtype(compute_dtype::bf16);
  sampling_params p;
  p.max_tokens = 6;
  p.temperature = 0.9;
  p.seed = 11;
  const auto want = generate(*model, {{5, 6, 7}}, {p})[0];
  const auto j = nlohmann::json::parse(bf16.out);
  EXPECT_EQ(j.at("tokens").get<std::vector<int64_t>>(), want.tokens);
  const auto logprobs = j.at("logprobs").get<std::vector<double>>();
  ASSERT_EQ(logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < logprobs.size(); ++i)
    EXPECT_NEAR(logprobs[i], want.logprobs[i], 1e-9) << "token " << i;
  EXPECT_EQ(run_generate(run + " --dtype fp32").out, run_generate(run).out);
  expect_rejected({{run + " --dtype half", 2, "--dtype must be fp32 or bf16, got 'half'"}});
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

namespace {

// A model written by `rlforge init-model` (so with its tokenizer and ChatML template), for the
// text prompts of `generate`.
class GenerateTextCli : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("rlforge_generate_text_" + std::to_string(::getpid())));
    std::filesystem::remove_all(*dir_);
    auto r = run_cli("init-model --preset tiny --seed 4 --out '" + dir_->string() + "'");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }
  static std::string model_flag(const std::filesystem::path& dir) {
    return "--model '" + dir.string() + "' ";
  }
  // `rlforge generate <args>` on the model; expects success and returns the printed object.
  static nlohmann::json generate_ok(const std::string& args,
                                    const std::filesystem::path& dir = *dir_) {
    auto r = run_generate(model_flag(dir) + args);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(count_lines(r.out), 1u) << r.out;
    return nlohmann::json::parse(r.out);
  }
  // The text of `ids` by `rlforge detokenize --json`.
  static std::string detokenize(const std::vector<int64_t>& ids, bool skip_special) {
    auto r = run_cli("detokenize " + model_flag(*dir_) + "--json --tokens " + join_ids(ids) +
                     (skip_special ? " --skip-special-tokens" : ""));
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out).at("text");
  }
  static std::filesystem::path* dir_;
};

std::filesystem::path* GenerateTextCli::dir_ = nullptr;

/// A copy of a model directory, removed at the end.
struct model_copy {
  std::filesystem::path path;
  model_copy(const std::filesystem::path& from, const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("rlforge_generate_" + name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::copy(from, path);
  }
  ~model_copy() { std::filesystem::remove_all(path); }
  nlohmann::json read(const std::string& file) const {
    std::ifstream in(path / file);
    return nlohmann::json::parse(in);
  }
  void write(const std::string& file, const nlohmann::json& j) const {
    std::ofstream(path / file) << j.dump();
  }
};

} // namespace

TEST_F(GenerateTextCli, PromptTextIsEncodedAndTheCompletionDecoded) {
  const auto j = generate_ok("--prompt 'Guess my number.' --max-tokens 6 --temperature 0");
  const auto prompt = j.at("prompt_tokens").get<std::vector<int64_t>>();
  const auto tokens = j.at("tokens").get<std::vector<int64_t>>();
  EXPECT_EQ(detokenize(prompt, false), "Guess my number.");
  EXPECT_EQ(j.at("text").get<std::string>(), detokenize(tokens, true));
  EXPECT_EQ(j.at("stop_reason"), "length");
  // The same ids as a token prompt give the same completion, and its text too.
  const auto by_ids =
      generate_ok("--prompt-tokens " + join_ids(prompt) + " --max-tokens 6 --temperature 0");
  EXPECT_EQ(by_ids.at("tokens"), j.at("tokens"));
  EXPECT_EQ(by_ids.at("text"), j.at("text"));
  EXPECT_FALSE(by_ids.contains("prompt_tokens"));
}

TEST_F(GenerateTextCli, ChatAndMessagesApplyTheChatTemplate) {
  const auto chat = generate_ok("--prompt 'Hi there' --chat --max-tokens 3 --temperature 0");
  const auto prompt = chat.at("prompt_tokens").get<std::vector<int64_t>>();
  EXPECT_EQ(detokenize(prompt, false),
            "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
  const auto messages = generate_ok(
      R"(--messages '[{"role": "user", "content": "Hi there"}]' --max-tokens 3 --temperature 0)");
  EXPECT_EQ(messages.at("prompt_tokens"), chat.at("prompt_tokens"));
  EXPECT_EQ(messages.at("tokens"), chat.at("tokens"));
  const auto two = generate_ok(R"(--messages '[{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi"}]' --max-tokens 2 --temperature 0)");
  EXPECT_EQ(detokenize(two.at("prompt_tokens").get<std::vector<int64_t>>(), false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST_F(GenerateTextCli, ChatStopsAtTheTemplatesEndOfTurnToken) {
  // A template that writes no special token after an assistant's text: the end of a turn is then
  // the eos token, which this copy names after a token the model is known to produce.
  model_copy copy(*dir_, "eot");
  auto config = copy.read("tokenizer_config.json");
  config["chat_template"] = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                            "{% if add_generation_prompt %}assistant:{% endif %}";
  copy.write("tokenizer_config.json", config);
  const auto free_run =
      generate_ok("--prompt 'Hi' --chat --max-tokens 6 --temperature 0", copy.path);
  const auto tokens = free_run.at("tokens").get<std::vector<int64_t>>();
  ASSERT_EQ(tokens.size(), 6u);
  const int64_t stop = tokens[2];
  std::string spelling;
  const auto tokenizer_json = copy.read("tokenizer.json");
  for (const auto& [piece, id] : tokenizer_json.at("model").at("vocab").items())
    if (id == stop)
      spelling = piece;
  ASSERT_FALSE(spelling.empty()) << stop;
  config["eos_token"] = spelling;
  copy.write("tokenizer_config.json", config);
  const auto stopped =
      generate_ok("--prompt 'Hi' --chat --max-tokens 6 --temperature 0", copy.path);
  const auto first = std::find(tokens.begin(), tokens.end(), stop);
  EXPECT_EQ(stopped.at("tokens").get<std::vector<int64_t>>(),
            std::vector<int64_t>(tokens.begin(), first + 1));
  EXPECT_EQ(stopped.at("stop_reason"), "stop");
}

TEST_F(GenerateTextCli, BadTextPromptsAreRefusedWithOneLine) {
  const std::string m = model_flag(*dir_);
  model_copy no_template(*dir_, "no_template");
  auto config = no_template.read("tokenizer_config.json");
  config.erase("chat_template");
  no_template.write("tokenizer_config.json", config);
  model_copy broken(*dir_, "broken");
  std::ofstream(broken.path / "tokenizer.json") << "not json";
  const std::string b = model_flag(broken.path);
  model_copy no_tokenizer(*dir_, "no_tokenizer");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::remove(no_tokenizer.path / f);
  rlforge::backends::testing::expect_rejected(
      {
          {m + "--prompt hi --prompt-tokens 1 --max-tokens 2", 2, "give only one of"},
          {m + "--prompt-tokens 1 --chat --max-tokens 2", 2, "--chat applies to --prompt"},
          {m + "--messages '[]' --max-tokens 2", 2, "non-empty JSON array"},
          {m + "--messages '{\"role\": 1' --max-tokens 2", 2, "--messages is not valid JSON"},
          {m + "--messages '[{\"role\": \"user\"}]' --max-tokens 2", 2,
           "--messages message 0 needs a string \"content\""},
          {m + "--prompt \"$(printf 'x\\377')\" --max-tokens 2", 2,
           "--prompt is not valid UTF-8: byte 1 (0xFF)"},
          {model_flag(no_template.path) + "--prompt hi --chat --max-tokens 2", 1,
           "no chat template"},
          {b + "--prompt hi --max-tokens 2", 1, "cannot load the tokenizer of"},
          {b + "--prompt-tokens 1,2 --max-tokens 2", 1, "cannot load the tokenizer of"},
          {model_flag(no_tokenizer.path) + "--prompt hi --max-tokens 2", 1,
           "' has no tokenizer (neither tokenizer.json nor tokenizer.model)"},
      },
      "generate ");
}
