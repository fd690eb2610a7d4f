#include "backends/model/model_config.hpp"

#include <cmath>
#include <fstream>
#include <sstream>
#include <sys/stat.h>

#include "backends/error.hpp"
#include "strings/format.hpp"

namespace rlforge::backends {

namespace {

using nlohmann::json;

using strings::in_quotes;

[[noreturn]] void ill_typed(const char* key, const char* want, const json& got) {
  fail(error_code::decode_error,
       std::string("config.json: field '") + key + "' must be " + want + ", got " + got.dump());
}

// Absent or null fields keep the architecture's default.
bool present(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && !it->is_null();
}

// The field `key` when present, after checking that `(v.*is_kind)()` holds (else decode_error
// saying it must be `want`); nullptr when absent or null.
const json* typed_field(const json& j, const char* key, bool (json::*is_kind)() const noexcept,
                        const char* want) {
  if (!present(j, key))
    return nullptr;
  const auto& v = j.at(key);
  if (!(v.*is_kind)())
    ill_typed(key, want, v);
  return &v;
}

void read_int(const json& j, const char* key, int64_t& out) {
  const json* v = typed_field(j, key, &json::is_number_integer, "an integer");
  if (v == nullptr)
    return;
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    ill_typed(key, "an integer below 2^63", *v);
  out = v->get<int64_t>();
}

void read_number(const json& j, const char* key, double& out) {
  if (const json* v = typed_field(j, key, &json::is_number, "a number"))
    out = v->get<double>();
}

void read_bool(const json& j, const char* key, bool& out) {
  if (const json* v = typed_field(j, key, &json::is_boolean, "true or false"))
    out = v->get<bool>();
}

int64_t token_id(const char* key, const json& v) {
  if (!v.is_number_integer())
    ill_typed(key, "a token id (an integer)", v);
  return v.get<int64_t>();
}

architecture detect_architecture(const json& j) {
  std::optional<architecture> from_class, from_type;
  std::string class_name, type_name;
  if (present(j, "architectures")) {
    const auto& a = j.at("architectures");
    if (!a.is_array())
      ill_typed("architectures", "a list of class names", a);
    if (!a.empty()) {
      if (!a[0].is_string())
        ill_typed("architectures", "a list of class names", a);
      class_name = a[0].get<std::string>();
      from_class = parse_architecture(class_name);
    }
  }
  if (present(j, "model_type")) {
    const auto& t = j.at("model_type");
    if (!t.is_string())
      ill_typed("model_type", "a string", t);
    type_name = t.get<std::string>();
    from_type = parse_architecture(type_name);
  }
  if (from_class && from_type && *from_class != *from_type)
    fail(error_code::decode_error, "config.json: 'architectures' names " + class_name +
                                       " but 'model_type' is " + in_quotes(type_name));
  if (from_class)
    return *from_class;
  if (from_type)
    return *from_type;
  fail(error_code::decode_error,
       "config.json names no architecture (neither 'architectures' nor 'model_type' is set)");
}

// HF's constructor defaults for each architecture.
model_config defaults_for(architecture arch) {
  model_config c;
  c.arch = arch;
  switch (arch) {
  case architecture::llama:
    c.vocab_size = 32000;
    c.intermediate_size = 11008;
    c.max_position_embeddings = 2048;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    break;
  case architecture::qwen2:
  case architecture::qwen3:
    c.vocab_size = 151936;
    c.intermediate_size = 22016;
    c.max_position_embeddings = 32768;
    c.attention_bias = arch == architecture::qwen2;
    break;
  }
  c.hidden_size = 4096;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  return c;
}

const char* const known_dtypes[] = {"float32", "float16", "bfloat16", "float64"};

[[noreturn]] void invalid(const std::string& field, const std::string& value,
                          const std::string& why) {
  fail(error_code::invalid_argument,
       "model config: " + field + " = " + value + " is invalid: " + why);
}

} // namespace

const char* to_string(architecture x) noexcept {
  switch (x) {
  case architecture::llama:
    return "llama";
  case architecture::qwen2:
    return "qwen2";
  case architecture::qwen3:
    return "qwen3";
  }
  return "unknown";
}

const char* hf_class_name(architecture x) noexcept {
  switch (x) {
  case architecture::llama:
    return "LlamaForCausalLM";
  case architecture::qwen2:
    return "Qwen2ForCausalLM";
  case architecture::qwen3:
    return "Qwen3ForCausalLM";
  }
  return "unknown";
}

architecture parse_architecture(const std::string& name) {
  for (auto a : {architecture::llama, architecture::qwen2, architecture::qwen3})
    if (name == to_string(a) || name == hf_class_name(a))
      return a;
  fail(error_code::unsupported, "unsupported architecture " + in_quotes(name) +
                                    " (supported: llama, qwen2, qwen3 / LlamaForCausalLM, "
                                    "Qwen2ForCausalLM, Qwen3ForCausalLM)");
}

model_config parse_model_config(const json& j) {
  if (!j.is_object())
    fail(error_code::decode_error, "config.json: expected a JSON object, got " + j.dump());
  model_config c = defaults_for(detect_architecture(j));
  read_int(j, "vocab_size", c.vocab_size);
  read_int(j, "hidden_size", c.hidden_size);
  read_int(j, "intermediate_size", c.intermediate_size);
  read_int(j, "num_hidden_layers", c.num_hidden_layers);
  read_int(j, "num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = c.num_attention_heads;
  read_int(j, "num_key_value_heads", c.num_key_value_heads);
  if (c.arch == architecture::qwen3) {
    c.head_dim = 128;
  } else if (!present(j, "head_dim") && c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0)
      invalid("hidden_size", std::to_string(c.hidden_size),
              "must be a multiple of num_attention_heads = " +
                  std::to_string(c.num_attention_heads) + " when head_dim is not given");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  read_int(j, "head_dim", c.head_dim);
  read_number(j, "rms_norm_eps", c.rms_norm_eps);
  // Newer HF writes rope_theta inside "rope_parameters".
  if (present(j, "rope_parameters") && j.at("rope_parameters").is_object())
    read_number(j.at("rope_parameters"), "rope_theta", c.rope_theta);
  read_number(j, "rope_theta", c.rope_theta);
  if (present(j, "rope_scaling")) {
    if (!j.at("rope_scaling").is_object())
      ill_typed("rope_scaling", "an object or null", j.at("rope_scaling"));
    c.rope_scaling = j.at("rope_scaling");
  }
  read_int(j, "max_position_embeddings", c.max_position_embeddings);
  read_bool(j, "tie_word_embeddings", c.tie_word_embeddings);
  // HF's Qwen2 attention always has q/k/v biases whatever the config says.
  if (c.arch != architecture::qwen2)
    read_bool(j, "attention_bias", c.attention_bias);
  if (c.arch == architecture::llama)
    read_bool(j, "mlp_bias", c.mlp_bias);

  if (j.contains("bos_token_id"))
    c.bos_token_id = j.at("bos_token_id").is_null()
                         ? std::nullopt
                         : std::optional<int64_t>(token_id("bos_token_id", j.at("bos_token_id")));
  if (j.contains("eos_token_id")) {
    const auto& e = j.at("eos_token_id");
    c.eos_token_ids.clear();
    if (e.is_array()) {
      for (const auto& id : e)
        c.eos_token_ids.push_back(token_id("eos_token_id", id));
    } else if (!e.is_null()) {
      c.eos_token_ids.push_back(token_id("eos_token_id", e));
    }
  }
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (present(j, key)) {
      if (!j.at(key).is_string())
        ill_typed(key, "a dtype name", j.at(key));
      c.torch_dtype = j.at(key).get<std::string>();
    }
  }
  validate(c);
  return c;
}

model_config load_model_config(const std::string& dir) {
  std::string path = dir + "/config.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail(error_code::not_found, "no config.json at " + in_quotes(path));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(error_code::io_error, "cannot open " + in_quotes(path));
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    fail(error_code::decode_error, in_quotes(path) + " is not valid JSON: " + e.what());
  }
  try {
    return parse_model_config(j);
  } catch (const error& e) {
    fail(e.code(), in_quotes(path) + ": " + e.what());
  }
}

