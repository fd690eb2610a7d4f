// Runs the `rlforge` binary's model subcommands end to end: init-model (with its tokenizer),
// score, tokenize and detokenize.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "cli_test_support.hpp"

using namespace rlforge::backends::testing;

namespace {

struct model_dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("rlforge_cli_model_" + std::to_string(::getpid()) + "_" +
                                std::to_string(next_id()));
  static int next_id() {
    static int n = 0;
    return n++;
  }
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
    {"score --tokens 1,2", 2, "--model is required"},
    {"score " + m + "--tokens 1,x,3", 2, "'x'"},
    {"score " + m + "--tokens 1,512", 2, "512"},
    {"score " + m + "--tokens 7", 2, "at least 2"},
    {"score " + m + "--tokens 1,2 --temperature 0", 2, "temperature"},
    {"score --model /nonexistent/rlforge --tokens 1,2", 1, "/nonexistent/rlforge"},
    {"score " + m + "--tokens 1,2 --frobnicate", 2, "--frobnicate"},
    {"score " + m + "--tokens 1,2 --dtype fp16", 2, "--dtype must be fp32 or bf16, got 'fp16'"},
  });
}

// `--dtype bf16` runs the products in bf16: close to the fp32 default, but not the same numbers.
TEST(ModelCli, ScoreInBf16IsWithinTwoHundredthsOfFp32) {
  model_dir dir;
  ASSERT_EQ(run_cli("init-model --preset tiny-qwen2 --seed 3 --out '" + dir.path.string() + "'")
                .code,
            0);
  const auto base = "score --model '" + dir.path.string() + "' --tokens 5,17,3,9,200,0,44,2";
  auto fp32 = run_cli(base);
  auto fp32_named = run_cli(base + " --dtype fp32");
  auto bf16 = run_cli(base + " --dtype bf16");
  ASSERT_EQ(fp32.code, 0) << fp32.err;
  ASSERT_EQ(bf16.code, 0) << bf16.err;
  EXPECT_EQ(fp32_named.out, fp32.out); // fp32 is the default
  auto a = nlohmann::json::parse(fp32.out).at("logprobs");
  auto b = nlohmann::json::parse(bf16.out).at("logprobs");
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i].get<double>() - b[i].get<double>()));
  EXPECT_LT(worst, 2e-2);
  EXPECT_GT(worst, 0.0) << "--dtype bf16 computed in fp32";
}

