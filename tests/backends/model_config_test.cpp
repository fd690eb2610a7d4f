#include "backends/model/model_config.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "backends/error.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;
using nlohmann::json;
namespace fs = std::filesystem;

TEST(ModelConfig, ParsesAFullLlamaConfig) {
  auto j = json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 32.0, "rope_type": "llama3"},
    "max_position_embeddings": 131072, "tie_word_embeddings": true,
    "attention_bias": false, "mlp_bias": false, "hidden_act": "silu",
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16"})");
  auto c = parse_model_config(j);
  EXPECT_EQ(c.arch, architecture::llama);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_hidden_layers, 16);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.at("rope_type"), "llama3");
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfig, AppliesLlamaDefaults) {
  auto c = parse_model_config(json::parse(
      R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4})"));
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_TRUE(c.rope_scaling.is_null());
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_EQ(c.torch_dtype, "float32");
}

TEST(ModelConfig, HonoursLlamaBiasFlags) {
  auto c = parse_model_config(json::parse(
      R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_attention_heads": 4,
        "attention_bias": true, "mlp_bias": true})"));
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.mlp_bias);
}

TEST(ModelConfig, ParsesQwen2WithAlwaysOnAttentionBias) {
  auto c = parse_model_config(json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
    "tie_word_embeddings": true, "bos_token_id": 151643, "eos_token_id": 151643,
    "use_sliding_window": false, "sliding_window": 32768, "torch_dtype": "bfloat16"})"));
  EXPECT_EQ(c.arch, architecture::qwen2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{151643}));
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  // HF's Qwen2 ignores the key: biases are always there.
  auto d = parse_model_config(json::parse(
      R"({"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
        "attention_bias": false})"));
  EXPECT_TRUE(d.attention_bias);
  EXPECT_EQ(d.vocab_size, 151936);
  EXPECT_EQ(d.max_position_embeddings, 32768);
  EXPECT_FALSE(d.bos_token_id.has_value());
  EXPECT_TRUE(d.eos_token_ids.empty());
}

TEST(ModelConfig, ParsesQwen3WithItsHeadDim) {
  auto c = parse_model_config(json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "attention_bias": false, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000, "max_position_embeddings": 40960, "tie_word_embeddings": true,
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"})"));
  EXPECT_EQ(c.arch, architecture::qwen3);
  EXPECT_EQ(c.head_dim, 128); // not hidden / heads = 64
  EXPECT_FALSE(c.attention_bias);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  auto d = parse_model_config(
      json::parse(R"({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 4})"));
  EXPECT_EQ(d.head_dim, 128);
}

TEST(ModelConfig, AcceptsNewerHfSpellings) {
  auto c = parse_model_config(json::parse(
      R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10,
        "dtype": "float16", "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0},
        "bos_token_id": null, "eos_token_id": null})"));
  EXPECT_EQ(c.torch_dtype, "float16");
  EXPECT_DOUBLE_EQ(c.rope_theta, 250000.0);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(ModelConfig, RejectsUnknownOrConflictingArchitectures) {
  expect_error(
      [] { parse_model_config(json::parse(R"({"architectures": ["MistralForCausalLM"]})")); },
      error_code::unsupported, {"MistralForCausalLM"});
  expect_error([] { parse_model_config(json::parse(R"({"model_type": "gpt2"})")); },
               error_code::unsupported, {"gpt2"});
  expect_error([] { parse_model_config(json::parse(R"({"hidden_size": 64})")); },
               error_code::decode_error, {"names no architecture"});
  expect_error(
      [] {
        parse_model_config(
            json::parse(R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "llama"})"));
      },
      error_code::decode_error, {"Qwen2ForCausalLM", "llama"});
  expect_error([] { parse_model_config(json::parse("[1, 2]")); }, error_code::decode_error,
               {"object"});
  EXPECT_EQ(parse_architecture("Qwen3ForCausalLM"), architecture::qwen3);
  EXPECT_EQ(parse_architecture("qwen2"), architecture::qwen2);
}

TEST(ModelConfig, RejectsIllTypedFieldsNamingThem) {
  const std::string base = R"("model_type": "llama", "hidden_size": 64, "num_attention_heads": 4)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("vocab_size": "512")", "vocab_size"},
      {R"("hidden_size": 64.5)", "hidden_size"},
      {R"("rms_norm_eps": "1e-5")", "rms_norm_eps"},
      {R"("tie_word_embeddings": 1)", "tie_word_embeddings"},
      {R"("eos_token_id": "</s>")", "eos_token_id"},
      {R"("eos_token_id": [2, "x"])", "eos_token_id"},
      {R"("bos_token_id": 1.5)", "bos_token_id"},
      {R"("rope_scaling": 3)", "rope_scaling"},
      {R"("torch_dtype": 16)", "torch_dtype"},
      {R"("architectures": "LlamaForCausalLM")", "architectures"},
      {R"("num_key_value_heads": 18446744073709551615)", "num_key_value_heads"},
  };
  for (const auto& [field, needle] : cases) {
    auto text = "{" + base + ", " + field + "}";
    expect_error([&] { parse_model_config(json::parse(text)); }, error_code::decode_error,
                 {needle});
  }
}

