#include "text/hf/decoder.hpp"

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/hf/pattern.hpp"
#include "text/unicode/byte_level.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text::hf {

namespace {

// All tokens back to bytes through GPT-2's alphabet; a token with a character outside it keeps its
// own UTF-8 bytes. The bytes of all tokens are joined, then read as UTF-8 with U+FFFD for what is
// ill-formed, into one string.
class byte_level final : public decoder {
public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      size_t mark = bytes.size();
      bool mapped = true;
      for (size_t at = 0; at < t.size();) {
        int b = unicode::char_to_byte(unicode::next_code_point(t, at));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    tokens.assign(1, unicode::from_utf8_lossy(bytes));
  }
};

// Runs of <0xNN> tokens become the text of their bytes; a run that is not valid UTF-8 becomes one
// U+FFFD per byte (HF's rule, unlike a lossy UTF-8 reading).
class byte_fallback final : public decoder {
public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string run;
    auto flush = [&] {
      if (run.empty())
        return;
      if (unicode::find_invalid_utf8(run) == std::string::npos) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run.size(); ++i)
          out.emplace_back(unicode::replacement_utf8);
      }
      run.clear();
    };
    for (std::string& t : tokens) {
      int byte = parse_byte(t);
      if (byte >= 0) {
        run.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }

private:
  // "<0xNN>" with two hex digits of either case (Rust's from_str_radix accepts both), else -1.
  static int parse_byte(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>')
      return -1;
    int value = 0;
    for (int k = 3; k < 5; ++k) {
      char c = t[k];
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0)
        return -1;
      value = value * 16 + d;
    }
    return value;
  }
};

class fuse final : public decoder {
public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens)
      all.append(t);
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters from every token.
class strip final : public decoder {
public:
  strip(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      size_t begin = 0;
      for (size_t i = 0; i < start_ && t.compare(begin, content_.size(), content_) == 0 &&
                         begin + content_.size() <= t.size();
           ++i)
        begin += content_.size();
      size_t end = t.size();
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i)
        end -= content_.size();
      t = t.substr(begin, end - begin);
    }
  }

private:
  std::string content_;
  size_t start_;
  size_t stop_;
};

class replace final : public decoder {
public:
  replace(pattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<unicode::match_span> matches;
    for (std::string& t : tokens) {
      matches.clear();
      pattern_.find_all(t, matches);
      if (matches.empty())
        continue;
      std::string out;
      size_t last = 0;
      for (const auto& m : matches) {
        out.append(t, last, m.begin - last);
        out.append(content_);
        last = m.end;
      }
      out.append(t, last, std::string::npos);
      t = std::move(out);
    }
  }

private:
  pattern pattern_;
  std::string content_;
};

// The replacement character back to spaces; in the first token it is dropped instead unless the
// pre-tokenizer never prepends it.
class metaspace final : public decoder {
public:
  metaspace(std::string replacement, bool drop_in_first)
      : replacement_(std::move(replacement)), drop_in_first_(drop_in_first) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string out;
      out.reserve(t.size());
      for (size_t at = 0; at < t.size();) {
        if (t.compare(at, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && drop_in_first_))
            out.push_back(' ');
          at += replacement_.size();
          continue;
        }
        out.push_back(t[at++]);
      }
      t = std::move(out);
    }
  }

private:
  std::string replacement_;
  bool drop_in_first_;
};

// BPEDecoder: the end-of-word suffix becomes a space, except in the last token where it goes.
class bpe_suffix final : public decoder {
public:
  explicit bpe_suffix(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (suffix_.empty())
      return;
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string with = i + 1 == tokens.size() ? "" : " ";
      std::string out;
      size_t last = 0;
      for (size_t at = t.find(suffix_); at != std::string::npos;
           at = t.find(suffix_, at + suffix_.size())) {
        out.append(t, last, at - last);
        out.append(with);
        last = at + suffix_.size();
      }
      out.append(t, last, std::string::npos);
      t = std::move(out);
    }
  }

