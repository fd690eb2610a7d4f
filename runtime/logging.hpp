#pragma once

#include <memory>
#include <string>

#include <spdlog/logger.h>

namespace rlforge::runtime {

/// Returns the named logger ("runtime", "placement", "actors.group", ...), creating it on first
/// use. All loggers write to stderr with one format; levels come from `SPDLOG_LEVEL` (e.g.
/// `SPDLOG_LEVEL=info,actors.group=debug`), read once by `init_logging`. Thread-safe.
std::shared_ptr<spdlog::logger> logger(const std::string& name);

/// Applies `SPDLOG_LEVEL` from the environment and an optional default level ("info", "warn",
/// ...). Idempotent; called by the actor-system bootstrap.
void init_logging(const std::string& default_level = "warn");

} // namespace rlforge::runtime
