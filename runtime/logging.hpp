#pragma once

#include <memory>
#include <string>
#include <vector>

#include <spdlog/logger.h>

namespace rlforge::runtime {

/// Returns the named logger ("runtime", "placement", "actors.group", ...), creating it on first
/// use. All loggers write to stderr with one format; levels come from `SPDLOG_LEVEL` (e.g.
/// `SPDLOG_LEVEL=info,actors.group=debug`), read once by `init_logging`. Thread-safe.
std::shared_ptr<spdlog::logger> logger(const std::string& name);

/// Applies `SPDLOG_LEVEL` from the environment and an optional default level ("info", "warn",
/// ...). Idempotent; called by the actor-system bootstrap.
void init_logging(const std::string& default_level = "warn");

/// The log levels `--log-level` accepts, most verbose first: trace, debug, info, warn, error,
/// critical, off.
const std::vector<std::string>& log_level_names();

/// Empty when `level` is one of `log_level_names()`; else why not, naming the valid ones
/// ("log-level must be one of trace, ...; got 'loud'").
std::string check_log_level(const std::string& level);

} // namespace rlforge::runtime
