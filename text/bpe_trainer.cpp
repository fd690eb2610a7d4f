#include "text/bpe_trainer.hpp"

#include <algorithm>
#include <fstream>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "text/error.hpp"
#include "text/unicode/byte_level.hpp"
#include "text/unicode/normalization.hpp"
#include "text/unicode/regex.hpp"
#include "text/unicode/utf8.hpp"

namespace rlforge::text {

namespace {

using ordered_json = nlohmann::ordered_json;

// Qwen2's split: contractions, letter runs with one leading non-letter, single digits,
// punctuation runs, newlines, other whitespace.
constexpr std::string_view split_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

uint64_t key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct candidate {
  int64_t count;
  int32_t a;
  int32_t b;
};

class trainer {
public:
  explicit trainer(size_t min_frequency) : min_frequency_(min_frequency) {
    for (int b = 0; b < 256; ++b) {
      bytes_.emplace_back(1, static_cast<char>(b));
      index_.emplace(bytes_.back(), b);
    }
  }

  void add_word(std::string_view word, int64_t count) {
    std::vector<int32_t> symbols;
    for (char c : word)
      symbols.push_back(static_cast<unsigned char>(c));
    words_.push_back(std::move(symbols));
    counts_.push_back(count);
  }

  // Runs merges until the vocabulary holds `max_tokens` tokens or no pair is frequent enough.
  void train(size_t max_tokens) {
    for (size_t w = 0; w < words_.size(); ++w)
      add_pairs(w, +1);
    for (const auto& [k, c] : pair_counts_)
      queue_.push({c, static_cast<int32_t>(k >> 32), static_cast<int32_t>(k & 0xffffffffu)});
    touched_.clear();
    std::vector<uint32_t> seen(words_.size(), 0);
    uint32_t step = 0;
    while (bytes_.size() < max_tokens && !queue_.empty()) {
      candidate top = queue_.top();
      queue_.pop();
      auto it = pair_counts_.find(key(top.a, top.b));
      if (it == pair_counts_.end() || it->second != top.count)
        continue; // stale
      if (top.count < static_cast<int64_t>(min_frequency_))
        break;
      ++step;
      std::string merged = bytes_[top.a] + bytes_[top.b];
      int32_t id;
      if (auto found = index_.find(merged); found != index_.end()) {
        id = found->second;
      } else {
        id = static_cast<int32_t>(bytes_.size());
        bytes_.push_back(merged);
        index_.emplace(merged, id);
      }
      merges_.emplace_back(top.a, top.b);
      touched_.clear();
      // Every occurrence of the pair is merged, so no word keeps it: its list can go.
      std::vector<uint32_t> where = std::move(where_[key(top.a, top.b)]);
      where_.erase(key(top.a, top.b));
      for (uint32_t w : where) {
        if (seen[w] == step)
          continue;
        seen[w] = step;
        apply(w, top.a, top.b, id);
      }
      for (uint64_t k : touched_) {
        auto c = pair_counts_.find(k);
        if (c != pair_counts_.end() && c->second > 0)
          queue_.push(
              {c->second, static_cast<int32_t>(k >> 32), static_cast<int32_t>(k & 0xffffffffu)});
      }
    }
  }

  const std::vector<std::string>& tokens() const { return bytes_; }
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }

private:
  // Higher count first; among equal counts the pair whose byte strings sort first.
  struct order {
    const std::vector<std::string>* bytes;
    bool operator()(const candidate& x, const candidate& y) const {
      if (x.count != y.count)
        return x.count < y.count;
      const auto& b = *bytes;
      if (b[x.a] != b[y.a])
        return b[x.a] > b[y.a];
      return b[x.b] > b[y.b];
    }
  };

  void add_pairs(size_t w, int sign) {
    const auto& s = words_[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      uint64_t k = key(s[i], s[i + 1]);
      pair_counts_[k] += sign * counts_[w];
      if (sign > 0)
        where_[k].push_back(static_cast<uint32_t>(w));
      touched_.insert(k);
    }
  }

