#pragma once

// Shared by the tests/chat suites: render a template, expect a template_error.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/jinja_template.hpp"

namespace rlforge::chat::test {

using json = nlohmann::ordered_json;

/// Renders `source` with `vars` (a JSON object given as text).
inline std::string render(const std::string& source, const std::string& vars = "{}") {
  return jinja_template(source).render(json::parse(vars));
}

/// Compiles and renders `source`; expects a template_error of `kind` whose message holds every
/// one of `parts` (and a position when `line` > 0).
inline void expect_error(const std::string& source, const std::string& vars, error_kind kind,
                         std::initializer_list<std::string> parts, int line = 0, int column = 0) {
  try {
    const std::string out = render(source, vars);
    ADD_FAILURE() << "no error for " << source << "; rendered \"" << out << "\"";
  } catch (const template_error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << p << "\"";
    if (line > 0) {
      EXPECT_EQ(e.where().line, line) << e.what();
      EXPECT_EQ(e.where().column, column) << e.what();
    }
  }
}

} // namespace rlforge::chat::test