TEST(ModelCli, InitModelRejectsBadArgumentsWithOneLineOnStderr) {
  model_dir dir;
  expect_rejected({
    {"init-model --preset tiny", 2, "--out is required"},
    {"init-model --preset tiny --config x.json --out '" + dir.path.string() + "'", 2,
     "give exactly one of --config and --preset"},
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

namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A model directory written by `rlforge init-model --preset tiny`, shared by a suite.
class TextCli : public ::testing::Test {
protected:
  static void SetUpTestSuite() {
    dir_ = new model_dir;
    auto r = run_cli("init-model --preset tiny --seed 2 --out '" + dir_->path.string() + "'");
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string model() { return "--model '" + dir_->path.string() + "' "; }
  static model_dir* dir_;
};

model_dir* TextCli::dir_ = nullptr;

// The ids `rlforge tokenize --json` prints for `text` (shell-quoted by the caller).
std::vector<int64_t> tokenize_ids(const std::string& model_flag, const std::string& text_arg,
                                  const std::string& extra = "") {
  auto r = run_cli("tokenize " + model_flag + "--text " + text_arg + " --json " + extra);
  EXPECT_EQ(r.code, 0) << r.err;
  return nlohmann::json::parse(r.out).at("ids").get<std::vector<int64_t>>();
}

} // namespace

TEST(ModelCli, InitModelWritesADeterministicTokenizerWithAChatTemplate) {
  model_dir a, b;
  auto ra = run_cli("init-model --preset tiny --seed 1 --out '" + a.path.string() + "'");
  auto rb = run_cli("init-model --preset tiny-qwen2 --seed 9 --out '" + b.path.string() + "'");
  ASSERT_EQ(ra.code, 0) << ra.err;
  ASSERT_EQ(rb.code, 0) << rb.err;
  auto tok = nlohmann::json::parse(ra.out).at("tokenizer");
  EXPECT_EQ(tok.at("vocab_size"), 512);
  EXPECT_EQ(tok.at("special_tokens").at("<|endoftext|>"), 509);
  EXPECT_EQ(tok.at("special_tokens").at("<|im_start|>"), 510);
  EXPECT_EQ(tok.at("special_tokens").at("<|im_end|>"), 511);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    ASSERT_TRUE(std::filesystem::exists(a.path / f)) << f;
    // Same vocabulary size: the same files, whatever the seed and architecture.
    EXPECT_EQ(read_text(a.path / f), read_text(b.path / f)) << f;
  }
  auto config = nlohmann::json::parse(read_text(a.path / "tokenizer_config.json"));
  EXPECT_NE(config.at("chat_template").get<std::string>().find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(config.at("eos_token"), "<|endoftext|>");
}

TEST(ModelCli, InitModelFitsTheTokenizerIntoTheConfigsVocabulary) {
  model_dir dir;
  std::filesystem::create_directories(dir.path);
  auto cfg = dir.path / "cfg.json";
  std::ofstream(cfg) << R"({"architectures":["LlamaForCausalLM"],"model_type":"llama",
    "vocab_size":100000,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
    "num_attention_heads":2,"num_key_value_heads":1,"max_position_embeddings":16})";
  auto out = dir.path / "model";
  auto r = run_cli("init-model --config '" + cfg.string() + "' --out '" + out.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  const int64_t vocab = nlohmann::json::parse(r.out).at("tokenizer").at("vocab_size");
  EXPECT_GT(vocab, 512);
  EXPECT_LT(vocab, 100000);
  // Ids past the tokenizer are still model ids, but name no token.
  const std::string m = "--model '" + out.string() + "' ";
  expect_rejected({{"detokenize " + m + "--tokens 5," + std::to_string(vocab), 2,
                    "outside the tokenizer's vocabulary [0, " + std::to_string(vocab) + ")"}});

  // A vocabulary too small for byte-level BPE gets no tokenizer, and says so; a stale one from
  // an earlier model in the directory is removed.
  std::ofstream(cfg) << R"({"architectures":["LlamaForCausalLM"],"model_type":"llama",
    "vocab_size":100,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
    "num_attention_heads":2,"num_key_value_heads":1,"max_position_embeddings":16})";
  r = run_cli("init-model --config '" + cfg.string() + "' --out '" + out.string() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j.at("tokenizer").is_null());
  EXPECT_NE(j.at("tokenizer_note").get<std::string>().find("vocab_size 100 is below the 259"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(out / "tokenizer.json"));
  EXPECT_FALSE(std::filesystem::exists(out / "tokenizer_config.json"));
  expect_rejected({{"tokenize " + m + "--text hi", 1, "has no tokenizer"}});
}

TEST_F(TextCli, TokenizeAndDetokenizeRoundTrip) {
  const std::string text = "Hello, I guess 50!\n\tΩμέγα 😀 <|im_start|>user<|im_end|>";
  const auto ids = tokenize_ids(model(), "'" + text + "'");
  ASSERT_FALSE(ids.empty());
  // The plain output is the same ids, comma-separated, ready for --tokens.
  auto plain = run_cli("tokenize " + model() + "--text '" + text + "'");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out, join_ids(ids) + "\n");
  EXPECT_NE(std::find(ids.begin(), ids.end(), 510), ids.end()) << "<|im_start|> is one token";

  auto back = run_cli("detokenize " + model() + "--json --tokens " + join_ids(ids));
  ASSERT_EQ(back.code, 0) << back.err;
  EXPECT_EQ(nlohmann::json::parse(back.out).at("text"), text);
  auto plain_back = run_cli("detokenize " + model() + "--tokens " + join_ids(ids));
  EXPECT_EQ(plain_back.out, text + "\n");
  auto skipped = run_cli("detokenize " + model() + "--json --skip-special-tokens --tokens " +
                         join_ids(ids));
  ASSERT_EQ(skipped.code, 0) << skipped.err;
  EXPECT_EQ(nlohmann::json::parse(skipped.out).at("text"),
            "Hello, I guess 50!\n\tΩμέγα 😀 user");

  // The JSON form spells each token.
  auto spelled = run_cli("tokenize " + model() + "--json --text '<|im_end|>ab'");
  auto tokens = nlohmann::json::parse(spelled.out).at("tokens");
  ASSERT_GE(tokens.size(), 2u);
  EXPECT_EQ(tokens[0], "<|im_end|>");
}

