#include "text/hf/hf_tokenizer.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text::hf {

std::unique_ptr<const hf_tokenizer> hf_tokenizer::from_json(const json& j,
                                                            const std::string& source) {
  require_known_fields(j,
                       {"version", "truncation", "padding", "added_tokens", "normalizer",
                        "pre_tokenizer", "post_processor", "decoder", "model"},
                       source);
  std::unique_ptr<hf_tokenizer> t(new hf_tokenizer());
  t->source_ = source;
  if (auto v = get_optional_string(j, "version", source); v && *v != "1.0")
    fail(path(source, "version") + ": unknown tokenizer.json version \"" + *v + "\"");
  for (const char* field : {"truncation", "padding"})
    if (const json* v = find(j, field); v != nullptr && !v->is_null())
      fail(path(source, field) + ": is set (" + v->dump() +
           "); this library encodes one sequence without truncation or padding");

  auto component = [&](const char* key) -> const json* {
    const json* v = find(j, key);
    return v == nullptr || v->is_null() ? nullptr : v;
  };
  if (const json* n = component("normalizer"))
    t->normalizer_ = make_normalizer(*n, path(source, "normalizer"));
  if (const json* p = component("pre_tokenizer"))
    t->pre_tokenizer_ = make_pre_tokenizer(*p, path(source, "pre_tokenizer"));
  const json* model = component("model");
  if (model == nullptr)
    fail(path(source, "model") + ": missing");
  t->model_ = bpe_model::from_json(*model, path(source, "model"));
  if (const json* p = component("post_processor"))
    t->post_processor_ = make_post_processor(*p, path(source, "post_processor"));
  if (const json* d = component("decoder"))
    t->decoder_ = make_decoder(*d, path(source, "decoder"));

  std::vector<added_token> tokens;
  if (const json* a = component("added_tokens"))
    tokens = parse_added_tokens(*a, path(source, "added_tokens"));
  int64_t bound = t->model_->id_bound();
  for (const added_token& a : tokens) {
    std::string w = path(source, "added_tokens") + " \"" + a.content + "\"";
    if (auto id = t->model_->token_to_id(a.content); id && *id != a.id)
      fail(w + ": has id " + std::to_string(a.id) + " but the model vocabulary gives it id " +
           std::to_string(*id));
    if (const std::string* other = t->model_->id_to_token(a.id); other && *other != a.content)
      fail(w + ": id " + std::to_string(a.id) + " is the model's token \"" + *other + "\"");
    if (a.special)
      t->special_contents_.insert(a.content);
    bound = std::max<int64_t>(bound, int64_t{a.id} + 1);
  }
  t->vocab_size_ = bound;
  t->added_ = std::make_unique<added_vocabulary>(std::move(tokens), t->normalizer_.get());
  t->raw_bytes_ = t->pre_tokenizer_ && t->pre_tokenizer_->ends_with_byte_level() &&
                  t->model_->reads_raw_bytes();

  if (t->post_processor_) {
    std::vector<int32_t> ids;
    t->post_processor_->process(ids, true);
    for (int32_t id : ids)
      if (!t->id_to_token(id))
        fail(path(source, "post_processor") + ": adds id " + std::to_string(id) +
             ", which names no token");
  }
  return t;
}

void hf_tokenizer::encode_section(std::string_view text, bool at_start,
                                  std::vector<int32_t>& ids) const {
  pre_tokenized p(text, at_start);
  if (raw_bytes_) {
    // The byte-level model reads raw bytes: the mapping to GPT-2's alphabet is skipped.
    pre_tokenizer_->pre_tokenize_unmapped(p);
    for (const piece& pc : p.pieces())
      model_->tokenize_raw(pc.text, ids);
    return;
  }
  if (pre_tokenizer_)
    pre_tokenizer_->pre_tokenize(p);
  for (const piece& pc : p.pieces())
    model_->tokenize(pc.text, ids);
}

std::vector<int64_t> hf_tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  unicode::require_valid_utf8(text, "encode: text");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<section> outer;
  std::vector<section> inner;
  std::string normalized;
  added_->split_raw(text, outer);
  for (const section& s : outer) {
    if (s.id >= 0) {
      ids.push_back(s.id);
      continue;
    }
    bool at_start = s.offset == 0;
    std::string_view view = s.text;
    if (normalizer_) {
      normalized.assign(s.text);
      bool kept = true;
      normalizer_->normalize(normalized, kept);
      at_start = at_start && kept;
      view = normalized;
    }
    inner.clear();
    added_->split_normalized(view, inner);
    for (const section& n : inner) {
      if (n.id >= 0)
        ids.push_back(n.id);
      else
        encode_section(n.text, at_start && n.offset == 0, ids);
    }
  }
  if (post_processor_)
    post_processor_->process(ids, add_special_tokens);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::string hf_tokenizer::decode(const int64_t* ids, size_t n, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t id = ids[i];
    if (id < 0 || id >= vocab_size_)
      fail("decode: token id " + std::to_string(id) + " (at position " + std::to_string(i) +
           ") is outside the vocabulary [0, " + std::to_string(vocab_size_) + ")");
    auto id32 = static_cast<int32_t>(id);
    const std::string* token = nullptr;
    if (added_->find(id32) != nullptr)
      token = &added_->decode_form(id32);
    else
      token = model_->id_to_token(id32);
    if (token == nullptr)
      fail("decode: token id " + std::to_string(id) + " (at position " + std::to_string(i) +
           ") names no token");
    if (skip_special_tokens && special_contents_.count(*token) != 0)
      continue;
    tokens.push_back(*token);
  }
  std::string out;
  if (decoder_) {
    decoder_->decode_chain(tokens);
    for (const std::string& t : tokens)
      out.append(t);
    return out;
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0)
      out.push_back(' ');
    out.append(tokens[i]);
  }
  return out;
}

std::optional<int64_t> hf_tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_->id_of(token))
    return *id;
  if (auto id = model_->token_to_id(token))
    return *id;
  return std::nullopt;
}

std::optional<std::string> hf_tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size_)
    return std::nullopt;
  auto id32 = static_cast<int32_t>(id);
  if (const added_token* a = added_->find(id32))
    return a->content;
  if (const std::string* t = model_->id_to_token(id32))
    return *t;
  return std::nullopt;
}

bool hf_tokenizer::is_special(int64_t id) const {
  if (id < 0 || id >= vocab_size_)
    return false;
  const added_token* a = added_->find(static_cast<int32_t>(id));
  return a != nullptr && a->special;
}

} // namespace rlforge::text::hf
