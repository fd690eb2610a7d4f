#include "tinker/loss_catalog.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "strings/format.hpp"
#include "tinker/error.hpp"

namespace rlforge::tinker {

namespace {

/// How a config value is checked.
enum class domain {
  unit_interval, ///< [0, 1]
  at_least_one,  ///< finite, >= 1
  non_negative,  ///< finite, >= 0
  clip_or_inf,   ///< >= 0; inf = off
};

struct key_spec {
  std::string name;
  domain dom;
};

/// One row of the table (see the header).
struct entry {
  std::vector<key_spec> keys;
  bool policy = true;  ///< a policy may train with it
  bool critic = false; ///< a critic may train with it
};

const std::map<std::string, entry>& table() {
  static const std::map<std::string, entry> t = {
      {"cross_entropy", {{}, true, false}},
      {"importance_sampling", {{}, true, false}},
      {"ppo",
       {{{"clip_high_threshold", domain::at_least_one},
         {"clip_low_threshold", domain::unit_interval},
         {"value_clip", domain::clip_or_inf}},
        true,
        true}},
      {"ppo_critic", {{{"value_clip", domain::clip_or_inf}}, false, true}},
      {"gspo",
       {{{"clip_high_threshold", domain::at_least_one},
         {"clip_low_threshold", domain::unit_interval}},
        true,
        false}},
      {"cispo",
       {{{"clip_high_threshold", domain::at_least_one},
         {"clip_low_threshold", domain::unit_interval}},
        true,
        false}},
      {"dppo",
       {{{"delta_high", domain::non_negative}, {"delta_low", domain::non_negative}}, true, false}},
      {"dro", {{{"beta", domain::non_negative}}, true, false}},
  };
  return t;
}

using strings::join;
using strings::number_text;

const entry& find(const std::string& loss_fn) {
  auto it = table().find(loss_fn);
  if (it == table().end())
    fail_user("unknown loss_fn '" + loss_fn + "'; accepted: " + join(loss_names()));
  return it->second;
}

void check_value(const std::string& loss_fn, const key_spec& k, double v) {
  auto bad = [&](const char* what) {
    fail_user("loss '" + loss_fn + "': loss_fn_config key '" + k.name + "' must be " + what +
              ", got " + number_text(v));
  };
  if (std::isnan(v))
    bad("a number");
  switch (k.dom) {
  case domain::unit_interval:
    if (!(v >= 0.0 && v <= 1.0))
      bad("in [0, 1]");
    break;
  case domain::at_least_one:
    if (!std::isfinite(v) || v < 1.0)
      bad("a finite number >= 1");
    break;
  case domain::non_negative:
    if (!std::isfinite(v) || v < 0.0)
      bad("a finite number >= 0");
    break;
  case domain::clip_or_inf:
    if (v < 0.0)
      bad("a number >= 0 (inf disables clipping)");
    break;
  }
}

double get(const std::map<std::string, double>& config, const char* key, double fallback) {
  auto it = config.find(key);
  return it == config.end() ? fallback : it->second;
}

} // namespace

const char* to_string(model_role x) noexcept {
  return x == model_role::critic ? "critic" : "policy";
}

const std::vector<std::string>& loss_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, e] : table())
      out.push_back(name);
    return out;
  }();
  return names;
}

std::vector<std::string> loss_config_keys(const std::string& loss_fn) {
  std::vector<std::string> out;
  for (const auto& k : find(loss_fn).keys)
    out.push_back(k.name);
  std::sort(out.begin(), out.end());
  return out;
}

const std::vector<std::string>& loss_input_names() {
  static const std::vector<std::string> names = {"target_tokens", "weights", "logprobs",
                                                 "advantages",    "values",  "returns"};
  return names;
}

resolved_loss resolve_loss(const std::string& loss_fn, const std::map<std::string, double>& config,
                           model_role role) {
  const auto& e = find(loss_fn);
  const bool critic = role == model_role::critic;
  if (critic && !e.critic)
    fail_user("loss '" + loss_fn +
              "' is a policy loss; a critic trains only with ppo or "
              "ppo_critic");
  if (!critic && !e.policy)
    fail_user("loss '" + loss_fn + "' is a value loss; a policy cannot train with it");
  for (const auto& [key, v] : config) {
    auto k = std::find_if(e.keys.begin(), e.keys.end(),
                          [&, name = key](const key_spec& s) { return s.name == name; });
    if (k == e.keys.end())
      fail_user("loss '" + loss_fn + "': unknown loss_fn_config key '" + key +
                "'; allowed keys: " + join(loss_config_keys(loss_fn), "none"));
    check_value(loss_fn, *k, v);
  }
  resolved_loss out;
  out.tinker_name = loss_fn;
  out.required_inputs = {"target_tokens"};
  if (critic) {
    out.name = "ppo_critic";
    if (auto v = config.find("value_clip"); v != config.end())
      out.values["value_clip"] = v->second;
    out.required_inputs.insert(out.required_inputs.end(), {"values", "returns"});
    return out;
  }
  if (loss_fn == "ppo" || loss_fn == "gspo") {
    out.name = loss_fn == "ppo" ? "regular" : "gspo";
    out.values["eps_clip_low"] = 1.0 - get(config, "clip_low_threshold", 0.8);
    out.values["eps_clip_high"] = get(config, "clip_high_threshold", 1.2) - 1.0;
  } else if (loss_fn == "cispo") {
    out.name = "cispo";
    out.values["cispo_eps_clip_low"] = 1.0 - get(config, "clip_low_threshold", 0.0);
    out.values["cispo_eps_clip_high"] = get(config, "clip_high_threshold", 4.0) - 1.0;
  } else if (loss_fn == "dro") {
    if (!config.count("beta"))
      fail_user("loss 'dro': loss_fn_config key 'beta' is required");
    out.name = "dro";
    out.values["beta"] = config.at("beta");
  } else {
    out.name = loss_fn; // cross_entropy, importance_sampling, dppo
    out.values = config;
  }
  if (loss_fn != "cross_entropy")
    out.required_inputs.insert(out.required_inputs.end(), {"logprobs", "advantages"});
  return out;
}

} // namespace rlforge::tinker
