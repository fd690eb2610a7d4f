#include "backends/model/hf_checkpoint.hpp"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>

#include "backends/error.hpp"
#include "backends/model/safetensors.hpp"
#include "strings/format.hpp"

namespace rlforge::backends {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* single_file_name = "model.safetensors";
constexpr const char* index_file_name = "model.safetensors.index.json";

using strings::in_quotes;

bool is_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

using strings::shape_text;

// "model-00002-of-00005.safetensors", the HF shard naming.
std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

bool looks_like_shard(const std::string& file) {
  return file.rfind("model-", 0) == 0 && ends_with(file, ".safetensors") &&
         file.find("-of-") != std::string::npos;
}

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(error_code::io_error, "cannot open " + in_quotes(path));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    fail(error_code::decode_error, in_quotes(path) + " is not valid JSON: " + e.what());
  }
}

std::map<std::string, at::Tensor> load_sharded(const std::string& dir,
                                               const std::string& index_path,
                                               const dtype_choice& keep_as) {
  json index = read_json_file(index_path);
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object())
    fail(error_code::decode_error, in_quotes(index_path) + " has no 'weight_map' object");
  std::map<std::string, std::set<std::string>> listed; // shard file -> tensor names
  for (const auto& [name, file] : index.at("weight_map").items()) {
    if (!file.is_string())
      fail(error_code::decode_error, in_quotes(index_path) + " maps tensor " + in_quotes(name) +
                                         " to " + file.dump() + ", not a file name");
    auto shard = file.get<std::string>();
    // Shards live next to the index; a path would let an index read arbitrary files.
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos)
      fail(error_code::decode_error,
           in_quotes(index_path) + " maps tensor " + in_quotes(name) + " to shard " +
               in_quotes(shard) + ", which is not a file name inside the checkpoint directory");
    listed[shard].insert(name);
  }
  if (listed.empty())
    fail(error_code::decode_error, in_quotes(index_path) + " has an empty 'weight_map'");

  std::map<std::string, at::Tensor> out;
  std::map<std::string, std::string> origin; // tensor name -> shard it came from
  for (const auto& [shard, names] : listed) {
    std::string path = dir + "/" + shard;
    if (!is_file(path))
      fail(error_code::not_found, in_quotes(index_path) + " maps tensor " +
                                      in_quotes(*names.begin()) + " to shard " + in_quotes(path) +
                                      ", which does not exist");
    for (auto& [name, tensor] : read_safetensors(path, keep_as)) {
      auto [it, inserted] = origin.emplace(name, shard);
      if (!inserted)
        fail(error_code::decode_error, "tensor " + in_quotes(name) + " is stored in two shards: " +
                                           in_quotes(it->second) + " and " + in_quotes(shard));
      if (names.count(name) == 0)
        fail(error_code::decode_error, "shard " + in_quotes(path) + " holds tensor " +
                                           in_quotes(name) + ", which " + in_quotes(index_path) +
                                           " does not map to it");
      out.emplace(name, std::move(tensor));
    }
    for (const auto& name : names)
      if (out.count(name) == 0)
        fail(error_code::decode_error, in_quotes(index_path) + " maps tensor " + in_quotes(name) +
                                           " to shard " + in_quotes(path) + ", which lacks it");
  }
  return out;
}

void remove_file(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec)
    fail(error_code::io_error, "cannot remove stale " + in_quotes(path) + ": " + ec.message());
}

// Removes shard files of an earlier save that are not among `keep`.
void remove_stale_shards(const std::string& dir, const std::set<std::string>& keep) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    auto file = entry.path().filename().string();
    if (looks_like_shard(file) && keep.count(file) == 0)
      remove_file(entry.path().string());
  }
  if (ec)
    fail(error_code::io_error, "cannot list " + in_quotes(dir) + ": " + ec.message());
}

} // namespace

std::map<std::string, at::Tensor> load_hf_weights(const std::string& dir,
                                                  const dtype_choice& keep_as) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail(error_code::not_found, "no checkpoint directory at " + in_quotes(dir));
  std::string single = dir + "/" + single_file_name;
  if (is_file(single))
    return read_safetensors(single, keep_as);
  std::string index = dir + "/" + index_file_name;
  if (is_file(index))
    return load_sharded(dir, index, keep_as);
  fail(error_code::not_found, "no weights in " + in_quotes(dir) + ": neither " + in_quotes(single) +
                                  " nor " + in_quotes(index) + " exists");
}