  void apply(size_t w, int32_t a, int32_t b, int32_t id) {
    add_pairs(w, -1);
    auto& s = words_[w];
    std::vector<int32_t> out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
        out.push_back(id);
        ++i;
      } else {
        out.push_back(s[i]);
      }
    }
    s = std::move(out);
    add_pairs(w, +1);
  }

  size_t min_frequency_;
  std::vector<std::string> bytes_; // raw bytes of every token, by id
  std::unordered_map<std::string, int32_t> index_;
  std::vector<std::vector<int32_t>> words_;
  std::vector<int64_t> counts_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where_;
  std::unordered_set<uint64_t> touched_;
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::priority_queue<candidate, std::vector<candidate>, order> queue_{order{&bytes_}};
};

std::string spelled(const std::string& raw) {
  std::string out;
  unicode::append_byte_level(out, raw);
  return out;
}

ordered_json byte_level_json() {
  return ordered_json{{"type", "ByteLevel"},
                      {"add_prefix_space", false},
                      {"trim_offsets", false},
                      {"use_regex", false}};
}

ordered_json name_or_null(const std::optional<std::string>& s) {
  return s ? ordered_json(*s) : ordered_json(nullptr);
}

void write_file(const std::filesystem::path& file, const std::string& content) {
  auto tmp = file;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      fail(tmp.string() + ": cannot be opened for writing");
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    out.flush();
    if (!out)
      fail(tmp.string() + ": write error");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec)
    fail(file.string() + ": cannot be renamed into place: " + ec.message());
}

} // namespace

