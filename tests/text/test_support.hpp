#pragma once

// Shared by the tests/text suites: an expected-error check, temporary directories, files.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/unicode/byte_level.hpp"

#include "tests/support/temp_dir.hpp"

namespace rlforge::text::test {

/// Runs `f`; expects a `tokenizer_error` whose message holds every one of `parts`.
inline void expect_error(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
  } catch (const tokenizer_error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << p << "\"";
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a tokenizer_error, got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "no tokenizer_error thrown (expected one mentioning " << *parts.begin() << ")";
}

/// The tests' one temporary directory (tests/support/temp_dir.hpp).
using ::rlforge::test_support::temp_dir;

inline void write_file(const std::filesystem::path& file, const std::string& content) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out << content;
  if (!out)
    throw std::runtime_error("cannot write " + file.string());
}

inline std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw std::runtime_error("cannot read " + file.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A BPE model object: `tokens` get ids 0, 1, ... in order; `merges` are "a b" strings (ranks in
/// order); `extra` adds or overrides fields (byte_fallback, unk_token, ...).
inline nlohmann::json bpe_json(const std::vector<std::string>& tokens,
                               const std::vector<std::string>& merges,
                               const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < tokens.size(); ++i)
    vocab[tokens[i]] = i;
  nlohmann::json m{{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}};
  for (auto it = extra.begin(); it != extra.end(); ++it)
    m[it.key()] = it.value();
  return m;
}

/// GPT-2's 256 byte characters, in byte order (ids 0..255 of a byte-level test vocabulary).
inline std::vector<std::string> byte_alphabet() {
  std::vector<std::string> out;
  for (int b = 0; b < 256; ++b)
    out.emplace_back(unicode::byte_to_utf8(static_cast<uint8_t>(b)));
  return out;
}

/// A tokenizer.json document: `model` plus the given components (null when absent).
inline std::string tokenizer_doc(const nlohmann::json& model,
                                 const nlohmann::json& normalizer = nullptr,
                                 const nlohmann::json& pre_tokenizer = nullptr,
                                 const nlohmann::json& post_processor = nullptr,
                                 const nlohmann::json& decoder = nullptr,
                                 const nlohmann::json& added_tokens = nlohmann::json::array()) {
  nlohmann::json doc{{"version", "1.0"},
                     {"truncation", nullptr},
                     {"padding", nullptr},
                     {"added_tokens", added_tokens},
                     {"normalizer", normalizer},
                     {"pre_tokenizer", pre_tokenizer},
                     {"post_processor", post_processor},
                     {"decoder", decoder},
                     {"model", model}};
  return doc.dump();
}

/// One entry of added_tokens.
inline nlohmann::json added(int id, const std::string& content, bool special = true,
                            const nlohmann::json& flags = nlohmann::json::object()) {
  nlohmann::json t{{"id", id},          {"content", content}, {"single_word", false},
                   {"lstrip", false},   {"rstrip", false},    {"normalized", !special},
                   {"special", special}};
  for (auto it = flags.begin(); it != flags.end(); ++it)
    t[it.key()] = it.value();
  return t;
}

/// The tokens of `ids` under `tok`'s id_to_token, joined by '|', for readable expectations.
template <class Tokenizer>
std::string spell(const Tokenizer& tok, const std::vector<int64_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i)
    out += (i ? "|" : "") + tok.id_to_token(ids[i]).value_or("?");
  return out;
}

inline nlohmann::json byte_level(bool add_prefix_space = false) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", true},
          {"use_regex", true}};
}

// A GPT-2 style tokenizer: 256 byte tokens, a few merges, <|endoftext|> as id 262.
inline std::string gpt2_like() {
  std::vector<std::string> tokens = byte_alphabet();
  std::vector<std::string> merges;
  for (auto [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"Ġ", "w"}, {"o", "r"}, {"Ġw", "or"}}) {
    tokens.push_back(a + b);
    merges.push_back(a + " " + b);
  }
  return tokenizer_doc(bpe_json(tokens, merges), nullptr, byte_level(), byte_level(), byte_level(),
                       nlohmann::json::array({added(262, "<|endoftext|>")}));
}

// A Llama 2 style tokenizer: SentencePiece spaces by normalizer, byte fallback, <s> template.
inline std::string llama2_like(const nlohmann::json& pre_tokenizer = nullptr,
                               const nlohmann::json& normalizer = nlohmann::json()) {
  std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    tokens.emplace_back(hex);
  }
  for (const char* t :
       {"▁",  "H",  "i",  "e",  "l",    "o",  "w",      "r",  "d",  "t",    "h",  "▁H",    "▁Hi",
        "el", "lo", "▁w", "or", "▁wor", "ld", "▁world", "▁t", "he", "▁the", "re", "▁there"})
    tokens.emplace_back(t);
  std::vector<std::string> merges{"▁ H", "▁H i",    "e l", "l o", "▁ w",   "o r", "▁w or",
                                  "l d", "▁wor ld", "▁ t", "h e", "▁t he", "r e", "▁the re"};
  nlohmann::json norm =
      normalizer.is_null() && pre_tokenizer.is_null()
          ? nlohmann::json{{"type", "Sequence"},
                           {"normalizers",
                            nlohmann::json::array({{{"type", "Prepend"}, {"prepend", "▁"}},
                                                   {{"type", "Replace"},
                                                    {"pattern", {{"String", " "}}},
                                                    {"content", "▁"}}})}}
          : normalizer;
  nlohmann::json post{
      {"type", "TemplateProcessing"},
      {"single", nlohmann::json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", "<s> $A <s>:1 $B:1"},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  nlohmann::json decoder{
      {"type", "Sequence"},
      {"decoders", nlohmann::json::array(
                       {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                        {{"type", "ByteFallback"}},
                        {{"type", "Fuse"}},
                        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  return tokenizer_doc(
      bpe_json(tokens, merges,
               {{"byte_fallback", true}, {"unk_token", "<unk>"}, {"fuse_unk", true}}),
      norm, pre_tokenizer, post, decoder,
      nlohmann::json::array({added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")}));
}

} // namespace rlforge::text::test
