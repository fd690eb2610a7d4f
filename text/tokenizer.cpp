#include "text/tokenizer.hpp"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/hf/hf_tokenizer.hpp"
#include "text/sentencepiece_tokenizer.hpp"
#include "text/tokenizer_config.hpp"

namespace rlforge::text {

// Assembles a tokenizer from a backend and the special-token names.
class tokenizer_builder {
public:
  static tokenizer make(std::shared_ptr<const tokenizer_backend> backend,
                        const tokenizer_config& config, const std::string& config_source) {
    tokenizer t;
    t.backend_ = std::move(backend);
    auto own = t.backend_->own_special_tokens();
    auto resolve = [&](const char* key, const std::optional<std::string>& configured,
                       const std::optional<std::string>& fallback) -> std::optional<special_token> {
      const std::optional<std::string>& name = configured ? configured : fallback;
      if (!name)
        return std::nullopt;
      auto id = t.backend_->token_to_id(*name);
      if (!id)
        fail((configured ? config_source : t.backend_->describe()) + ": " + key + " \"" + *name +
             "\" is not in the vocabulary");
      return special_token{*name, *id};
    };
    t.bos_ = resolve("bos_token", config.bos_token, own.bos);
    t.eos_ = resolve("eos_token", config.eos_token, own.eos);
    t.pad_ = resolve("pad_token", config.pad_token, own.pad);
    t.unk_ = resolve("unk_token", config.unk_token, own.unk);
    return t;
  }
};

namespace {

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    fail(file.string() + ": cannot be opened for reading");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad())
    fail(file.string() + ": read error");
  return buffer.str();
}

} // namespace

tokenizer tokenizer::load(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    fail(dir.string() + ": not a directory");
  auto json_file = dir / "tokenizer.json";
  auto model_file = dir / "tokenizer.model";
  auto config_file = dir / "tokenizer_config.json";
  tokenizer_config config;
  if (std::filesystem::exists(config_file, ec))
    config = parse_tokenizer_config(read_file(config_file), config_file.string());
  std::shared_ptr<const tokenizer_backend> backend;
  if (std::filesystem::exists(json_file, ec)) {
    backend =
        hf::hf_tokenizer::from_json(hf::read_json_file(json_file.string()), json_file.string());
  } else if (std::filesystem::exists(model_file, ec)) {
    backend = sentencepiece_tokenizer::load(model_file.string(), config.add_bos_token,
                                            config.add_eos_token);
  } else {
    fail(dir.string() + ": has neither tokenizer.json nor tokenizer.model");
  }
  return tokenizer_builder::make(std::move(backend), config, config_file.string());
}

bool tokenizer::exists_in(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::exists(dir / "tokenizer.json", ec) ||
         std::filesystem::exists(dir / "tokenizer.model", ec);
}

tokenizer tokenizer::from_json(std::string_view tokenizer_json,
                               std::string_view tokenizer_config_json, const std::string& source) {
  tokenizer_config config;
  std::string config_source = source + " (tokenizer_config.json)";
  if (!tokenizer_config_json.empty())
    config = parse_tokenizer_config(tokenizer_config_json, config_source);
  std::shared_ptr<const tokenizer_backend> backend =
      hf::hf_tokenizer::from_json(hf::parse_json(tokenizer_json, source), source);
  return tokenizer_builder::make(std::move(backend), config, config_source);
}

std::vector<int64_t> tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return backend_->encode(text, add_special_tokens);
}

std::string tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  return backend_->decode(ids.data(), ids.size(), skip_special_tokens);
}

std::string tokenizer::decode(const int64_t* ids, size_t n, bool skip_special_tokens) const {
  return backend_->decode(ids, n, skip_special_tokens);
}

int64_t tokenizer::vocab_size() const {
  return backend_->vocab_size();
}

std::optional<int64_t> tokenizer::token_to_id(std::string_view token) const {
  return backend_->token_to_id(token);
}

std::optional<std::string> tokenizer::id_to_token(int64_t id) const {
  return backend_->id_to_token(id);
}

bool tokenizer::is_special(int64_t id) const {
  return backend_->is_special(id);
}

std::string tokenizer::describe() const {
  return backend_->describe();
}

} // namespace rlforge::text