TEST(ModelConfig, ValidateRejectsBadValuesNamingFieldAndValue) {
  struct bad_case {
    std::function<void(model_config&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<bad_case> cases = {
      {[](model_config& c) { c.vocab_size = 0; }, {"vocab_size", "0"}},
      {[](model_config& c) { c.hidden_size = -64; }, {"hidden_size", "-64"}},
      {[](model_config& c) { c.intermediate_size = 0; }, {"intermediate_size"}},
      {[](model_config& c) { c.num_hidden_layers = 0; }, {"num_hidden_layers"}},
      {[](model_config& c) { c.num_attention_heads = -1; }, {"num_attention_heads", "-1"}},
      {[](model_config& c) { c.num_key_value_heads = 3; }, {"num_key_value_heads", "3", "4"}},
      {[](model_config& c) { c.head_dim = 15; }, {"head_dim", "15"}},
      {[](model_config& c) { c.max_position_embeddings = 0; }, {"max_position_embeddings"}},
      {[](model_config& c) { c.rms_norm_eps = 0; }, {"rms_norm_eps"}},
      {[](model_config& c) { c.rope_theta = -1; }, {"rope_theta"}},
      {[](model_config& c) { c.bos_token_id = 512; }, {"bos_token_id", "512"}},
      {[](model_config& c) {
         c.eos_token_ids = {2, -3};
       },
       {"eos_token_id", "-3"}},
      {[](model_config& c) { c.torch_dtype = "int8"; }, {"torch_dtype", "int8"}},
      {[](model_config& c) { c.rope_scaling = json::array({1}); }, {"rope_scaling"}},
      {[](model_config& c) {
         c.arch = architecture::qwen2;
         c.attention_bias = false;
       },
       {"attention_bias", "qwen2"}},
      {[](model_config& c) {
         c.arch = architecture::qwen3;
         c.mlp_bias = true;
       },
       {"mlp_bias", "qwen3"}},
  };
  for (const auto& bc : cases) {
    auto c = preset("tiny");
    bc.edit(c);
    expect_error([&] { validate(c); }, error_code::invalid_argument, bc.needles);
  }
  // parse_model_config validates too.
  expect_error(
      [] {
        parse_model_config(
            json::parse(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 6})"));
      },
      error_code::invalid_argument, {"hidden_size", "64", "num_attention_heads = 6"});
  expect_error(
      [] {
        parse_model_config(json::parse(R"({"model_type": "llama", "hidden_size": 64,
                                         "num_attention_heads": 4, "num_key_value_heads": 3})"));
      },
      error_code::invalid_argument, {"num_key_value_heads", "3"});
}

TEST(ModelConfig, ToJsonIsHfCompatibleAndRoundTrips) {
  for (const auto& name : preset_names()) {
    auto c = preset(name);
    auto j = to_json(c);
    EXPECT_EQ(j.at("architectures"), json::array({hf_class_name(c.arch)})) << name;
    EXPECT_EQ(j.at("model_type"), to_string(c.arch)) << name;
    EXPECT_EQ(j.at("hidden_act"), "silu");
    EXPECT_EQ(j.at("eos_token_id"), 2) << "a single eos id is written as an int";
    EXPECT_EQ(parse_model_config(j), c) << name;
  }
  auto c = preset("tiny-qwen3");
  c.eos_token_ids = {2, 3};
  c.bos_token_id.reset();
  c.rope_scaling = json{{"rope_type", "yarn"}, {"factor", 4.0}};
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  c.torch_dtype = "bfloat16";
  auto j = to_json(c);
  EXPECT_EQ(j.at("eos_token_id"), json::array({2, 3}));
  EXPECT_TRUE(j.at("bos_token_id").is_null());
  EXPECT_EQ(parse_model_config(json::parse(j.dump())), c);
}

TEST(ModelConfig, LoadsFromADirectoryAndReportsMissingOrBrokenFiles) {
  temp_dir dir;
  dir.write("config.json", to_json(preset("small")).dump(2));
  EXPECT_EQ(load_model_config(dir.str()), preset("small"));

  temp_dir empty;
  expect_error([&] { load_model_config(empty.str()); }, error_code::not_found,
               {empty.str() + "/config.json"});
  temp_dir broken;
  broken.write("config.json", "{\"model_type\": ");
  expect_error([&] { load_model_config(broken.str()); }, error_code::decode_error,
               {"config.json", "not valid JSON"});
  temp_dir mistral;
  mistral.write("config.json", R"({"architectures": ["MistralForCausalLM"]})");
  expect_error([&] { load_model_config(mistral.str()); }, error_code::unsupported,
               {"config.json", "MistralForCausalLM"});
}

TEST(ModelConfig, PresetsHaveTheDocumentedShapesAndSizes) {
  auto t = preset("tiny");
  EXPECT_EQ(t.arch, architecture::llama);
  EXPECT_EQ(t.vocab_size, 512);
  EXPECT_EQ(t.hidden_size, 64);
  EXPECT_EQ(t.num_hidden_layers, 2);
  EXPECT_EQ(t.num_attention_heads, 4);
  EXPECT_EQ(t.num_key_value_heads, 2);
  EXPECT_EQ(t.head_dim, 16);
  EXPECT_EQ(t.intermediate_size, 128);
  EXPECT_EQ(t.max_position_embeddings, 512);
  EXPECT_EQ(preset("tiny-qwen2").arch, architecture::qwen2);
  EXPECT_EQ(preset("tiny-qwen3").arch, architecture::qwen3);
  auto s = preset("small");
  EXPECT_EQ(s.hidden_size, 256);
  EXPECT_EQ(s.num_hidden_layers, 4);
  EXPECT_EQ(s.num_key_value_heads, 4);
  EXPECT_EQ(s.intermediate_size, 688);
  EXPECT_EQ(s.vocab_size, 4096);
  // The shape of Qwen2.5-0.5B: its published parameter count.
  EXPECT_EQ(num_parameters(preset("qwen2.5-0.5b")), 494032768);
  EXPECT_EQ(preset("qwen2.5-0.5b").arch, architecture::qwen2);
  for (const auto& name : preset_names())
    EXPECT_NO_THROW(validate(preset(name))) << name;

  // Hand counts: tiny = 2·512·64 (embed + head) + 2·(2·64·64 + 2·32·64 + 3·64·128 + 2·64) + 64.
  EXPECT_EQ(num_parameters(t),
            2 * 512 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128 + 128) + 64);
  EXPECT_EQ(num_parameters(t), 139584);
  EXPECT_EQ(num_parameters(preset("tiny-qwen2")), 139584 + 2 * (64 + 32 + 32));
  EXPECT_EQ(num_parameters(preset("tiny-qwen3")), 139584 + 2 * (16 + 16));
  EXPECT_EQ(num_parameters(s), 4999424);
  t.tie_word_embeddings = true;
  EXPECT_EQ(num_parameters(t), 139584 - 512 * 64);
}

TEST(ModelConfig, UnknownPresetListsTheValidNames) {
  expect_error([] { preset("huge"); }, error_code::not_found,
               {"huge", "tiny", "tiny-qwen2", "tiny-qwen3", "small"});
}
