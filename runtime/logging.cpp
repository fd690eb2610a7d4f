#include "runtime/logging.hpp"

#include <mutex>

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace rlforge::runtime {

namespace {

std::mutex& logger_mutex() {
  static std::mutex mx;
  return mx;
}

} // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& name) {
  std::lock_guard<std::mutex> guard{logger_mutex()};
  if (auto existing = spdlog::get(name))
    return existing;
  auto created = spdlog::stderr_color_mt(name);
  created->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
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

void init_logging(const std::string& default_level) {
  std::lock_guard<std::mutex> guard{logger_mutex()};
  spdlog::set_level(spdlog::level::from_str(default_level));
  spdlog::cfg::load_env_levels();
}

} // namespace rlforge::runtime
