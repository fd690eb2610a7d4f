#include "text/hf/post_processor.hpp"

#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "text/error.hpp"

namespace rlforge::text::hf {

namespace {

class byte_level final : public post_processor {
public:
  void process(std::vector<int32_t>&, bool) const override {}
};

class sequence final : public post_processor {
public:
  explicit sequence(std::vector<std::unique_ptr<const post_processor>> steps)
      : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    for (const auto& step : steps_)
      step->process(ids, add_special_tokens);
  }

private:
  std::vector<std::unique_ptr<const post_processor>> steps_;
};

// A template for one sequence: the ids to put before and after sequence A.
class template_processing final : public post_processor {
public:
  template_processing(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens)
      return;
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

private:
  std::vector<int32_t> before_;
  std::vector<int32_t> after_;
};

// One piece of a template: sequence A or B, or a named special token.
struct piece {
  enum kind { sequence_a, sequence_b, special } what;
  std::string name;
};

// HF's Piece::try_from for the string form: "$A", "$B", "$", "$<type id>" or a token name, each
// optionally followed by ":<type id>".
piece parse_piece_string(const std::string& s, const std::string& where) {
  std::string id = s;
  if (size_t colon = s.find(':'); colon != std::string::npos) {
    id = s.substr(0, colon);
    std::string type_id = s.substr(colon + 1);
    if (type_id.empty() || type_id.find_first_not_of("0123456789") != std::string::npos ||
        type_id.find(':') != std::string::npos)
      fail(where + ": cannot read template piece \"" + s + "\"");
  }
  if (!id.empty() && id[0] == '$') {
    std::string rest = id.substr(1);
    if (rest.empty() || rest == "A" || rest == "a")
      return {piece::sequence_a, ""};
    if (rest == "B" || rest == "b")
      return {piece::sequence_b, ""};
    if (rest.find_first_not_of("0123456789") == std::string::npos)
      return {piece::sequence_a, ""};
    fail(where + ": cannot read template piece \"" + s + "\"");
  }
  return {piece::special, id};
}

std::vector<piece> parse_template(const json& j, const std::string& where) {
  std::vector<piece> out;
  if (j.is_string()) {
    std::istringstream words(j.get<std::string>());
    std::string w;
    while (words >> w)
      out.push_back(parse_piece_string(w, where));
    return out;
  }
  if (!j.is_array())
    fail(where + ": expected an array or a string, got " + describe(j));
  for (size_t i = 0; i < j.size(); ++i) {
    std::string w = path(where, i);
    const json& e = j[i];
    if (e.is_string()) {
      out.push_back(parse_piece_string(e.get<std::string>(), w));
      continue;
    }
    require_object(e, w);
    if (e.size() != 1)
      fail(w + ": expected {\"Sequence\": ...} or {\"SpecialToken\": ...}, got " + e.dump());
    if (const json* s = find(e, "Sequence")) {
      std::string sw = path(w, "Sequence");
      require_known_fields(*s, {"id", "type_id"}, sw);
      std::string id = get_string(*s, "id", sw);
      get_int(*s, "type_id", 0, UINT32_MAX, sw);
      if (id == "A")
        out.push_back({piece::sequence_a, ""});
      else if (id == "B")
        out.push_back({piece::sequence_b, ""});
      else
        fail(path(sw, "id") + ": unknown sequence \"" + id + "\" (expected A or B)");
    } else if (const json* t = find(e, "SpecialToken")) {
      std::string tw = path(w, "SpecialToken");
      require_known_fields(*t, {"id", "type_id"}, tw);
      get_int(*t, "type_id", 0, UINT32_MAX, tw);
      out.push_back({piece::special, get_string(*t, "id", tw)});
    } else {
      fail(w + ": unknown template piece \"" + e.begin().key() +
           "\" (expected Sequence or SpecialToken)");
    }
  }
  return out;
}

std::unique_ptr<const post_processor> make_template(const json& j, const std::string& where) {
  require_known_fields(j, {"type", "single", "pair", "special_tokens"}, where);
  // special_tokens: name -> {id, ids, tokens}.
  std::map<std::string, std::vector<int32_t>> specials;
  std::string sw = path(where, "special_tokens");
  const json& st = require(j, "special_tokens", where);
  require_object(st, sw);
  for (auto it = st.begin(); it != st.end(); ++it) {
    std::string w = path(sw, it.key());
    require_known_fields(it.value(), {"id", "ids", "tokens"}, w);
    const json& ids = require(it.value(), "ids", w);
    const json& tokens = require(it.value(), "tokens", w);
    if (!ids.is_array() || !tokens.is_array() || ids.size() != tokens.size())
      fail(w + ": expected arrays \"ids\" and \"tokens\" of the same length");
    std::vector<int32_t> v;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0 ||
          ids[i].get<int64_t>() >= INT32_MAX)
        fail(path(path(w, "ids"), i) + ": expected a token id, got " + ids[i].dump());
      v.push_back(static_cast<int32_t>(ids[i].get<int64_t>()));
    }
    specials.emplace(it.key(), std::move(v));
  }
  auto single = parse_template(require(j, "single", where), path(where, "single"));
  // The pair template is never applied (this library encodes single sequences) but must be
  // well-formed, as HF requires.
  auto pair = parse_template(require(j, "pair", where), path(where, "pair"));
  for (const auto* t : {&single, &pair})
    for (const piece& p : *t)
      if (p.what == piece::special && specials.count(p.name) == 0)
        fail(where + ": the template uses special token \"" + p.name +
             "\" missing from special_tokens");
  std::vector<int32_t> before, after;
  bool seen_a = false;
  for (const piece& p : single) {
    if (p.what == piece::sequence_b)
      fail(path(where, "single") + ": the single-sequence template uses $B");
    if (p.what == piece::sequence_a) {
      if (seen_a)
        fail(path(where, "single") + ": the single-sequence template uses $A twice");
      seen_a = true;
      continue;
    }
    auto& dst = seen_a ? after : before;
    dst.insert(dst.end(), specials[p.name].begin(), specials[p.name].end());
  }
  if (!seen_a)
    fail(path(where, "single") + ": the single-sequence template does not contain $A");
  return std::make_unique<template_processing>(std::move(before), std::move(after));
}

} // namespace

std::unique_ptr<const post_processor> make_post_processor(const json& j, const std::string& where) {
  std::string type = type_of(j, where);
  if (type == "TemplateProcessing")
    return make_template(j, where);
  if (type == "ByteLevel") {
    require_known_fields(j, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, where);
    get_bool(j, "add_prefix_space", true, where);
    get_bool(j, "trim_offsets", true, where);
    get_bool(j, "use_regex", true, where);
    return std::make_unique<byte_level>();
  }
  if (type == "Sequence") {
    require_known_fields(j, {"type", "processors"}, where);
    const json& list = require(j, "processors", where);
    std::string list_where = path(where, "processors");
    if (!list.is_array())
      fail(list_where + ": expected an array, got " + describe(list));
    std::vector<std::unique_ptr<const post_processor>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(make_post_processor(list[i], path(list_where, i)));
    return std::make_unique<sequence>(std::move(steps));
  }
  fail(where + ": unsupported post_processor type \"" + type +
       "\" (supported: TemplateProcessing, ByteLevel, Sequence)");
}

} // namespace rlforge::text::hf
