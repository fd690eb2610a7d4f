#pragma once

#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

/// A small byte-level BPE trainer of our own, for the tokenizers of rlforge's tiny model presets.
/// Its output is a tokenizer.json in the Qwen2 layout (NFC, Qwen2's split regex with single
/// digits, ByteLevel) that loads both here and in Hugging Face's libraries.
namespace rlforge::text {

struct bpe_trainer_options {
  /// The largest vocabulary wanted, special tokens included: 256 byte tokens, then one token per
  /// merge, then the special tokens. Training stops earlier when no pair of symbols occurs at
  /// least `min_frequency` times any more.
  size_t vocab_size = 512;
  size_t min_frequency = 2;
  /// Added as special tokens after the BPE vocabulary, in this order. Their spelling in the corpus
  /// is cut out before training (as encoding cuts them out).
  std::vector<std::string> special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  /// The names tokenizer_config.json gives; each must be one of `special_tokens`.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token = std::string("<|endoftext|>");
  std::optional<std::string> pad_token = std::string("<|endoftext|>");
  /// Whether encoding with special tokens prepends `bos_token` (a TemplateProcessing
  /// post-processor, as Llama 3); needs `bos_token`.
  bool add_bos_token = false;
  /// When set, tokenizer_config.json carries it as its `chat_template` (a Jinja template, as
  /// transformers reads it; chat/template_renderer.hpp renders it).
  std::optional<std::string> chat_template;
};

/// The two files of a trained tokenizer, as text.
struct tokenizer_files {
  std::string tokenizer_json;
  std::string tokenizer_config_json;
};

/// Trains on `corpus` (valid UTF-8; special tokens written in it are cut out): words are the
/// pieces of the NFC-normalized corpus split by the pre-tokenizer, and each step merges the most
/// frequent adjacent pair of symbols over all words (ties: the pair whose byte strings come first).
/// Deterministic. Throws `tokenizer_error` for invalid UTF-8, a vocabulary too small for the 256
/// bytes and the special tokens, or inconsistent options.
tokenizer_files train_bpe(std::string_view corpus, const bpe_trainer_options& options);

/// Writes tokenizer.json and tokenizer_config.json into `dir` (created when missing), each through
/// a temporary file renamed into place. Throws `tokenizer_error` naming the file on failure.
void write_tokenizer_files(const std::filesystem::path& dir, const tokenizer_files& files);

} // namespace rlforge::text
