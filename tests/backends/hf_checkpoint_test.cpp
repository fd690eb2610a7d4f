#include "backends/model/hf_checkpoint.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "backends/error.hpp"
#include "backends/model/safetensors.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::map<std::string, at::Tensor> random_weights(const model_config& c, uint64_t seed,
                                                 at::ScalarType dtype = at::kFloat) {
  at::manual_seed(seed);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, shape] : expected_weight_shapes(c))
    out[name] = at::randn(shape).to(dtype);
  return out;
}

void expect_same(const std::map<std::string, at::Tensor>& a,
                 const std::map<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(t.scalar_type(), b.at(name).scalar_type()) << name;
    EXPECT_TRUE(at::equal(t, b.at(name))) << name;
  }
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void write_json(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump();
}

} // namespace

TEST(HfCheckpoint, ExpectedNamesFollowHfLayoutInModelOrder) {
  auto c = preset("tiny");
  auto names = expected_weight_names(c);
  ASSERT_EQ(names.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_EQ(names[1], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(names[4], "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(names[10], "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(names[names.size() - 2], "model.norm.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  const std::set<std::string> layer0{
      "model.layers.0.self_attn.q_proj.weight",        "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",        "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.mlp.gate_proj.weight",           "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",           "model.layers.0.input_layernorm.weight",
      "model.layers.0.post_attention_layernorm.weight"};
  EXPECT_EQ(std::set<std::string>(names.begin() + 1, names.begin() + 10), layer0);

  c.tie_word_embeddings = true;
  auto tied = expected_weight_names(c);
  EXPECT_EQ(std::count(tied.begin(), tied.end(), "lm_head.weight"), 0);
  EXPECT_EQ(tied.size(), names.size() - 1);
}

TEST(HfCheckpoint, ExpectedShapesMatchClosedForms) {
  auto c = preset("tiny"); // hidden 64, 4 heads × 16, 2 kv heads, intermediate 128, vocab 512
  auto s = expected_weight_shapes(c);
  using v = std::vector<int64_t>;
  EXPECT_EQ(s.at("model.embed_tokens.weight"), (v{512, 64}));
  EXPECT_EQ(s.at("model.layers.1.self_attn.q_proj.weight"), (v{64, 64}));
  EXPECT_EQ(s.at("model.layers.1.self_attn.k_proj.weight"), (v{32, 64}));
  EXPECT_EQ(s.at("model.layers.1.self_attn.v_proj.weight"), (v{32, 64}));
  EXPECT_EQ(s.at("model.layers.1.self_attn.o_proj.weight"), (v{64, 64}));
  EXPECT_EQ(s.at("model.layers.1.mlp.gate_proj.weight"), (v{128, 64}));
  EXPECT_EQ(s.at("model.layers.1.mlp.up_proj.weight"), (v{128, 64}));
  EXPECT_EQ(s.at("model.layers.1.mlp.down_proj.weight"), (v{64, 128}));
  EXPECT_EQ(s.at("model.layers.1.input_layernorm.weight"), (v{64}));
  EXPECT_EQ(s.at("model.norm.weight"), (v{64}));
  EXPECT_EQ(s.at("lm_head.weight"), (v{512, 64}));

  auto q2 = expected_weight_shapes(preset("tiny-qwen2"));
  EXPECT_EQ(q2.at("model.layers.0.self_attn.q_proj.bias"), (v{64}));
  EXPECT_EQ(q2.at("model.layers.0.self_attn.k_proj.bias"), (v{32}));
  EXPECT_EQ(q2.at("model.layers.0.self_attn.v_proj.bias"), (v{32}));
  EXPECT_EQ(q2.count("model.layers.0.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(q2.count("model.layers.0.self_attn.q_norm.weight"), 0u);

  auto q3c = preset("tiny-qwen3");
  q3c.head_dim = 32; // explicit head_dim wider than hidden / heads
  auto q3 = expected_weight_shapes(q3c);
  EXPECT_EQ(q3.at("model.layers.0.self_attn.q_norm.weight"), (v{32}));
  EXPECT_EQ(q3.at("model.layers.0.self_attn.k_norm.weight"), (v{32}));
  EXPECT_EQ(q3.at("model.layers.0.self_attn.q_proj.weight"), (v{128, 64}));
  EXPECT_EQ(q3.at("model.layers.0.self_attn.k_proj.weight"), (v{64, 64}));
  EXPECT_EQ(q3.at("model.layers.0.self_attn.o_proj.weight"), (v{64, 128}));
  EXPECT_EQ(q3.count("model.layers.0.self_attn.q_proj.bias"), 0u);

  auto lb = preset("tiny");
  lb.attention_bias = true;
  lb.mlp_bias = true;
  auto l = expected_weight_shapes(lb);
  EXPECT_EQ(l.at("model.layers.0.self_attn.o_proj.bias"), (v{64}));
  EXPECT_EQ(l.at("model.layers.0.mlp.gate_proj.bias"), (v{128}));
  EXPECT_EQ(l.at("model.layers.0.mlp.down_proj.bias"), (v{64}));
}

TEST(HfCheckpoint, ExpectedShapesAddUpToTheParameterCount) {
  for (const auto& name : preset_names()) {
    for (bool tied : {false, true}) {
      auto c = preset(name);
      c.tie_word_embeddings = tied;
      int64_t total = 0;
      for (const auto& [n, shape] : expected_weight_shapes(c)) {
        int64_t numel = 1;
        for (auto d : shape)
          numel *= d;
        total += numel;
      }
      EXPECT_EQ(total, num_parameters(c)) << name << " tied=" << tied;
      EXPECT_EQ(expected_weight_names(c).size(), expected_weight_shapes(c).size());
    }
  }
}

TEST(HfCheckpoint, ExportThenReloadIsTheIdentity) {
  temp_dir dir;
  for (const auto& name : {"tiny", "tiny-qwen2", "tiny-qwen3"}) {
    auto c = preset(name);
    auto w = random_weights(c, 3);
    save_hf_checkpoint(dir.str(), c, w);
    EXPECT_EQ(dir.files(), (std::set<std::string>{"config.json", "model.safetensors"}));
    auto cp = load_hf_checkpoint(dir.str());
    EXPECT_EQ(cp.config, c) << name;
    expect_same(w, cp.weights);
    EXPECT_EQ(read_safetensors_file(dir.file("model.safetensors")).metadata.at("format"), "pt");
    auto j = read_json(dir.file("config.json"));
    EXPECT_EQ(j.at("architectures").at(0), hf_class_name(c.arch));
  }
}

TEST(HfCheckpoint, KeepsStoredDtypes) {
  temp_dir dir;
  auto c = preset("tiny");
  c.torch_dtype = "bfloat16";
  auto w = random_weights(c, 5, at::kBFloat16);
  save_hf_checkpoint(dir.str(), c, w, 20000);
  auto back = load_hf_weights(dir.str());
  expect_same(w, back);
  EXPECT_EQ(back.at("model.norm.weight").scalar_type(), at::kBFloat16);
}

TEST(HfCheckpoint, ShardedLoadEqualsSingleFileLoad) {
  temp_dir single, sharded;
  auto c = preset("tiny");
  auto w = random_weights(c, 11);
  save_hf_checkpoint(single.str(), c, w);
  const size_t limit = 40000;
  save_hf_checkpoint(sharded.str(), c, w, limit);

  auto index = read_json(sharded.file("model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& [n, t] : w)
    total += t.nbytes();
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
  std::set<std::string> shards;
  for (const auto& [n, file] : index.at("weight_map").items())
    shards.insert(file.get<std::string>());
  // 557,056 bytes in ≤ 40,000-byte shards, bar tensors larger than the limit on their own.
  ASSERT_GT(shards.size(), 5u);
  size_t i = 1;
  for (const auto& s : shards) {
    char expected[64];
    std::snprintf(expected, sizeof(expected), "model-%05zu-of-%05zu.safetensors", i++,
                  shards.size());
    EXPECT_EQ(s, expected);
    auto part = read_safetensors(sharded.file(s));
    size_t bytes = 0;
    for (const auto& [n, t] : part)
      bytes += t.nbytes();
    EXPECT_TRUE(bytes <= limit || part.size() == 1) << s << " holds " << bytes << " bytes";
  }
  EXPECT_EQ(sharded.files().count("model.safetensors"), 0u);
  expect_same(load_hf_weights(single.str()), load_hf_weights(sharded.str()));
  expect_same(w, load_hf_weights(sharded.str()));
}

TEST(HfCheckpoint, ResavingInTheOtherLayoutRemovesStaleFiles) {
  temp_dir dir;
  auto c = preset("tiny");
  auto w1 = random_weights(c, 1);
  save_hf_checkpoint(dir.str(), c, w1, 30000);
  EXPECT_GT(dir.files().size(), 3u);
  auto w2 = random_weights(c, 2);
  save_hf_checkpoint(dir.str(), c, w2);
  EXPECT_EQ(dir.files(), (std::set<std::string>{"config.json", "model.safetensors"}));
  expect_same(w2, load_hf_weights(dir.str()));
  auto w3 = random_weights(c, 3);
  save_hf_checkpoint(dir.str(), c, w3, 1000000);
  EXPECT_EQ(dir.files(), (std::set<std::string>{"config.json", "model-00001-of-00001.safetensors",
                                                "model.safetensors.index.json"}));
  expect_same(w3, load_hf_weights(dir.str()));
}

TEST(HfCheckpoint, ReportsMissingFilesNamingThem) {
  temp_dir dir;
  expect_error([&] { load_hf_weights(dir.file("nope")); }, error_code::not_found, {"nope"});
  expect_error([&] { load_hf_weights(dir.str()); }, error_code::not_found,
               {"model.safetensors", "model.safetensors.index.json"});
  expect_error([&] { load_hf_checkpoint(dir.str()); }, error_code::not_found, {"config.json"});

  auto c = preset("tiny");
  save_hf_checkpoint(dir.str(), c, random_weights(c, 4), 40000);
  auto index = read_json(dir.file("model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [n, f] : index.at("weight_map").items())
    shards.insert(f.get<std::string>());
  ASSERT_GT(shards.size(), 2u);
  auto victim = *std::next(shards.begin());
  fs::remove(dir.file(victim));
  expect_error([&] { load_hf_weights(dir.str()); }, error_code::not_found,
               {victim, "does not exist"});
}

TEST(HfCheckpoint, RejectsInconsistentShardIndexes) {
  std::map<std::string, at::Tensor> a{{"x", at::ones({2})}, {"y", at::zeros({3})}};
  std::map<std::string, at::Tensor> b{{"y", at::zeros({3})}, {"z", at::ones({1})}};
  {
    temp_dir dir;
    write_safetensors(dir.file("s1.safetensors"), a);
    write_safetensors(dir.file("s2.safetensors"), b);
    write_json(dir.file("model.safetensors.index.json"),
               {{"weight_map",
                 {{"x", "s1.safetensors"}, {"y", "s1.safetensors"}, {"z", "s2.safetensors"}}}});
    expect_error([&] { load_hf_weights(dir.str()); }, error_code::decode_error,
                 {"'y'", "s1.safetensors", "s2.safetensors", "two shards"});
  }
  {
    temp_dir dir;
    write_safetensors(dir.file("s1.safetensors"), a);
    write_json(dir.file("model.safetensors.index.json"),
               {{"weight_map",
                 {{"x", "s1.safetensors"}, {"y", "s1.safetensors"}, {"w", "s1.safetensors"}}}});
    expect_error([&] { load_hf_weights(dir.str()); }, error_code::decode_error,
                 {"'w'", "lacks it"});
  }
  {
    temp_dir dir;
    write_safetensors(dir.file("s1.safetensors"), a);
    write_json(dir.file("model.safetensors.index.json"),
               {{"weight_map", {{"x", "s1.safetensors"}}}});
    expect_error([&] { load_hf_weights(dir.str()); }, error_code::decode_error,
                 {"'y'", "does not map"});
  }
  {
    temp_dir dir;
    write_json(dir.file("model.safetensors.index.json"),
               {{"weight_map", {{"x", "../elsewhere.safetensors"}}}});
    expect_error([&] { load_hf_weights(dir.str()); }, error_code::decode_error,
                 {"../elsewhere.safetensors", "inside the checkpoint directory"});
  }
  {
    temp_dir dir;
    write_json(dir.file("model.safetensors.index.json"), {{"metadata", json::object()}});
    expect_error([&] { load_hf_weights(dir.str()); }, error_code::decode_error, {"weight_map"});
    write_json(dir.file("model.safetensors.index.json"), {{"weight_map", {{"x", 3}}}});
    expect_error([&] { load_hf_weights(dir.str()); }, error_code::decode_error, {"'x'"});
    std::ofstream(dir.file("model.safetensors.index.json")) << "{\"weight_map\": ";
    expect_error([&] { load_hf_weights(dir.str()); }, error_code::decode_error,
                 {"model.safetensors.index.json", "not valid JSON"});
  }
}

TEST(HfCheckpoint, CheckWeightsNamesMissingUnexpectedAndMisshapenTensors) {
  auto c = preset("tiny");
  auto w = random_weights(c, 9);
  EXPECT_NO_THROW(check_weights_against_config(c, w));

  w.erase("model.layers.1.mlp.up_proj.weight");
  w["model.layers.0.self_attn.q_proj.weight"] = at::zeros({64, 32});
  w["model.layers.0.extra.weight"] = at::zeros({1});
  w["model.layers.0.self_attn.rotary_emb.inv_freq"] = at::zeros({8}); // ignored, as HF does
  auto report = compare_weights_to_config(c, w);
  EXPECT_EQ(report.missing, (std::vector<std::string>{"model.layers.1.mlp.up_proj.weight"}));
  EXPECT_EQ(report.unexpected, (std::vector<std::string>{"model.layers.0.extra.weight"}));
  ASSERT_EQ(report.shape_mismatches.size(), 1u);
  EXPECT_EQ(report.shape_mismatches[0],
            "model.layers.0.self_attn.q_proj.weight: expected [64, 64], got [64, 32]");
  expect_error([&] { check_weights_against_config(c, w); }, error_code::invalid_argument,
               {"model.layers.1.mlp.up_proj.weight", "model.layers.0.extra.weight",
                "expected [64, 64], got [64, 32]"});
  temp_dir dir;
  expect_error([&] { save_hf_checkpoint(dir.str(), c, w); }, error_code::invalid_argument,
               {"model.layers.1.mlp.up_proj.weight"});
  EXPECT_TRUE(dir.files().empty());
}

TEST(HfCheckpoint, TiedConfigsTolerateAStoredHeadOfTheRightShape) {
  auto c = preset("tiny");
  c.tie_word_embeddings = true;
  auto w = random_weights(c, 2);
  EXPECT_NO_THROW(check_weights_against_config(c, w));
  w["lm_head.weight"] = w.at("model.embed_tokens.weight");
  EXPECT_NO_THROW(check_weights_against_config(c, w));
  w["lm_head.weight"] = at::zeros({512, 63});
  expect_error([&] { check_weights_against_config(c, w); }, error_code::invalid_argument,
               {"lm_head.weight", "[512, 64]", "[512, 63]"});
}

TEST(HfCheckpoint, SaveRejectsBadArguments) {
  temp_dir dir;
  auto c = preset("tiny");
  auto w = random_weights(c, 6);
  expect_error([&] { save_hf_checkpoint(dir.str(), c, w, 0); }, error_code::invalid_argument,
               {"max_shard_bytes", "0"});
  auto bad = c;
  bad.num_key_value_heads = 3;
  expect_error([&] { save_hf_checkpoint(dir.str(), bad, w); }, error_code::invalid_argument,
               {"num_key_value_heads", "3"});
  EXPECT_TRUE(dir.files().empty());
}
