// tinker/loss_catalog.hpp: the one table of Tinker losses, their keys, domains, inputs and their
// mapping onto the trainer's loss registry.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/tinker/test_support.hpp"
#include "tinker/loss_catalog.hpp"

namespace rlforge::tinker::test {
namespace {

constexpr auto policy = model_role::policy;
constexpr auto critic = model_role::critic;

TEST(TinkerLossCatalog, NamesKeysAndInputs) {
  const auto& names = loss_names();
  for (const char* n : {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo",
                        "dppo", "ppo_critic"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_EQ(loss_config_keys("ppo"),
            (std::vector<std::string>{"clip_high_threshold", "clip_low_threshold", "value_clip"}));
  EXPECT_EQ(loss_config_keys("dro"), (std::vector<std::string>{"beta"}));
  EXPECT_TRUE(loss_config_keys("cross_entropy").empty());
  expect_user_error([] { loss_config_keys("grpo"); }, {"unknown loss_fn 'grpo'", "ppo_critic"});
  EXPECT_EQ(loss_input_names().size(), 6u);
}

TEST(TinkerLossCatalog, MapsOntoTheRegistryWithTinkerDefaults) {
  auto ppo = resolve_loss("ppo", {}, policy);
  EXPECT_EQ(ppo.name, "regular");
  EXPECT_NEAR(ppo.values.at("eps_clip_low"), 0.2, 1e-12);
  EXPECT_NEAR(ppo.values.at("eps_clip_high"), 0.2, 1e-12);
  EXPECT_EQ(ppo.required_inputs,
            (std::vector<std::string>{"target_tokens", "logprobs", "advantages"}));
  auto custom =
      resolve_loss("ppo", {{"clip_low_threshold", 0.7}, {"clip_high_threshold", 1.3}}, policy);
  EXPECT_NEAR(custom.values.at("eps_clip_low"), 0.3, 1e-12);
  EXPECT_NEAR(custom.values.at("eps_clip_high"), 0.3, 1e-12);
  // value_clip is a critic's key: a policy ignores it.
  EXPECT_EQ(resolve_loss("ppo", {{"value_clip", 0.5}}, policy).values.size(), 2u);
  auto cispo = resolve_loss("cispo", {}, policy);
  EXPECT_EQ(cispo.values.at("cispo_eps_clip_low"), 1.0);
  EXPECT_EQ(cispo.values.at("cispo_eps_clip_high"), 3.0);
  auto cispo2 =
      resolve_loss("cispo", {{"clip_low_threshold", 0.5}, {"clip_high_threshold", 2.0}}, policy);
  EXPECT_EQ(cispo2.values.at("cispo_eps_clip_low"), 0.5);
  EXPECT_EQ(cispo2.values.at("cispo_eps_clip_high"), 1.0);
  auto value = resolve_loss("ppo", {{"value_clip", 0.5}, {"clip_low_threshold", 0.8}}, critic);
  EXPECT_EQ(value.name, "ppo_critic");
  EXPECT_EQ(value.values, (std::map<std::string, double>{{"value_clip", 0.5}}));
  EXPECT_EQ(value.required_inputs,
            (std::vector<std::string>{"target_tokens", "values", "returns"}));
  EXPECT_EQ(resolve_loss("ppo_critic", {}, critic).name, "ppo_critic");
  EXPECT_EQ(resolve_loss("gspo", {{"clip_high_threshold", 1.1}}, policy).name, "gspo");
  EXPECT_EQ(resolve_loss("dro", {{"beta", 0.1}}, policy).values.at("beta"), 0.1);
  auto ce = resolve_loss("cross_entropy", {}, policy);
  EXPECT_EQ(ce.name, "cross_entropy");
  EXPECT_EQ(ce.required_inputs, (std::vector<std::string>{"target_tokens"}));
  EXPECT_EQ(resolve_loss("dppo", {{"delta_low", 0.1}}, policy).values.at("delta_low"), 0.1);
  EXPECT_NO_THROW(resolve_loss("ppo_critic",
                               {{"value_clip", std::numeric_limits<double>::infinity()}}, critic));
}

TEST(TinkerLossCatalog, RefusesUnknownLossesKeysValuesAndRoles) {
  expect_user_error([] { resolve_loss("ppo2", {}, policy); },
                    {"unknown loss_fn 'ppo2'", "cispo", "importance_sampling"});
  expect_user_error(
      [] {
        resolve_loss("ppo", {{"clip_ratio", 0.2}}, policy);
      },
      {"unknown loss_fn_config key 'clip_ratio'",
       "allowed keys: clip_high_threshold, clip_low_threshold, value_clip"});
  expect_user_error(
      [] {
        resolve_loss("importance_sampling", {{"beta", 1}}, policy);
      },
      {"unknown loss_fn_config key 'beta'", "allowed keys: none"});
  expect_user_error(
      [] {
        resolve_loss("ppo", {{"clip_low_threshold", 1.5}}, policy);
      },
      {"'clip_low_threshold' must be in [0, 1], got 1.5"});
  expect_user_error(
      [] {
        resolve_loss("cispo", {{"clip_high_threshold", 0.9}}, policy);
      },
      {"'clip_high_threshold' must be a finite number >= 1, got 0.9"});
  expect_user_error(
      [] {
        resolve_loss("ppo", {{"clip_high_threshold", std::nan("")}}, policy);
      },
      {"must be a number, got nan"});
  expect_user_error([] { resolve_loss("dro", {}, policy); }, {"'beta' is required"});
  expect_user_error(
      [] {
        resolve_loss("dro", {{"beta", -1}}, policy);
      },
      {"'beta' must be a finite number >= 0, got -1"});
  expect_user_error(
      [] {
        resolve_loss("dppo", {{"delta_low", -0.1}}, policy);
      },
      {"'delta_low' must be a finite number >= 0"});
  expect_user_error(
      [] {
        resolve_loss("ppo_critic", {{"value_clip", -1}}, critic);
      },
      {"'value_clip' must be a number >= 0"});
  expect_user_error([] { resolve_loss("ppo_critic", {}, policy); },
                    {"'ppo_critic' is a value loss", "policy"});
  expect_user_error([] { resolve_loss("cispo", {}, critic); },
                    {"'cispo' is a policy loss", "critic"});
}

} // namespace
} // namespace rlforge::tinker::test
