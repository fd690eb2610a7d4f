#include "text/sentencepiece_tokenizer.hpp"

#include <link.h>

#include <sentencepiece_processor.h>

#include "text/error.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text {

namespace {

// The path of a libprotobuf loaded into this process, or "" when none is.
std::string loaded_libprotobuf() {
  std::string found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        const std::string name = info->dlpi_name ? info->dlpi_name : "";
        const auto slash = name.rfind('/');
        if (name.compare(slash == std::string::npos ? 0 : slash + 1, 14, "libprotobuf.so") != 0)
          return 0;
        *static_cast<std::string*>(out) = name;
        return 1;
      },
      &found);
  return found;
}

} // namespace

sentencepiece_tokenizer::sentencepiece_tokenizer()
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}

sentencepiece_tokenizer::~sentencepiece_tokenizer() = default;

std::unique_ptr<const sentencepiece_tokenizer>
sentencepiece_tokenizer::load(const std::string& model_file, std::optional<bool> add_bos_flag,
                              std::optional<bool> add_eos_flag) {
  // Debian's libsentencepiece carries its own copy of protobuf-lite and exports its symbols. In a
  // process that also loads libprotobuf (libtorch does, through ONNX; so does the Tinker service)
  // the two copies bind to each other's functions, and loading a model fails deep inside
  // protobuf. Such programs get this refusal instead.
  if (const auto protobuf = loaded_libprotobuf(); !protobuf.empty())
    fail(model_file + ": SentencePiece models cannot be loaded in this program: it also loads " +
         protobuf + " (through libtorch or the service), which clashes with the protobuf copy "
         "inside libsentencepiece; give the model a tokenizer.json (Hugging Face ships one with "
         "most models), which is preferred when both exist");
  std::unique_ptr<sentencepiece_tokenizer> t(new sentencepiece_tokenizer());
  t->file_ = model_file;
  auto status = t->processor_->Load(model_file);
  if (!status.ok())
    fail(model_file + ": SentencePiece cannot load it: " + status.ToString());
  bool add_bos = add_bos_flag.value_or(t->processor_->bos_id() >= 0);
  bool add_eos = add_eos_flag.value_or(false);
  if (add_bos && t->processor_->bos_id() < 0)
    fail(model_file + ": add_bos_token is set but the model defines no BOS piece");
  if (add_eos && t->processor_->eos_id() < 0)
    fail(model_file + ": add_eos_token is set but the model defines no EOS piece");
  t->add_bos_ = add_bos;
  t->add_eos_ = add_eos;
  return t;
}

std::vector<int64_t> sentencepiece_tokenizer::encode(std::string_view text,
                                                     bool add_special_tokens) const {
  unicode::require_valid_utf8(text, "encode: text");
  std::vector<int> ids;
  auto status = processor_->Encode(text, &ids);
  if (!status.ok())
    fail(file_ + ": SentencePiece encode failed: " + status.ToString());
  std::vector<int64_t> out;
  out.reserve(ids.size() + 2);
  if (add_special_tokens && add_bos_)
    out.push_back(processor_->bos_id());
  out.insert(out.end(), ids.begin(), ids.end());
  if (add_special_tokens && add_eos_)
    out.push_back(processor_->eos_id());
  return out;
}

std::string sentencepiece_tokenizer::decode(const int64_t* ids, size_t n,
                                            bool skip_special_tokens) const {
  std::string out;
  std::vector<int> run;
  auto flush = [&] {
    if (run.empty())
      return;
    std::string text;
    auto status = processor_->Decode(run, &text);
    if (!status.ok())
      fail(file_ + ": SentencePiece decode failed: " + status.ToString());
    out.append(text);
    run.clear();
  };
  int64_t size = vocab_size();
  for (size_t i = 0; i < n; ++i) {
    int64_t id = ids[i];
    if (id < 0 || id >= size)
      fail("decode: token id " + std::to_string(id) + " (at position " + std::to_string(i) +
           ") is outside the vocabulary [0, " + std::to_string(size) + ")");
    if (!is_special(id)) {
      run.push_back(static_cast<int>(id));
      continue;
    }
    flush();
    if (!skip_special_tokens)
      out.append(processor_->IdToPiece(static_cast<int>(id)));
  }
  flush();
  return out;
}

int64_t sentencepiece_tokenizer::vocab_size() const {
  return processor_->GetPieceSize();
}

std::optional<int64_t> sentencepiece_tokenizer::token_to_id(std::string_view token) const {
  int id = processor_->PieceToId(token);
  // PieceToId answers the unknown id for a piece it does not have.
  if (id < 0 || (processor_->IsUnknown(id) && processor_->IdToPiece(id) != token))
    return std::nullopt;
  return id;
}

std::optional<std::string> sentencepiece_tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size())
    return std::nullopt;
  return processor_->IdToPiece(static_cast<int>(id));
}

bool sentencepiece_tokenizer::is_special(int64_t id) const {
  if (id < 0 || id >= vocab_size())
    return false;
  return processor_->IsControl(static_cast<int>(id)) || processor_->IsUnknown(static_cast<int>(id));
}

tokenizer_backend::named_tokens sentencepiece_tokenizer::own_special_tokens() const {
  named_tokens t;
  auto name = [&](int id) -> std::optional<std::string> {
    if (id < 0)
      return std::nullopt;
    return processor_->IdToPiece(id);
  };
  t.bos = name(processor_->bos_id());
  t.eos = name(processor_->eos_id());
  t.pad = name(processor_->pad_id());
  t.unk = name(processor_->unk_id());
  return t;
}

} // namespace rlforge::text
