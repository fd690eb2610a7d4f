// chat/template_renderer.hpp: loading tokenizer configurations and the variables a template sees.
#include "chat/template_renderer.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "tests/chat/test_support.hpp"
#include "tests/support/temp_dir.hpp"

namespace rlforge::chat::test {
namespace {

namespace fs = std::filesystem;

using rlforge::test_support::temp_dir;

const char* chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                     "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

void expect_config_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error (expected one mentioning " << part << ")";
  } catch (const template_error& e) {
    EXPECT_EQ(e.kind(), error_kind::config) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(ChatTemplateRenderer, RendersMessagesWithAndWithoutGenerationPrompt) {
  const auto r = template_renderer::from_tokenizer_config_json({{"chat_template", chatml}});
  const json messages = json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(r.render(messages, false), "<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(r.render(messages, true), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(r.template_names(), std::vector<std::string>{"default"});
}

TEST(ChatTemplateRenderer, PassesSpecialTokensToolsDocumentsAndExtraVariables) {
  const json config = json::parse(R"({
    "chat_template": "{{ bos_token }}|{{ eos_token }}|{{ pad_token is defined }}|{{ unk_token }}|{{ additional_special_tokens|join(',') }}|{{ tools is none }}|{{ documents is none }}|{{ flag|default('unset') }}",
    "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
    "eos_token": "</s>", "pad_token": null, "unk_token": "<unk>",
    "additional_special_tokens": ["<a>", {"content": "<b>"}]})");
  const auto r = template_renderer::from_tokenizer_config_json(config);
  EXPECT_EQ(r.render(json::array(), false), "<s>|</s>|False|<unk>|<a>,<b>|True|True|unset");
  EXPECT_EQ(
      r.render(json::array(), false, {{"flag", 1}, {"tools", json::array()}, {"eos_token", "E"}}),
      "<s>|E|False|<unk>|<a>,<b>|False|True|1");
  EXPECT_EQ(r.special_tokens()["bos_token"], "<s>");
}

TEST(ChatTemplateRenderer, KeepsTheKeyOrderOfMessagesAndTools) {
  const auto r = template_renderer::from_tokenizer_config_json(
      {{"chat_template", "{{ tools|tojson }}{% for m in messages %}{{ m|tojson }}{% endfor %}"}});
  const json tools = json::parse(R"([{"z": 1, "a": {"y": 2, "b": 3}}])");
  const json messages = json::parse(R"([{"role": "user", "content": "x", "b": 1}])");
  EXPECT_EQ(r.render(messages, false, {{"tools", tools}}),
            R"([{"z": 1, "a": {"y": 2, "b": 3}}]{"role": "user", "content": "x", "b": 1})");
}

TEST(ChatTemplateRenderer, ChoosesNamedTemplates) {
  const json config = json::parse(R"({"chat_template": [
      {"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"},
      {"name": "rag", "template": "R"}]})");
  const auto r = template_renderer::from_tokenizer_config_json(config);
  EXPECT_EQ(r.render(json::array(), false), "D");
  EXPECT_EQ(r.render(json::array(), false, {{"tools", json::array()}}), "T");
  EXPECT_EQ(r.render(json::array(), false, {{"tools", nullptr}}), "D");
  EXPECT_EQ(r.render(json::array(), false, json::object(), "rag"), "R");
  expect_config_error([&] { r.render(json::array(), false, json::object(), "x"); },
                      "no chat template named 'x' (available: default, rag, tool_use)");
  const json no_default = json::parse(R"({"chat_template": [{"name": "a", "template": "A"}]})");
  expect_config_error(
      [&] {
        template_renderer::from_tokenizer_config_json(no_default).render(json::array(), false);
      },
      "no chat template named 'default'");
}

TEST(ChatTemplateRenderer, LoadsADirectoryOrAFileAndPrefersChatTemplateJinja) {
  temp_dir d;
  d.write("tokenizer_config.json",
          json{{"chat_template", "config:{{ bos_token }}"}, {"bos_token", "<s>"}}.dump());
  EXPECT_EQ(template_renderer::from_tokenizer_config(d.path()).render(json::array(), false),
            "config:<s>");
  EXPECT_EQ(template_renderer::from_tokenizer_config(d.path() / "tokenizer_config.json")
                .render(json::array(), false),
            "config:<s>");
  d.write("chat_template.jinja", "file:{{ bos_token }}\n");
  EXPECT_EQ(template_renderer::from_tokenizer_config(d.path()).render(json::array(), false),
            "file:<s>");
}

TEST(ChatTemplateRenderer, RefusesBadConfigurationsNamingTheProblem) {
  temp_dir d;
  expect_config_error([&] { template_renderer::from_tokenizer_config(d.path()); },
                      "tokenizer_config.json does not exist");
  d.write("tokenizer_config.json", "{not json");
  expect_config_error([&] { template_renderer::from_tokenizer_config(d.path()); },
                      "is not valid JSON");
  d.write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  expect_config_error([&] { template_renderer::from_tokenizer_config(d.path()); },
                      "has no chat_template");
  expect_config_error(
      [] {
        template_renderer::from_tokenizer_config_json({{"chat_template", 5}});
      },
      "neither a string nor a list");
  expect_config_error(
      [] {
        template_renderer::from_tokenizer_config_json(
            {{"chat_template", "x"}, {"bos_token", json::array()}});
      },
      "bos_token is neither a string nor an AddedToken");
  try {
    template_renderer::from_tokenizer_config_json(
        json::parse(R"({"chat_template": [{"name": "default", "template": "{{ x|unique }}"}]})"));
    ADD_FAILURE() << "no error";
  } catch (const template_error& e) {
    EXPECT_EQ(e.kind(), error_kind::unsupported);
    EXPECT_NE(std::string(e.what()).find("template 'default': filter 'unique'"), std::string::npos)
        << e.what();
  }
}

TEST(ChatTemplateRenderer, RefusesBadArguments) {
  const auto r = template_renderer::from_tokenizer_config_json({{"chat_template", chatml}});
  EXPECT_THROW(r.render(json::object(), false), template_error);
  EXPECT_THROW(r.render(json::array(), false, json::array()), template_error);
  try {
    r.render(json::array(), false, {{"messages", json::array()}});
    ADD_FAILURE() << "no error";
  } catch (const template_error& e) {
    EXPECT_NE(std::string(e.what()).find("may not set 'messages'"), std::string::npos);
  }
}

TEST(ChatTemplateRenderer, ReportsTheTemplatesOwnRefusal) {
  const auto r = template_renderer::from_tokenizer_config_json(
      {{"chat_template", "{% if messages[0].role != 'user' %}{{ raise_exception('first must be "
                         "user') }}{% endif %}"}});
  try {
    r.render(json::parse(R"([{"role": "system", "content": "x"}])"), false);
    ADD_FAILURE() << "no error";
  } catch (const template_error& e) {
    EXPECT_EQ(e.kind(), error_kind::raised);
    EXPECT_EQ(e.detail(), "first must be user");
  }
}

} // namespace
} // namespace rlforge::chat::test
