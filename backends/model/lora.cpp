#include "backends/model/lora.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "backends/error.hpp"
#include "backends/model/mixed_linear.hpp"
#include "backends/model/safetensors.hpp"

namespace rlforge::backends {

namespace {

/// The seven projections of a decoder layer (the default targets).
const std::vector<std::string>& layer_targets() {
  static const std::vector<std::string> names{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                              "gate_proj", "up_proj", "down_proj"};
  return names;
}

/// Every module an adapter may target: the layer projections and the unembedding.
const std::vector<std::string>& all_targets() {
  static const std::vector<std::string> names = [] {
    auto n = layer_targets();
    n.push_back("lm_head");
    return n;
  }();
  return names;
}

std::string normalise_target(const std::string& name) {
  for (auto& t : all_targets())
    if (name == t || name + "_proj" == t)
      return t;
  if (name == "unembed")
    return "lm_head";
  std::string known;
  for (auto& t : all_targets())
    known += (known.empty() ? "" : ", ") + t;
  fail(error_code::invalid_argument,
       "lora: unknown target module '" + name + "' (known: " + known + ")");
}

} // namespace

std::vector<std::string> lora_config::default_targets() {
  return layer_targets();
}

double lora_config::scaling() const {
  return rank > 0 ? alpha / static_cast<double>(rank) : 0.0;
}

void lora_config::validate() {
  if (rank < 0)
    fail(error_code::invalid_argument, "lora: rank must be >= 0, got " + std::to_string(rank));
  if (!std::isfinite(alpha))
    fail(error_code::invalid_argument, "lora: alpha must be finite, got " + std::to_string(alpha));
  if (!(dropout >= 0.0 && dropout < 1.0))
    fail(error_code::invalid_argument,
         "lora: dropout must lie in [0, 1), got " + std::to_string(dropout));
  if (rank > 0 && target_modules.empty())
    fail(error_code::invalid_argument, "lora: target_modules is empty");
  std::vector<std::string> normalised;
  for (auto& name : target_modules) {
    auto t = normalise_target(name);
    if (std::find(normalised.begin(), normalised.end(), t) != normalised.end())
      fail(error_code::invalid_argument, "lora: target module '" + name + "' listed twice");
    normalised.push_back(t);
  }
  target_modules = std::move(normalised);
}

nlohmann::json to_peft_json(const lora_config& config, const std::string& base_model) {
  return nlohmann::json{
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", config.rank},
      {"lora_alpha", config.alpha},
      {"lora_dropout", config.dropout},
      {"target_modules", config.target_modules},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"inference_mode", false},
      {"base_model_name_or_path", base_model},
  };
}

lora_config parse_peft_config(const nlohmann::json& j) {
  if (!j.is_object())
    fail(error_code::decode_error, "adapter_config.json: expected a JSON object");
  auto type = j.value("peft_type", std::string("LORA"));
  if (type != "LORA")
    fail(error_code::invalid_argument,
         "adapter_config.json: peft_type '" + type + "' is not supported (only LORA)");
  auto bias = j.value("bias", std::string("none"));
  if (bias != "none")
    fail(error_code::invalid_argument,
         "adapter_config.json: bias '" + bias + "' is not supported (only none)");
  if (j.value("fan_in_fan_out", false))
    fail(error_code::invalid_argument, "adapter_config.json: fan_in_fan_out=true is not supported");
  if (j.value("use_dora", false) || j.value("use_rslora", false))
    fail(error_code::invalid_argument,
         "adapter_config.json: use_dora / use_rslora are not supported");
  lora_config c;
  try {
    if (!j.contains("r"))
      fail(error_code::decode_error, "adapter_config.json: missing field 'r'");
    c.rank = j.at("r").get<int64_t>();
    c.alpha = j.value("lora_alpha", 8.0);
    c.dropout = j.value("lora_dropout", 0.0);
    if (j.contains("target_modules") && !j.at("target_modules").is_null()) {
      auto& t = j.at("target_modules");
      if (t.is_string())
        fail(error_code::invalid_argument,
             "adapter_config.json: target_modules as a regular expression ('" +
                 t.get<std::string>() + "') is not supported; list the module names");
      c.target_modules = t.get<std::vector<std::string>>();
    }
  } catch (const nlohmann::json::exception& e) {
    fail(error_code::decode_error,
         std::string("adapter_config.json: ill-typed field: ") + e.what());
  }
  c.validate();
  return c;
}

void save_lora_adapter(const std::string& dir, const lora_adapter& adapter) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    fail(error_code::io_error, "save_lora_adapter: cannot create " + dir + ": " + ec.message());
  write_safetensors(dir + "/adapter_model.safetensors", adapter.tensors, {{"format", "pt"}});
  auto path = dir + "/adapter_config.json";
  std::ofstream out(path);
  out << to_peft_json(adapter.config, adapter.base_model).dump(2) << "\n";
  out.close();
  if (!out)
    fail(error_code::io_error, "save_lora_adapter: cannot write " + path);
}

lora_adapter load_lora_adapter(const std::string& dir) {
  auto config_path = dir + "/adapter_config.json";
  std::ifstream in(config_path);
  if (!in)
    fail(error_code::not_found, "load_lora_adapter: " + config_path + " not found");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    fail(error_code::decode_error,
         "load_lora_adapter: " + config_path + " is not JSON: " + e.what());
  }
  lora_adapter adapter;
  adapter.config = parse_peft_config(j);
  if (auto i = j.find("base_model_name_or_path"); i != j.end() && i->is_string())
    adapter.base_model = i->get<std::string>();
  auto tensors_path = dir + "/adapter_model.safetensors";
  if (!std::filesystem::exists(tensors_path))
    fail(error_code::not_found, "load_lora_adapter: " + tensors_path + " not found");
  for (auto& [name, t] : read_safetensors(tensors_path))
    adapter.tensors[name] = t.to(at::kFloat);
  return adapter;
}

at::Tensor merged_lora_weight(const at::Tensor& base, const at::Tensor& a, const at::Tensor& b_up,
                              double scaling) {
  auto out = base.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  out.add_(at::matmul(b_up, a), scaling);
  return out;
}

at::Tensor lora_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                       const at::Tensor& a, const at::Tensor& b_up, double scaling, double dropout,
                       bool training, const at::Tensor& weight_bf16) {
  auto y = weight_bf16.defined() ? mixed_linear(x, weight, weight_bf16, bias)
                                 : at::linear(x, weight, bias);
  if (!a.defined() && !b_up.defined())
    return y;
  auto shape = [](const at::Tensor& t) {
    if (!t.defined())
      return std::string("undefined");
    std::string out = "[";
    for (int64_t i = 0; i < t.dim(); ++i)
      out += (i ? ", " : "") + std::to_string(t.size(i));
    return out + "]";
  };
  const int64_t in = weight.size(1), out = weight.size(0);
  if (!a.defined() || a.dim() != 2 || a.size(1) != in)
    fail(error_code::invalid_argument,
         "lora_linear: lora_A must be [rank, " + std::to_string(in) + "], got " + shape(a));
  if (!b_up.defined() || b_up.dim() != 2 || b_up.size(0) != out || b_up.size(1) != a.size(0))
    fail(error_code::invalid_argument, "lora_linear: lora_B must be [" + std::to_string(out) +
                                           ", " + std::to_string(a.size(0)) + "], got " +
                                           shape(b_up));
  auto xa = training && dropout > 0 ? at::dropout(x, dropout, true) : x;
  return y + at::linear(at::linear(xa, a), b_up) * scaling;
}

} // namespace rlforge::backends