tokenizer_files train_bpe(std::string_view corpus, const bpe_trainer_options& options) {
  unicode::require_valid_utf8(corpus, "train_bpe: corpus");
  std::unordered_set<std::string> specials;
  for (const auto& s : options.special_tokens) {
    if (s.empty())
      fail("train_bpe: a special token is empty");
    unicode::require_valid_utf8(s, "train_bpe: special token");
    if (!specials.insert(s).second)
      fail("train_bpe: special token \"" + s + "\" is listed twice");
  }
  for (const auto* name : {&options.bos_token, &options.eos_token, &options.pad_token})
    if (*name && specials.count(**name) == 0)
      fail("train_bpe: \"" + **name + "\" is not one of the special tokens");
  if (options.add_bos_token && !options.bos_token)
    fail("train_bpe: add_bos_token needs a bos_token");
  if (options.vocab_size < 256 + options.special_tokens.size())
    fail("train_bpe: vocab_size " + std::to_string(options.vocab_size) +
         " is smaller than the 256 byte tokens plus " +
         std::to_string(options.special_tokens.size()) + " special tokens");

  // Words: the corpus without its special tokens, NFC-normalized, split as encoding splits it.
  auto splitter = unicode::regex::compile(split_regex, "train_bpe");
  std::unordered_map<std::string, int64_t> word_counts;
  std::vector<unicode::match_span> matches;
  auto add_text = [&](std::string_view section) {
    if (section.empty())
      return;
    std::string normalized = unicode::normalize(section, unicode::normal_form::nfc);
    matches.clear();
    splitter.find_all(normalized, matches);
    size_t prev = 0;
    auto count = [&](size_t b, size_t e) {
      if (e > b)
        ++word_counts[normalized.substr(b, e - b)];
    };
    for (const auto& m : matches) {
      count(prev, m.begin);
      count(m.begin, m.end);
      prev = m.end;
    }
    count(prev, normalized.size());
  };
  size_t start = 0;
  for (size_t i = 0; i < corpus.size();) {
    size_t best = 0;
    for (const auto& s : options.special_tokens)
      if (s.size() > best && corpus.compare(i, s.size(), s) == 0)
        best = s.size();
    if (best == 0) {
      ++i;
      continue;
    }
    add_text(corpus.substr(start, i - start));
    i += best;
    start = i;
  }
  add_text(corpus.substr(start));

  // Sorted words make training independent of the hash map's order.
  std::vector<std::pair<std::string, int64_t>> words(word_counts.begin(), word_counts.end());
  std::sort(words.begin(), words.end());
  trainer t(std::max<size_t>(options.min_frequency, 1));
  for (const auto& [w, c] : words)
    t.add_word(w, c);
  t.train(options.vocab_size - options.special_tokens.size());

  // tokenizer.json
  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < t.tokens().size(); ++id)
    vocab[spelled(t.tokens()[id])] = id;
  ordered_json merges = ordered_json::array();
  for (const auto& [a, b] : t.merges())
    merges.push_back(ordered_json::array({spelled(t.tokens()[a]), spelled(t.tokens()[b])}));
  ordered_json added = ordered_json::array();
  ordered_json added_decoder = ordered_json::object();
  size_t next_id = t.tokens().size();
  std::unordered_map<std::string, size_t> special_ids;
  for (const auto& s : options.special_tokens) {
    special_ids[s] = next_id;
    ordered_json entry{{"id", next_id},   {"content", s},    {"single_word", false},
                       {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                       {"special", true}};
    added.push_back(entry);
    entry.erase("id");
    added_decoder[std::to_string(next_id)] = entry;
    ++next_id;
  }
  ordered_json post = byte_level_json();
  if (options.add_bos_token) {
    const std::string& bos = *options.bos_token;
    ordered_json bos_piece{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
    ordered_json templ{
        {"type", "TemplateProcessing"},
        {"single", ordered_json::array({bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", ordered_json::array({bos_piece,
                                      {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                      {{"SpecialToken", {{"id", bos}, {"type_id", 1}}}},
                                      {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens",
         {{bos,
           {{"id", bos},
            {"ids", ordered_json::array({special_ids[bos]})},
            {"tokens", ordered_json::array({bos})}}}}}};
    post = ordered_json{{"type", "Sequence"},
                        {"processors", ordered_json::array({byte_level_json(), templ})}};
  }
  ordered_json split_json{{"type", "Split"},
                          {"pattern", {{"Regex", std::string(split_regex)}}},
                          {"behavior", "Isolated"},
                          {"invert", false}};
  ordered_json pre{{"type", "Sequence"},
                   {"pretokenizers", ordered_json::array({split_json, byte_level_json()})}};
  ordered_json model{{"type", "BPE"},
                     {"dropout", nullptr},
                     {"unk_token", nullptr},
                     {"continuing_subword_prefix", nullptr},
                     {"end_of_word_suffix", nullptr},
                     {"fuse_unk", false},
                     {"byte_fallback", false},
                     {"ignore_merges", false}};
  model["vocab"] = std::move(vocab);
  model["merges"] = std::move(merges);
  ordered_json doc = ordered_json::object();
  doc["version"] = "1.0";
  doc["truncation"] = nullptr;
  doc["padding"] = nullptr;
  doc["added_tokens"] = std::move(added);
  doc["normalizer"] = ordered_json{{"type", "NFC"}};
  doc["pre_tokenizer"] = std::move(pre);
  doc["post_processor"] = std::move(post);
  doc["decoder"] = byte_level_json();
  doc["model"] = std::move(model);

  ordered_json config{{"tokenizer_class", "PreTrainedTokenizerFast"},
                      {"bos_token", name_or_null(options.bos_token)},
                      {"eos_token", name_or_null(options.eos_token)},
                      {"pad_token", name_or_null(options.pad_token)},
                      {"unk_token", nullptr},
                      {"clean_up_tokenization_spaces", false},
                      {"added_tokens_decoder", added_decoder}};
  if (options.chat_template) {
    unicode::require_valid_utf8(*options.chat_template, "train_bpe: chat_template");
    config["chat_template"] = *options.chat_template;
  }
  return {doc.dump(1) + "\n", config.dump(2) + "\n"};
}

void write_tokenizer_files(const std::filesystem::path& dir, const tokenizer_files& files) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    fail(dir.string() + ": cannot be created: " + ec.message());
  write_file(dir / "tokenizer.json", files.tokenizer_json);
  write_file(dir / "tokenizer_config.json", files.tokenizer_config_json);
}

} // namespace rlforge::text
