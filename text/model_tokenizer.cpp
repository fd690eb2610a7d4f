#include "text/model_tokenizer.hpp"

#include <string>

#include "text/error.hpp"

namespace rlforge::text {

namespace {

// Written for rlforge. Whitespace control (`-`) keeps the template's own line breaks out of the
// prompt, so the rendering is exactly the ChatML layout.
constexpr std::string_view chatml = R"jinja({%- for message in messages -%}
{%- if message['role'] is not string or message['content'] is not string -%}
{{- raise_exception('message ' ~ loop.index ~ ' needs a string role and a string content') -}}
{%- endif -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%})jinja";

} // namespace

std::string_view chatml_template() noexcept {
  return chatml;
}

tokenizer_files train_model_tokenizer(std::size_t model_vocab_size) {
  if (model_vocab_size < min_model_tokenizer_vocab)
    fail("a model tokenizer needs a vocabulary of at least " +
         std::to_string(min_model_tokenizer_vocab) +
         " ids (256 bytes and 3 special tokens), the "
         "model has " +
         std::to_string(model_vocab_size));
  bpe_trainer_options o;
  o.vocab_size = model_vocab_size;
  o.min_frequency = 2;
  o.special_tokens = {std::string(end_of_text_token), std::string(im_start_token),
                      std::string(im_end_token)};
  o.bos_token.reset();
  o.eos_token = std::string(end_of_text_token);
  o.pad_token = std::string(end_of_text_token);
  o.add_bos_token = false;
  o.chat_template = std::string(chatml);
  return train_bpe(builtin_corpus(), o);
}

} // namespace rlforge::text