json to_json(const model_config& c) {
  json j = {
      {"architectures", {hf_class_name(c.arch)}},
      {"model_type", to_string(c.arch)},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", c.rope_scaling},
      {"max_position_embeddings", c.max_position_embeddings},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"attention_bias", c.attention_bias},
      {"attention_dropout", 0.0},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"torch_dtype", c.torch_dtype},
  };
  if (c.arch == architecture::llama)
    j["mlp_bias"] = c.mlp_bias;
  else
    j["use_sliding_window"] = false;
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.empty())
    j["eos_token_id"] = nullptr;
  else if (c.eos_token_ids.size() == 1)
    j["eos_token_id"] = c.eos_token_ids.front();
  else
    j["eos_token_id"] = c.eos_token_ids;
  return j;
}

void validate(const model_config& c) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings},
  };
  for (const auto& [field, value] : sizes)
    if (value <= 0)
      invalid(field, std::to_string(value), "must be positive");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    invalid("num_key_value_heads", std::to_string(c.num_key_value_heads),
            "must divide num_attention_heads = " + std::to_string(c.num_attention_heads));
  if (c.head_dim % 2 != 0)
    invalid("head_dim", std::to_string(c.head_dim), "rotary embeddings need an even head_dim");
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    invalid("rms_norm_eps", std::to_string(c.rms_norm_eps), "must be positive and finite");
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    invalid("rope_theta", std::to_string(c.rope_theta), "must be positive and finite");
  if (!c.rope_scaling.is_null() && !c.rope_scaling.is_object())
    invalid("rope_scaling", c.rope_scaling.dump(), "must be an object or null");
  auto check_id = [&](const char* field, int64_t id) {
    if (id < 0 || id >= c.vocab_size)
      invalid(field, std::to_string(id),
              "must lie in [0, vocab_size = " + std::to_string(c.vocab_size) + ")");
  };
  if (c.bos_token_id)
    check_id("bos_token_id", *c.bos_token_id);
  for (auto id : c.eos_token_ids)
    check_id("eos_token_id", id);
  bool known_dtype = false;
  for (const char* d : known_dtypes)
    known_dtype = known_dtype || c.torch_dtype == d;
  if (!known_dtype)
    invalid("torch_dtype", in_quotes(c.torch_dtype),
            "expected one of float32, float16, bfloat16, float64");
  if (c.arch == architecture::qwen2 && !c.attention_bias)
    invalid("attention_bias", "false", "qwen2 always has q/k/v projection biases");
  if (c.arch != architecture::llama && c.mlp_bias)
    invalid("mlp_bias", "true", std::string(to_string(c.arch)) + " has no MLP biases");
}