private:
  std::string suffix_;
};

class sequence final : public decoder {
public:
  explicit sequence(std::vector<std::unique_ptr<const decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_)
      step->decode_chain(tokens);
  }

private:
  std::vector<std::unique_ptr<const decoder>> steps_;
};

} // namespace

std::unique_ptr<const decoder> make_decoder(const json& j, const std::string& where) {
  std::string type = type_of(j, where);
  if (type == "ByteLevel") {
    // The three flags belong to the pre-tokenizer and post-processor sides of ByteLevel; HF's
    // ByteLevel decoder does not read them either.
    require_known_fields(j, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, where);
    get_bool(j, "add_prefix_space", true, where);
    get_bool(j, "trim_offsets", true, where);
    get_bool(j, "use_regex", true, where);
    return std::make_unique<byte_level>();
  }
  if (type == "ByteFallback") {
    require_known_fields(j, {"type"}, where);
    return std::make_unique<byte_fallback>();
  }
  if (type == "Fuse") {
    require_known_fields(j, {"type"}, where);
    return std::make_unique<fuse>();
  }
  if (type == "Strip") {
    require_known_fields(j, {"type", "content", "start", "stop"}, where);
    std::string content = get_string(j, "content", where);
    if (unicode::count_code_points(content) != 1)
      fail(path(where, "content") + ": expected one character, got \"" + content + "\"");
    return std::make_unique<strip>(content,
                                   static_cast<size_t>(get_int(j, "start", 0, INT32_MAX, where)),
                                   static_cast<size_t>(get_int(j, "stop", 0, INT32_MAX, where)));
  }
  if (type == "Replace") {
    require_known_fields(j, {"type", "pattern", "content"}, where);
    auto p = pattern::from_json(require(j, "pattern", where), path(where, "pattern"));
    return std::make_unique<replace>(std::move(p), get_string(j, "content", where));
  }
  if (type == "Metaspace") {
    require_known_fields(
        j, {"type", "replacement", "add_prefix_space", "prepend_scheme", "split", "str_rep"},
        where);
    std::string replacement = get_string(j, "replacement", where);
    if (unicode::count_code_points(replacement) != 1)
      fail(path(where, "replacement") + ": expected one character, got \"" + replacement + "\"");
    std::string scheme = get_optional_string(j, "prepend_scheme", where).value_or("always");
    if (scheme != "always" && scheme != "first" && scheme != "never")
      fail(path(where, "prepend_scheme") + ": unknown scheme \"" + scheme +
           "\" (expected always, first or never)");
    if (!get_bool(j, "add_prefix_space", true, where)) {
      if (scheme != "never")
        fail(path(where, "add_prefix_space") +
             ": false does not match prepend_scheme (which must then be \"never\")");
    }
    get_bool(j, "split", true, where);
    if (auto rep = get_optional_string(j, "str_rep", where); rep && *rep != replacement)
      fail(path(where, "str_rep") + ": \"" + *rep + "\" differs from replacement \"" + replacement +
           "\"");
    return std::make_unique<metaspace>(replacement, scheme != "never");
  }
  if (type == "BPEDecoder") {
    require_known_fields(j, {"type", "suffix"}, where);
    return std::make_unique<bpe_suffix>(get_optional_string(j, "suffix", where).value_or("</w>"));
  }
  if (type == "Sequence") {
    require_known_fields(j, {"type", "decoders"}, where);
    const json& list = require(j, "decoders", where);
    std::string list_where = path(where, "decoders");
    if (!list.is_array())
      fail(list_where + ": expected an array, got " + describe(list));
    std::vector<std::unique_ptr<const decoder>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_decoder(list[i], path(list_where, i)));
    return std::make_unique<sequence>(std::move(steps));
  }
  fail(where + ": unsupported decoder type \"" + type +
       "\" (supported: ByteLevel, ByteFallback, Metaspace, Replace, Fuse, Strip, BPEDecoder, "
       "Sequence)");
}

} // namespace rlforge::text::hf
