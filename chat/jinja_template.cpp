#include "chat/jinja_template.hpp"

#include "chat/evaluator.hpp"
#include "chat/lexer.hpp"
#include "chat/parser.hpp"
#include "chat/unicode.hpp"
#include "chat/value.hpp"

namespace rlforge::chat {

namespace detail {

struct compiled_template {
  stmt_list program;
};

} // namespace detail

jinja_template::jinja_template(std::string_view source) {
  if (!detail::valid_utf8(source))
    throw template_error(error_kind::config, "the template source is not valid UTF-8");
  const std::string normalized = detail::normalize_newlines(source);
  auto compiled = std::make_shared<detail::compiled_template>();
  compiled->program = detail::parse(detail::tokenize(normalized));
  compiled_ = std::move(compiled);
}

std::string jinja_template::render(const nlohmann::ordered_json& variables) const {
  if (!variables.is_object())
    throw template_error(error_kind::runtime, "template variables must be a JSON object");
  const detail::value vars = detail::from_json(variables);
  return detail::render(compiled_->program, vars.as_dict());
}

} // namespace rlforge::chat
