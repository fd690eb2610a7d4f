#include "text/stream_decoder.hpp"

#include "text/error.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text {

namespace {

bool ends_with_replacement(const std::string& s) {
  auto r = unicode::replacement_utf8;
  return s.size() >= r.size() && s.compare(s.size() - r.size(), r.size(), r) == 0;
}

} // namespace

stream_decoder::stream_decoder(tokenizer tok, bool skip_special_tokens)
    : tok_(std::move(tok)), skip_special_tokens_(skip_special_tokens) {}

std::string stream_decoder::push(int64_t id) {
  ids_.push_back(id);
  std::string text;
  try {
    text = tok_.decode(ids_.data() + prefix_, ids_.size() - prefix_, skip_special_tokens_);
  } catch (const tokenizer_error&) {
    ids_.pop_back();
    throw;
  }
  // Decoding the window from an earlier boundary (rather than the new ids alone) keeps what
  // depends on the neighbours right: a space the decoder strips only at the start of a text, a
  // character whose bytes span several ids.
  if (text.size() <= prefix_text_.size() || ends_with_replacement(text))
    return {};
  // A decoder whose output for the window does not extend what was released (none of HF's do
  // that on valid text) still gets its new ids' own text released rather than stalling.
  std::string fresh =
      text.compare(0, prefix_text_.size(), prefix_text_) == 0
          ? text.substr(prefix_text_.size())
          : tok_.decode(ids_.data() + read_, ids_.size() - read_, skip_special_tokens_);
  // The window moves on: the ids just released become the prefix of the next decode.
  std::string released =
      tok_.decode(ids_.data() + read_, ids_.size() - read_, skip_special_tokens_);
  prefix_ = read_;
  read_ = ids_.size();
  prefix_text_ = std::move(released);
  // Drop ids before the window so that memory stays bounded.
  if (prefix_ > 4096) {
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_));
    read_ -= prefix_;
    prefix_ = 0;
  }
  return fresh;
}

std::string stream_decoder::finish() {
  std::string rest;
  if (read_ < ids_.size()) {
    std::string text =
        tok_.decode(ids_.data() + prefix_, ids_.size() - prefix_, skip_special_tokens_);
    if (text.size() > prefix_text_.size() &&
        text.compare(0, prefix_text_.size(), prefix_text_) == 0)
      rest = text.substr(prefix_text_.size());
    else
      rest = tok_.decode(ids_.data() + read_, ids_.size() - read_, skip_special_tokens_);
  }
  ids_.clear();
  prefix_ = 0;
  read_ = 0;
  prefix_text_.clear();
  return rest;
}

} // namespace rlforge::text