std::vector<std::string> preset_names() {
  return {"tiny", "tiny-qwen2", "tiny-qwen3", "small", "qwen2.5-0.5b"};
}

model_config preset(const std::string& name) {
  model_config c;
  c.arch = architecture::llama;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.torch_dtype = "float32";
  if (name == "tiny" || name == "tiny-qwen2" || name == "tiny-qwen3") {
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.max_position_embeddings = 512;
    if (name == "tiny-qwen2") {
      c.arch = architecture::qwen2;
      c.attention_bias = true;
    } else if (name == "tiny-qwen3") {
      c.arch = architecture::qwen3;
    }
  } else if (name == "qwen2.5-0.5b") {
    // The shape of Qwen2.5-0.5B (its config.json; random weights from `causal_lm::random`):
    // the GPU benches' model and what users train first.
    c.arch = architecture::qwen2;
    c.attention_bias = true;
    c.vocab_size = 151936;
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 14;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.max_position_embeddings = 32768;
    c.rope_theta = 1000000.0;
    c.tie_word_embeddings = true;
  } else if (name == "small") {
    c.vocab_size = 4096;
    c.hidden_size = 256;
    c.intermediate_size = 688;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.head_dim = 32;
    c.max_position_embeddings = 2048;
  } else {
    std::string valid;
    for (const auto& n : preset_names())
      valid += (valid.empty() ? "" : ", ") + n;
    fail(error_code::not_found,
         "unknown model preset " + in_quotes(name) + " (valid: " + valid + ")");
  }
  return c;
}

int64_t num_parameters(const model_config& c) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, i = c.intermediate_size;
  int64_t layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
  if (c.attention_bias)
    layer += q + 2 * kv;
  if (c.arch == architecture::qwen3)
    layer += 2 * c.head_dim;
  if (c.mlp_bias)
    layer += 2 * i + h;
  int64_t total = c.vocab_size * h + c.num_hidden_layers * layer + h;
  if (!c.tie_word_embeddings)
    total += c.vocab_size * h;
  return total;
}

bool operator==(const model_config& a, const model_config& b) {
  return a.arch == b.arch && a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.intermediate_size == b.intermediate_size && a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
         a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
         a.rope_scaling == b.rope_scaling &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.tie_word_embeddings == b.tie_word_embeddings && a.attention_bias == b.attention_bias &&
         a.mlp_bias == b.mlp_bias && a.bos_token_id == b.bos_token_id &&
         a.eos_token_ids == b.eos_token_ids && a.torch_dtype == b.torch_dtype;
}

} // namespace rlforge::backends
