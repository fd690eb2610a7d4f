#include "runtime/logging.hpp"

#include <chrono>
#include <cstdio>
#include <mutex>

#include <spdlog/cfg/env.h>
#include <spdlog/formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "strings/format.hpp"

namespace rlforge::runtime {

namespace {

std::mutex& logger_mutex() {
  static std::mutex mx;
  return mx;
}

constexpr const char* text_pattern = "[%H:%M:%S.%e] [%n] [%^%l%$] %v";

/// The format every logger writes in (guarded by logger_mutex).
std::string& current_format() {
  static std::string format = "text";
  return format;
}

void append_json_string(std::string& out, const char* data, size_t size) {
  out.push_back('"');
  for (size_t i = 0; i < size; ++i) {
    const auto c = static_cast<unsigned char>(data[i]);
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\r':
      out += "\\r";
      break;
    default:
      if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
      } else {
        out.push_back(static_cast<char>(c));
      }
    }
  }
  out.push_back('"');
}

/// spdlog's formatter for the "json" format: `json_log_line` of each message.
class json_formatter final : public spdlog::formatter {
public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        msg.time.time_since_epoch())
                        .count();
    const auto level = spdlog::level::to_string_view(msg.level);
    auto line = json_log_line(std::string(msg.logger_name.data(), msg.logger_name.size()),
                              std::string(level.data(), level.size()),
                              static_cast<uint64_t>(msg.thread_id), static_cast<int64_t>(ms),
                              std::string(msg.payload.data(), msg.payload.size()));
    line.push_back('\n');
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<json_formatter>();
  }
};

void apply_format(spdlog::logger& l, const std::string& format) {
  if (format == "json")
    l.set_formatter(std::make_unique<json_formatter>());
  else
    l.set_pattern(text_pattern);
}

} // namespace

std::string json_log_line(const std::string& logger, const std::string& level, uint64_t thread,
                          int64_t unix_ms, const std::string& message) {
  std::string out = "{\"time\":\"";
  out += strings::iso_time(unix_ms);
  out += "\",\"level\":";
  append_json_string(out, level.data(), level.size());
  out += ",\"logger\":";
  append_json_string(out, logger.data(), logger.size());
  out += ",\"thread\":" + std::to_string(thread) + ",\"message\":";
  append_json_string(out, message.data(), message.size());
  out += "}";
  return out;
}

std::shared_ptr<spdlog::logger> logger(const std::string& name) {
  std::lock_guard<std::mutex> guard{logger_mutex()};
  if (auto existing = spdlog::get(name))
    return existing;
  auto created = spdlog::stderr_color_mt(name);
  apply_format(*created, current_format());
  // Loggers created after init_logging still honour SPDLOG_LEVEL.
  spdlog::cfg::load_env_levels();
  return created;
}

const std::vector<std::string>& log_level_names() {
  static const std::vector<std::string> names = {"trace", "debug",    "info", "warn",
                                                 "error", "critical", "off"};
  return names;
}

std::string check_log_level(const std::string& level) {
  std::string known;
  for (const auto& l : log_level_names()) {
    if (l == level)
      return "";
    known += (known.empty() ? "" : ", ") + l;
  }
  return "log-level must be one of " + known + "; got '" + level + "'";
}

const std::vector<std::string>& log_format_names() {
  static const std::vector<std::string> names = {"text", "json"};
  return names;
}

std::string check_log_format(const std::string& format) {
  if (format == "text" || format == "json")
    return "";
  return "log-format must be text or json; got '" + format + "'";
}

void init_logging(const std::string& default_level, const std::string& format) {
  std::lock_guard<std::mutex> guard{logger_mutex()};
  spdlog::set_level(spdlog::level::from_str(default_level));
  spdlog::cfg::load_env_levels();
  if (check_log_format(format).empty() && format != current_format()) {
    current_format() = format;
    spdlog::apply_all([&](const std::shared_ptr<spdlog::logger>& l) { apply_format(*l, format); });
  }
}

} // namespace rlforge::runtime
