#pragma once

#include <cstddef>
#include <string_view>

#include "text/bpe_trainer.hpp"

/// The tokenizer `rlforge init-model` writes beside every model it creates, so that each test
/// model can encode text and render chat prompts.
///
/// It is a byte-level BPE (`train_bpe`, the Qwen2 layout) trained on `builtin_corpus()` — a few
/// pages of English prose, dialogue and numbers written for rlforge — followed by three special
/// tokens, in this order: `<|endoftext|>` (eos and pad), `<|im_start|>` and `<|im_end|>`.
/// tokenizer_config.json carries `chatml_template()` as its `chat_template`.
namespace rlforge::text {

/// The fewest ids a model tokenizer needs: the 256 byte tokens and the 3 special tokens.
inline constexpr std::size_t min_model_tokenizer_vocab = 259;

/// The special tokens of a model tokenizer, in id order (they follow the BPE vocabulary).
inline constexpr std::string_view end_of_text_token = "<|endoftext|>";
inline constexpr std::string_view im_start_token = "<|im_start|>";
inline constexpr std::string_view im_end_token = "<|im_end|>";

/// The training text (UTF-8, no special tokens). Immutable.
std::string_view builtin_corpus() noexcept;

/// A ChatML chat template written for rlforge: each message becomes
/// `<|im_start|>ROLE\nCONTENT<|im_end|>\n`, and `add_generation_prompt` appends
/// `<|im_start|>assistant\n`. It raises an error (naming the message) for a message whose role
/// or content is not a string.
std::string_view chatml_template() noexcept;

/// The files of the tokenizer for a model with `model_vocab_size` ids: trained to at most
/// `model_vocab_size` ids in all, so no id it produces lies outside the model's embedding. The
/// corpus runs out of pairs worth merging (occurring twice) below a thousand ids; a larger model
/// vocabulary gets that smaller tokenizer, and its upper ids name no token (as in many published
/// models, whose embeddings are padded past their tokenizer). Deterministic:
/// the same size gives byte-identical files. Throws `tokenizer_error` when `model_vocab_size` is
/// below `min_model_tokenizer_vocab`.
tokenizer_files train_model_tokenizer(std::size_t model_vocab_size);

} // namespace rlforge::text