hf_checkpoint load_hf_checkpoint(const std::string& dir) {
  hf_checkpoint out;
  out.config = load_model_config(dir);
  out.weights = load_hf_weights(dir);
  try {
    check_weights_against_config(out.config, out.weights);
  } catch (const error& e) {
    fail(e.code(), "checkpoint " + in_quotes(dir) + ": " + e.what());
  }
  return out;
}

void save_hf_checkpoint(const std::string& dir, const model_config& config,
                        const std::map<std::string, at::Tensor>& weights,
                        std::optional<size_t> max_shard_bytes) {
  validate(config);
  check_weights_against_config(config, weights);
  if (max_shard_bytes && *max_shard_bytes == 0)
    fail(error_code::invalid_argument, "save_hf_checkpoint: max_shard_bytes = 0 is invalid: it "
                                       "must be positive");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    fail(error_code::io_error,
         "cannot create checkpoint directory " + in_quotes(dir) + ": " + ec.message());
  write_file_atomically(dir + "/config.json", to_json(config).dump(2) + "\n");
  const std::map<std::string, std::string> metadata{{"format", "pt"}};

  if (!max_shard_bytes) {
    write_safetensors(dir + "/" + single_file_name, weights, metadata);
    remove_file(dir + "/" + index_file_name);
    remove_stale_shards(dir, {});
    return;
  }

  // Greedy packing in name order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::map<std::string, at::Tensor>> shards(1);
  size_t current = 0;
  uint64_t total = 0;
  for (const auto& [name, tensor] : weights) {
    size_t bytes = tensor.nbytes();
    if (!shards.back().empty() && current + bytes > *max_shard_bytes) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().emplace(name, tensor);
    current += bytes;
    total += bytes;
  }
  json weight_map = json::object();
  std::set<std::string> written;
  for (size_t i = 0; i < shards.size(); ++i) {
    auto file = shard_name(i, shards.size());
    write_safetensors(dir + "/" + file, shards[i], metadata);
    written.insert(file);
    for (const auto& entry : shards[i])
      weight_map[entry.first] = file;
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomically(dir + "/" + index_file_name, index.dump(2) + "\n");
  // HF prefers model.safetensors over an index, so an old one must go.
  remove_file(dir + "/" + single_file_name);
  remove_stale_shards(dir, written);
}

std::vector<std::string> expected_weight_names(const model_config& c) {
  std::vector<std::string> names;
  for (const auto& entry : expected_weight_shapes(c))
    names.push_back(entry.first);
  // Present them in model order rather than alphabetically.
  auto rank = [&](const std::string& name) -> std::pair<int64_t, int64_t> {
    if (name == "model.embed_tokens.weight")
      return {-1, 0};
    if (name == "model.norm.weight")
      return {c.num_hidden_layers, 0};
    if (name == "lm_head.weight")
      return {c.num_hidden_layers + 1, 0};
    static const char* const order[] = {
        "self_attn.q_proj.weight", "self_attn.q_proj.bias",   "self_attn.k_proj.weight",
        "self_attn.k_proj.bias",   "self_attn.v_proj.weight", "self_attn.v_proj.bias",
        "self_attn.o_proj.weight", "self_attn.o_proj.bias",   "self_attn.q_norm.weight",
        "self_attn.k_norm.weight", "mlp.gate_proj.weight",    "mlp.gate_proj.bias",
        "mlp.up_proj.weight",      "mlp.up_proj.bias",        "mlp.down_proj.weight",
        "mlp.down_proj.bias",      "input_layernorm.weight",  "post_attention_layernorm.weight",
    };
    auto rest = name.substr(std::string("model.layers.").size());
    auto dot = rest.find('.');
    int64_t layer = std::stoll(rest.substr(0, dot));
    auto leaf = rest.substr(dot + 1);
    for (size_t k = 0; k < std::size(order); ++k)
      if (leaf == order[k])
        return {layer, static_cast<int64_t>(k)};
    return {layer, static_cast<int64_t>(std::size(order))};
  };
  std::stable_sort(names.begin(), names.end(),
                   [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
  return names;
}

std::map<std::string, std::vector<int64_t>> expected_weight_shapes(const model_config& c) {
  validate(c);
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  std::map<std::string, std::vector<int64_t>> shapes;
  shapes["model.embed_tokens.weight"] = {c.vocab_size, h};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto p = "model.layers." + std::to_string(i) + ".";
    shapes[p + "self_attn.q_proj.weight"] = {q, h};
    shapes[p + "self_attn.k_proj.weight"] = {kv, h};
    shapes[p + "self_attn.v_proj.weight"] = {kv, h};
    shapes[p + "self_attn.o_proj.weight"] = {h, q};
    if (c.attention_bias) {
      shapes[p + "self_attn.q_proj.bias"] = {q};
      shapes[p + "self_attn.k_proj.bias"] = {kv};
      shapes[p + "self_attn.v_proj.bias"] = {kv};
      // HF's Llama and Qwen3 put the bias on o_proj too; Qwen2 only on q/k/v.
      if (c.arch != architecture::qwen2)
        shapes[p + "self_attn.o_proj.bias"] = {h};
    }
    if (c.arch == architecture::qwen3) {
      shapes[p + "self_attn.q_norm.weight"] = {c.head_dim};
      shapes[p + "self_attn.k_norm.weight"] = {c.head_dim};
    }
    shapes[p + "mlp.gate_proj.weight"] = {inter, h};
    shapes[p + "mlp.up_proj.weight"] = {inter, h};
    shapes[p + "mlp.down_proj.weight"] = {h, inter};
    if (c.mlp_bias) {
      shapes[p + "mlp.gate_proj.bias"] = {inter};
      shapes[p + "mlp.up_proj.bias"] = {inter};
      shapes[p + "mlp.down_proj.bias"] = {h};
    }
    shapes[p + "input_layernorm.weight"] = {h};
    shapes[p + "post_attention_layernorm.weight"] = {h};
  }
  shapes["model.norm.weight"] = {h};
  if (!c.tie_word_embeddings)
    shapes["lm_head.weight"] = {c.vocab_size, h};
  return shapes;
}

std::string weight_check::describe() const {
  if (ok())
    return "weights match the config";
  std::string out;
  auto list = [&out](const char* what, const std::vector<std::string>& items) {
    if (items.empty())
      return;
    if (!out.empty())
      out += "; ";
    out += std::string(what) + " (" + std::to_string(items.size()) + "): ";
    for (size_t i = 0; i < items.size(); ++i)
      out += (i > 0 ? ", " : "") + items[i];
  };
  list("missing", missing);
  list("unexpected", unexpected);
  list("shape mismatch", shape_mismatches);
  return out;
}

weight_check compare_weights_to_config(const model_config& c,
                                       const std::map<std::string, at::Tensor>& weights) {
  auto shapes = expected_weight_shapes(c);
  weight_check out;
  for (const auto& [name, shape] : shapes) {
    auto it = weights.find(name);
    if (it == weights.end()) {
      out.missing.push_back(name);
      continue;
    }
    if (!it->second.defined()) {
      out.shape_mismatches.push_back(name + ": expected " + shape_text(shape) +
                                     ", got an undefined tensor");
      continue;
    }
    if (it->second.sizes() != at::IntArrayRef(shape))
      out.shape_mismatches.push_back(name + ": expected " + shape_text(shape) + ", got " +
                                     shape_text(it->second.sizes()));
  }
  for (const auto& [name, tensor] : weights) {
    if (shapes.count(name) > 0 || ends_with(name, ".rotary_emb.inv_freq"))
      continue;
    // Some tied checkpoints still store the (identical) head; HF ignores it.
    if (name == "lm_head.weight" && c.tie_word_embeddings) {
      auto embed = shapes.at("model.embed_tokens.weight");
      if (!tensor.defined() || tensor.sizes() != at::IntArrayRef(embed))
        out.shape_mismatches.push_back(
            name + ": expected " + shape_text(embed) + ", got " +
            (tensor.defined() ? shape_text(tensor.sizes()) : std::string("an undefined tensor")));
      continue;
    }
    out.unexpected.push_back(name);
  }
  return out;
}

void check_weights_against_config(const model_config& c,
                                  const std::map<std::string, at::Tensor>& weights) {
  auto check = compare_weights_to_config(c, weights);
  if (!check.ok())
    fail(error_code::invalid_argument, std::string("weights do not match the ") +
                                           to_string(c.arch) + " config: " + check.describe());
}

} // namespace rlforge::backends
