#include "backends/model/lora.hpp"

#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/safetensors.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;

namespace {

lora_config config(int64_t rank, double alpha, std::vector<std::string> targets = {}) {
  lora_config c;
  c.rank = rank;
  c.alpha = alpha;
  if (!targets.empty())
    c.target_modules = std::move(targets);
  return c;
}

at::Tensor logits_of(causal_lm& m, const at::Tensor& ids) {
  c10::NoGradGuard ng;
  return m.logits(m.forward_hidden(ids));
}

// Gives every adapter's B non-zero values so the adapter changes the outputs.
void perturb_adapters(causal_lm& m) {
  c10::NoGradGuard ng;
  at::manual_seed(17);
  for (auto& [name, t] : m.named_parameters())
    if (name.find("lora_B") != std::string::npos)
      t.normal_(0.0, 0.05);
}

const auto ids = at::tensor({3, 14, 15, 92, 65, 35, 89, 79}, at::kLong).view({2, 4});

} // namespace

TEST(Lora, LinearMatchesClosedForm) {
  auto x = at::randn({3, 6});
  auto w = at::randn({5, 6});
  auto b = at::randn({5});
  auto a = at::randn({2, 6});
  auto up = at::randn({5, 2});
  auto y = lora_linear(x, w, b, a, up, 0.75);
  auto expected = x.matmul(w.t()) + b + 0.75 * x.matmul(a.t()).matmul(up.t());
  EXPECT_TRUE(at::allclose(y, expected, 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(lora_linear(x, w, b, {}, {}, 0.75), x.matmul(w.t()) + b, 1e-5, 1e-5));
  // Dropout only acts in training: evaluation is deterministic and equals the closed form.
  EXPECT_TRUE(at::allclose(lora_linear(x, w, b, a, up, 0.75, 0.5, false), expected, 1e-5, 1e-5));
  EXPECT_FALSE(at::allclose(lora_linear(x, w, b, a, up, 0.75, 0.5, true), expected, 1e-5, 1e-5));
}

TEST(Lora, FreshAdapterLeavesOutputsUnchanged) {
  auto model = causal_lm::random(preset("tiny-qwen2"), 1);
  auto before = logits_of(*model, ids);
  model->enable_lora(config(4, 8), 7);
  EXPECT_TRUE(model->has_lora());
  EXPECT_TRUE(at::equal(logits_of(*model, ids), before));
  // A is initialised (non-zero), B is zero.
  for (auto& [name, t] : model->named_parameters()) {
    if (name.find("lora_A") != std::string::npos) {
      EXPECT_GT(t.abs().sum().item<double>(), 0) << name;
    }
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_EQ(t.abs().sum().item<double>(), 0) << name;
    }
  }
}

TEST(Lora, OnlyAdapterParametersAreTrainable) {
  auto c = preset("tiny");
  auto model = causal_lm::random(c, 1);
  model->enable_lora(config(2, 4, {"q", "v_proj", "down"}), 3);
  int64_t expected = 0;
  for (auto& [name, t] : model->named_parameters()) {
    bool adapter = name.find(".lora_") != std::string::npos;
    EXPECT_EQ(t.requires_grad(), adapter) << name;
    if (adapter) {
      bool targeted = name.find("q_proj") != std::string::npos
                      || name.find("v_proj") != std::string::npos
                      || name.find("down_proj") != std::string::npos;
      EXPECT_TRUE(targeted) << name;
      expected += t.numel();
    }
  }
  // q: A [2, 64] + B [64, 2]; v: A [2, 64] + B [32, 2]; down: A [2, 128] + B [64, 2]; 2 layers.
  EXPECT_EQ(expected, 2 * (2 * 64 + 64 * 2 + 2 * 64 + 32 * 2 + 2 * 128 + 64 * 2));
  EXPECT_EQ(model->num_trainable_parameters(), expected);
  // A training step moves the adapters only.
  perturb_adapters(*model);
  auto r = sequence_logprobs(*model, ids, at::ones_like(ids));
  (-r.logprobs.sum()).backward();
  for (auto& [name, t] : model->named_parameters())
    EXPECT_EQ(t.grad().defined(), name.find(".lora_") != std::string::npos) << name;
}