TEST_F(TextCli, AddSpecialTokensRunsThePostProcessor) {
  // A tokenizer whose post-processor prepends BOS (Llama style), beside a copy of the model.
  model_dir llama;
  std::filesystem::copy(dir_->path, llama.path);
  auto tj = nlohmann::json::parse(read_text(llama.path / "tokenizer.json"));
  tj["post_processor"] = nlohmann::json::parse(R"({"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
               {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [509],
                                         "tokens": ["<|endoftext|>"]}}})");
  std::ofstream(llama.path / "tokenizer.json") << tj.dump();
  const std::string m = "--model '" + llama.path.string() + "' ";
  const auto plain = tokenize_ids(m, "hello");
  const auto with = tokenize_ids(m, "hello", "--add-special-tokens");
  ASSERT_EQ(with.size(), plain.size() + 1);
  EXPECT_EQ(with.front(), 509);
  EXPECT_EQ(std::vector<int64_t>(with.begin() + 1, with.end()), plain);
}

TEST_F(TextCli, ScoreTextScoresItsTokens) {
  auto by_text = run_cli("score " + model() + "--text 'I guess 50.'");
  ASSERT_EQ(by_text.code, 0) << by_text.err;
  auto j = nlohmann::json::parse(by_text.out);
  const auto ids = j.at("tokens").get<std::vector<int64_t>>();
  EXPECT_EQ(ids, tokenize_ids(model(), "'I guess 50.'", "--add-special-tokens"));
  auto by_ids = run_cli("score " + model() + "--tokens " + join_ids(ids));
  ASSERT_EQ(by_ids.code, 0) << by_ids.err;
  EXPECT_EQ(j.at("logprobs"), nlohmann::json::parse(by_ids.out).at("logprobs"));
  EXPECT_EQ(j.at("logprobs").size(), ids.size() - 1);
}

TEST_F(TextCli, BadTextInputIsRefusedWithOneLine) {
  const std::string m = model();
  model_dir broken;
  std::filesystem::copy(dir_->path, broken.path);
  std::ofstream(broken.path / "tokenizer.json") << "{\"model\": [1, 2";
  const std::string b = "--model '" + broken.path.string() + "' ";
  model_dir no_tokenizer;
  std::filesystem::create_directories(no_tokenizer.path);
  const std::string n = "--model '" + no_tokenizer.path.string() + "' ";
  expect_rejected({
      {"tokenize " + m, 2, "--text is required"},
      {"tokenize " + m + "--text x --frobnicate", 2, "--frobnicate"},
      {"tokenize " + m + "--text \"$(printf 'ab\\377c')\"", 2,
       "--text is not valid UTF-8: byte 2 (0xFF)"},
      {"tokenize " + n + "--text hi", 1,
       "'" + no_tokenizer.path.string() + "' has no tokenizer (neither tokenizer.json"},
      {"tokenize --model /nonexistent/rlforge --text hi", 1, "/nonexistent/rlforge"},
      {"tokenize " + b + "--text hi", 1, "tokenizer.json"},
      {"detokenize " + m, 2, "--tokens is required"},
      {"detokenize " + m + "--tokens 1,x", 2, "--tokens expects an integer, got 'x'"},
      {"detokenize " + m + "--tokens 3,512", 2,
       "--tokens: id 512 (entry 1) is outside the tokenizer's vocabulary [0, 512)"},
      {"detokenize " + m + "--tokens -1", 2, "id -1"},
      {"detokenize " + n + "--tokens 1", 1, "has no tokenizer"},
      {"score " + m + "--tokens 1,2 --text hi", 2, "give exactly one of --tokens and --text"},
      {"score " + m + "--text \"$(printf '\\300')\"", 2, "--text is not valid UTF-8"},
      {"score " + m + "--text a", 2, "--text encodes to 1 ids; scoring needs at least 2"},
      {"score " + n + "--text hello", 1, "has no tokenizer"},
  });
}

TEST_F(TextCli, SentencePieceModelsAreRefusedNamingWhy) {
  // The rlforge binary loads libprotobuf (libtorch, the service), which clashes with the copy
  // inside libsentencepiece: a directory with only tokenizer.model gets a clear refusal.
  model_dir spm;
  std::filesystem::create_directories(spm.path);
  std::ofstream(spm.path / "tokenizer.model") << "a SentencePiece model would be here";
  expect_rejected({{"tokenize --model '" + spm.path.string() + "' --text hi", 1,
                    "SentencePiece models cannot be loaded in this program"}});
}
