#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <spdlog/logger.h>

namespace rlforge::runtime {

/// Returns the named logger ("runtime", "placement", "actors.group", ...), creating it on first
/// use. All loggers write to stderr in one format (`init_logging`); levels come from
/// `SPDLOG_LEVEL` (e.g. `SPDLOG_LEVEL=info,actors.group=debug`), read once by `init_logging`.
/// Thread-safe.
std::shared_ptr<spdlog::logger> logger(const std::string& name);

/// Applies `SPDLOG_LEVEL` from the environment, an optional default level ("info", "warn", ...)
/// and the line format of every logger, existing or later (`log_format_names`). Idempotent;
/// called by the actor-system bootstrap (`system_config`'s `--log-level` and `--log-format`).
void init_logging(const std::string& default_level = "info", const std::string& format = "text");

/// The line formats `--log-format` accepts: "text" (`[12:34:56.789] [logger] [level] message`)
/// and "json" (one object per line: `time` in UTC, ISO 8601 with milliseconds, `level`,
/// `logger`, `thread` and `message`, escaped as JSON strings are).
const std::vector<std::string>& log_format_names();

/// Empty when `format` is one of `log_format_names()`; else why not, naming the valid ones.
std::string check_log_format(const std::string& format);

/// One log line in the "json" format, for `logger` at `level` ("info", ...) from `thread` at
/// `unix_ms`: exposed for tests.
std::string json_log_line(const std::string& logger, const std::string& level, uint64_t thread,
                          int64_t unix_ms, const std::string& message);

/// The log levels `--log-level` accepts, most verbose first: trace, debug, info, warn, error,
/// critical, off.
const std::vector<std::string>& log_level_names();

/// Empty when `level` is one of `log_level_names()`; else why not, naming the valid ones
/// ("log-level must be one of trace, ...; got 'loud'").
std::string check_log_level(const std::string& level);

} // namespace rlforge::runtime