TEST(Lora, MergedModelMatchesUnmerged) {
  auto model = causal_lm::random(preset("tiny-qwen3"), 2);
  model->enable_lora(config(4, 16), 9);
  perturb_adapters(*model);
  auto adapted = logits_of(*model, ids);
  auto plain = causal_lm::random(preset("tiny-qwen3"), 2);
  EXPECT_GT((adapted - logits_of(*plain, ids)).abs().max().item<double>(), 1e-3);
  // state_dict() carries the merged weights: a fresh model built from it matches.
  auto from_state = causal_lm::from_weights(model->config(), model->state_dict());
  EXPECT_LT((logits_of(*from_state, ids) - adapted).abs().max().item<double>(), 1e-5);
  // In-place merge drops the adapters and keeps the outputs.
  model->merge_lora();
  EXPECT_FALSE(model->has_lora());
  EXPECT_LT((logits_of(*model, ids) - adapted).abs().max().item<double>(), 1e-5);
  for (auto& [name, t] : model->named_parameters()) {
    EXPECT_EQ(name.find(".lora_"), std::string::npos) << name;
    EXPECT_TRUE(t.requires_grad()) << name;
  }
}

TEST(Lora, SavesPeftLayoutAndReloads) {
  auto model = causal_lm::random(preset("tiny"), 4);
  model->enable_lora(config(3, 6, {"q_proj", "k_proj", "gate_proj"}), 5);
  perturb_adapters(*model);
  auto adapted = logits_of(*model, ids);
  temp_dir dir("save");
  model->save_lora_adapter(dir.str(), "my-base");
  auto j = nlohmann::json::parse(std::ifstream(dir.path() / "adapter_config.json"));
  EXPECT_EQ(j.at("peft_type"), "LORA");
  EXPECT_EQ(j.at("r"), 3);
  EXPECT_EQ(j.at("lora_alpha"), 6.0);
  EXPECT_EQ(j.at("lora_dropout"), 0.0);
  EXPECT_EQ(j.at("bias"), "none");
  EXPECT_EQ(j.at("task_type"), "CAUSAL_LM");
  EXPECT_EQ(j.at("base_model_name_or_path"), "my-base");
  EXPECT_EQ(j.at("target_modules"), (std::vector<std::string>{"q_proj", "k_proj", "gate_proj"}));
  auto tensors = read_safetensors((dir.path() / "adapter_model.safetensors").string());
  EXPECT_EQ(tensors.size(), 2u * 3u * 2u);
  auto a = tensors.at("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  auto b = tensors.at("base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight");
  EXPECT_EQ(a.sizes(), (at::IntArrayRef{3, 64}));
  EXPECT_EQ(b.sizes(), (at::IntArrayRef{128, 3}));
  // A fresh base with the adapter loaded reproduces the adapted outputs.
  auto other = causal_lm::random(preset("tiny"), 4);
  other->load_lora_adapter(dir.str());
  EXPECT_EQ(other->lora().rank, 3);
  EXPECT_TRUE(at::equal(logits_of(*other, ids), adapted));
  for (auto& [name, t] : other->named_parameters())
    EXPECT_EQ(t.requires_grad(), name.find(".lora_") != std::string::npos) << name;
}

TEST(Lora, RejectsAdapterWithMismatchedRankOrShape) {
  auto model = causal_lm::random(preset("tiny"), 4);
  model->enable_lora(config(3, 6), 5);
  temp_dir dir("mismatch");
  model->save_lora_adapter(dir.str());
  // Claimed rank disagrees with the stored tensors.
  auto j = nlohmann::json::parse(std::ifstream(dir.path() / "adapter_config.json"));
  j["r"] = 4;
  std::ofstream(dir.path() / "adapter_config.json") << j.dump();
  auto target = causal_lm::random(preset("tiny"), 4);
  expect_error([&] { target->load_lora_adapter(dir.str()); }, error_code::invalid_argument,
               {"lora_A.weight", "[3, 64]", "rank 4"});
  EXPECT_FALSE(target->has_lora());
  // An adapter trained on a different base (other hidden size) is refused by name and shape.
  auto small = causal_lm::random(preset("small"), 1);
  j["r"] = 3;
  std::ofstream(dir.path() / "adapter_config.json") << j.dump();
  expect_error([&] { small->load_lora_adapter(dir.str()); }, error_code::invalid_argument,
               {"base_model.model.model.layers.0", "expected"});
  // A tensor for a module that is not targeted.
  auto fresh = causal_lm::random(preset("tiny"), 4);
  j["target_modules"] = {"q_proj"};
  std::ofstream(dir.path() / "adapter_config.json") << j.dump();
  expect_error([&] { fresh->load_lora_adapter(dir.str()); }, error_code::invalid_argument,
               {"not in target_modules"});
  expect_error([&] { fresh->load_lora_adapter((dir.path() / "missing").string()); },
               error_code::not_found, {"adapter_config.json"});
}

TEST(Lora, RejectsBadConfigurations) {
  auto model = causal_lm::random(preset("tiny"), 1);
  expect_error([&] { model->enable_lora(config(0, 8), 1); }, error_code::invalid_argument, {"rank", "0"});
  expect_error([&] { model->enable_lora(config(-2, 8), 1); }, error_code::invalid_argument, {"-2"});
  expect_error([&] { model->enable_lora(config(2, 8, {"qkv"}), 1); }, error_code::invalid_argument,
               {"qkv"});
  expect_error([&] { model->enable_lora(config(2, 8, {"q", "q_proj"}), 1); },
               error_code::invalid_argument, {"twice"});
  auto c = config(2, 8);
  c.dropout = 1.0;
  expect_error([&] { model->enable_lora(c, 1); }, error_code::invalid_argument, {"dropout"});
  expect_error([&] { model->save_lora_adapter("unused"); }, error_code::invalid_argument,
               {"no LoRA"});
  expect_error([] { parse_peft_config({{"peft_type", "IA3"}, {"r", 2}}); },
               error_code::invalid_argument, {"IA3"});
  expect_error([] { parse_peft_config({{"peft_type", "LORA"}, {"r", 2}, {"bias", "all"}}); },
               error_code::invalid_argument, {"all"});
  expect_error([] { parse_peft_config({{"peft_type", "LORA"}, {"r", "two"}}); },
               error_code::decode_error, {"ill-typed"});
  auto parsed = parse_peft_config({{"peft_type", "LORA"}, {"r", 8}, {"lora_alpha", 32},
                                   {"target_modules", {"v_proj", "q_proj"}}});
  EXPECT_EQ(parsed.rank, 8);
  EXPECT_DOUBLE_EQ(parsed.scaling(), 4.0);
  EXPECT_EQ(parsed.target_modules, (std::vector<std::string>{"v_proj", "q_proj"}));
}

TEST(Lora, LinearRejectsAdapterShapesThatDoNotFit) {
  auto x = at::randn({3, 6});
  auto w = at::randn({5, 6});
  expect_error([&] { lora_linear(x, w, {}, at::randn({2, 7}), at::randn({5, 2}), 1.0); },
               error_code::invalid_argument, {"lora_A", "[2, 7]"});
  expect_error([&] { lora_linear(x, w, {}, at::randn({2, 6}), at::randn({5, 3}), 1.0); },
               error_code::invalid_argument, {"lora_B", "[5, 3]"});
  expect_error([&] { lora_linear(x, w, {}, at::randn({2, 6}), {}, 1.0); },
               error_code::invalid_argument, {"lora_B"});
}

TEST(Lora, SaveReportsUnwritableDirectory) {
  lora_adapter adapter;
  adapter.config = config(2, 4);
  adapter.tensors["base_model.model.x.lora_A.weight"] = at::zeros({2, 3});
  temp_dir dir("unwritable");
  auto file = dir.path() / "a_file";
  std::ofstream(file) << "x";
  // A directory cannot be created beneath a regular file.
  expect_error([&] { save_lora_adapter((file / "sub").string(), adapter); }, error_code::io_error,
               {"a_file"});
}

TEST(Lora, DropoutActsOnlyInTrainingMode) {
  auto model = causal_lm::random(preset("tiny"), 4);
  auto c = config(4, 8);
  c.dropout = 0.5;
  model->enable_lora(c, 2);
  perturb_adapters(*model);
  EXPECT_FALSE(model->training());
  auto eval1 = logits_of(*model, ids);
  EXPECT_TRUE(at::equal(logits_of(*model, ids), eval1));
  model->set_training(true);
  at::manual_seed(1);
  auto train1 = logits_of(*model, ids);
  EXPECT_GT((train1 - eval1).abs().max().item<double>(), 1e-4);
  model->set_training(false);
  EXPECT_TRUE(at::equal(logits_of(*model, ids), eval1));
}
