#pragma once

// A strict reader of Prometheus' text exposition format for tests: what `GET /metrics` serves
// (rlforge serve, rlforge head) must parse line by line, every sample must belong to a family
// declared by `# TYPE` before it, and histogram buckets must be cumulative. Header-only, std only.

#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

namespace rlforge::test {

struct prometheus_scrape {
  std::map<std::string, std::string> types;  ///< family → counter | gauge | histogram
  std::map<std::string, double> samples;     ///< `name{a="x",b="y"}` (as written) → value
  std::string error;                         ///< empty when the whole text parsed

  /// The value of the series `key` (e.g. `rlforge_nodes{state="alive"}`), or `fallback`.
  double value(const std::string& key, double fallback = -1) const {
    auto it = samples.find(key);
    return it == samples.end() ? fallback : it->second;
  }
  /// The sum over every series of `name` whose key contains each of `parts`.
  double sum(const std::string& name, const std::string& part = "") const {
    double total = 0;
    for (const auto& [key, v] : samples)
      if ((key == name || key.rfind(name + "{", 0) == 0) && key.find(part) != std::string::npos)
        total += v;
    return total;
  }
};

inline prometheus_scrape parse_prometheus(const std::string& text) {
  prometheus_scrape out;
  std::istringstream in(text);
  std::string line;
  int n = 0;
  auto fail = [&](const std::string& why) {
    if (out.error.empty())
      out.error = "line " + std::to_string(n) + ": " + why + ": '" + line + "'";
  };
  std::map<std::string, double> last_bucket; // histogram series → last cumulative count
  while (std::getline(in, line)) {
    ++n;
    if (line.empty())
      continue;
    if (line[0] == '#') {
      std::istringstream words(line);
      std::string hash, what, name, rest;
      words >> hash >> what >> name;
      std::getline(words, rest);
      if (what == "TYPE") {
        const std::string type = rest.empty() ? "" : rest.substr(1);
        if (type != "counter" && type != "gauge" && type != "histogram")
          fail("unknown type");
        if (out.types.count(name))
          fail("family declared twice");
        out.types[name] = type;
      } else if (what != "HELP") {
        fail("a comment that is neither HELP nor TYPE");
      }
      continue;
    }
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) {
      fail("no value");
      continue;
    }
    const std::string name = line.substr(0, name_end);
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      // Label values are quoted strings with \\, \" and \n escapes.
      size_t i = name_end + 1;
      bool closed = false;
      while (i < line.size() && !closed) {
        size_t eq = line.find("=\"", i);
        if (eq == std::string::npos) {
          fail("a label without =\"");
          break;
        }
        i = eq + 2;
        while (i < line.size() && line[i] != '"')
          i += line[i] == '\\' ? 2 : 1;
        if (i >= line.size()) {
          fail("an unterminated label value");
          break;
        }
        ++i;
        if (i < line.size() && line[i] == ',')
          ++i;
        else if (i < line.size() && line[i] == '}')
          closed = true, ++i;
        else
          fail("labels not separated by ','");
      }
      value_at = i;
    }
    if (value_at >= line.size() || line[value_at] != ' ') {
      fail("no space before the value");
      continue;
    }
    const std::string key = line.substr(0, value_at);
    const std::string value_text = line.substr(value_at + 1);
    char* end = nullptr;
    double v = std::strtod(value_text.c_str(), &end);
    if (value_text == "+Inf")
      v = HUGE_VAL;
    else if (end == value_text.c_str() || *end != '\0')
      fail("the value is not a number");
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (family.size() > s.size() && family.compare(family.size() - s.size(), s.size(), s) == 0 &&
          out.types.count(family.substr(0, family.size() - s.size())) &&
          out.types[family.substr(0, family.size() - s.size())] == "histogram")
        family = family.substr(0, family.size() - s.size());
    }
    if (!out.types.count(family))
      fail("a sample before its family's # TYPE");
    if (out.samples.count(key))
      fail("a series written twice");
    if (name.size() > 7 && name.compare(name.size() - 7, 7, "_bucket") == 0) {
      const std::string series = key.substr(0, key.find("le=\""));
      auto it = last_bucket.find(series);
      if (it != last_bucket.end() && v < it->second)
        fail("histogram buckets that are not cumulative");
      last_bucket[series] = v;
    }
    out.samples[key] = v;
  }
  return out;
}

} // namespace rlforge::test
