#include "backends/model/text_detokenizer.hpp"

#include <utility>

#include "backends/error.hpp"
#include "text/error.hpp"
#include "text/stream_decoder.hpp"

namespace rlforge::backends {

namespace {

class text_stream final : public token_text_stream {
public:
  explicit text_stream(text::tokenizer tok) : decoder_(std::move(tok), /*skip_special_tokens=*/false) {}

  std::string push(int64_t id) override {
    try {
      return decoder_.push(id);
    } catch (const text::tokenizer_error&) {
      return {}; // an id past the tokenizer's vocabulary has no text; the stream is unchanged
    }
  }

private:
  text::stream_decoder decoder_;
};

class text_detokenizer final : public detokenizer {
public:
  explicit text_detokenizer(text::tokenizer tok) : tok_(std::move(tok)) {}

  std::unique_ptr<token_text_stream> stream() const override {
    return std::make_unique<text_stream>(tok_);
  }

private:
  text::tokenizer tok_;
};

} // namespace

std::shared_ptr<const detokenizer> make_detokenizer(text::tokenizer tok) {
  return std::make_shared<text_detokenizer>(std::move(tok));
}

bool has_tokenizer(const std::string& dir) {
  return text::tokenizer::exists_in(dir);
}

std::shared_ptr<const detokenizer> load_detokenizer(const std::string& dir) {
  if (!has_tokenizer(dir))
    fail(error_code::not_found,
         "'" + dir + "' holds no tokenizer (neither tokenizer.json nor tokenizer.model)");
  try {
    return make_detokenizer(text::tokenizer::load(dir));
  } catch (const error&) {
    throw;
  } catch (const std::exception& e) {
    fail(error_code::invalid_argument, "cannot load the tokenizer of '" + dir + "': " + e.what());
  }
}

} // namespace rlforge::backends
