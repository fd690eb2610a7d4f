#pragma once

// Deterministic pseudo-text for the bulk comparisons of tests/text and for bench/tokenizer_bench:
// words built from syllables of several scripts, numbers of many lengths, code, emoji and
// punctuation, drawn with a Zipf-like law (as words in real text are) and joined by spaces,
// newlines and tabs. Header-only: standard C++ and rlforge::strings.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "strings/utf8.hpp"

namespace rlforge::text::test {

class synthetic_corpus {
public:
  explicit synthetic_corpus(uint64_t seed) : state_(seed) {
    const std::vector<std::vector<std::string>> syllables = {
        {"ka",  "to",  "ri", "men", "st",  "ph", "ing", "tion", "al", "er", "pro", "con", "ment",
         "the", "and", "ly", "ous", "ver", "qu", "ex",  "in",   "re", "de", "un",  "sh",  "ch"},
        {"при", "вет", "мир", "ска", "зал", "до", "ро", "га", "ник", "ов", "ст", "на"},
        {"κα", "λη", "μέ", "ρα", "κό", "σμε", "λό", "γος", "ση", "της", "ου", "πο"},
        {"数", "据", "模", "型", "学", "习", "天", "气", "很", "好", "我", "们", "中", "文", "字"},
        {"ひ", "ら", "が", "な", "カ", "タ", "の", "は", "す", "で", "ま", "し", "た"},
        {"ال", "كت", "اب", "مر", "حب", "ا", "سل", "ام", "عا", "لم", "ين", "ة"},
        {"न", "म", "स्ते", "दु", "नि", "या", "है", "क", "र", "प्र"},
        {"สวั", "สดี", "คร", "ับ", "ภา", "ษา", "ไท", "ย", "การ", "ทด"},
        {"é", "è", "ü", "ö", "ñ", "ç", "ß", "ø", "å", "ł", "ő", "ș"},
    };
    const std::vector<std::string> extras = {"😀",        "🎉",
                                             "👍🏽", "👩‍💻",
                                             "🇯🇵",       "❤️",
                                             "→",        "∑",
                                             "√",        "≈",
                                             "()",       "{}",
                                             "[]",       "->",
                                             "::",       "==",
                                             "!=",       "//",
                                             "/*",       "*/",
                                             "#include", "std::vector<int>",
                                             "x += 1;",  "'s",
                                             "'t",       "n't",
                                             "'re",      "'ll",
                                             "'ve",      "'d",
                                             "...",      "?!",
                                             "--",       "\"",
                                             "'",        "$",
                                             "%",        "<|endoftext|>",
                                             "<s>",      "<|im_end|>"};
    for (int w = 0; w < 4000; ++w) {
      std::string word;
      uint64_t kind = next() % 100;
      if (kind < 6) {
        word = extras[next() % extras.size()];
      } else if (kind < 14) {
        size_t digits = 1 + next() % 12;
        for (size_t d = 0; d < digits; ++d)
          word.push_back(static_cast<char>('0' + next() % 10));
      } else if (kind < 17) {
        // A Hangul syllable block, computed from its parts.
        for (uint64_t n = 1 + next() % 3; n > 0; --n)
          strings::append_utf8(word, 0xAC00 + static_cast<char32_t>(next() % 11172));
      } else {
        const auto& script = syllables[kind < 55 ? 0 : 1 + next() % (syllables.size() - 1)];
        for (uint64_t n = 1 + next() % 4; n > 0; --n)
          word += script[next() % script.size()];
        if (kind < 25 && static_cast<unsigned char>(word[0]) < 0x80)
          word[0] = static_cast<char>(word[0] - 'a' + 'A');
      }
      words_.push_back(word);
    }
    double total = 0;
    for (size_t r = 0; r < words_.size(); ++r) {
      total += 1.0 / std::pow(static_cast<double>(r + 1), 1.1);
      cumulative_.push_back(total);
    }
  }

  /// About `bytes` bytes of text (valid UTF-8; never cut inside a word).
  std::string text(size_t bytes) {
    static const char* separators[] = {" ",  " ",  " ",    " ",  " ",  " ",   " ",    ", ",
                                       ". ", "\n", "\n\n", "\t", "  ", " - ", "\r\n", ": "};
    std::string out;
    while (out.size() < bytes) {
      double x = uniform() * cumulative_.back();
      size_t r = static_cast<size_t>(std::lower_bound(cumulative_.begin(), cumulative_.end(), x) -
                                     cumulative_.begin());
      out += words_[std::min(r, words_.size() - 1)];
      out += separators[next() % (sizeof(separators) / sizeof(separators[0]))];
    }
    return out;
  }

private:
  uint64_t next() {
    // splitmix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) / 9007199254740992.0; }

  uint64_t state_;
  std::vector<std::string> words_;
  std::vector<double> cumulative_;
};

} // namespace rlforge::text::test
