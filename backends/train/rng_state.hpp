#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backends/error.hpp"

namespace rlforge::backends {

/// The random state a training process resumes from: torch's default CPU generator (its
/// serialized state bytes) plus any standard-library engines the caller keeps, by name.
struct rng_state {
  std::vector<uint8_t> torch_cpu;                 ///< `at::Generator::get_state()` bytes
  std::map<std::string, std::string> std_engines; ///< name → `operator<<` text of the engine
};

/// Captures the default CPU generator's state (thread-safe: holds the generator's mutex).
/// `std_engines` starts empty; add engines with `save_engine`.
rng_state capture_rng_state();

/// Restores the default CPU generator from `s.torch_cpu`. Throws `error{invalid_argument}`
/// when the bytes are empty or torch refuses them (wrong size). Engines are restored one by one
/// with `restore_engine`.
void restore_rng_state(const rng_state& s);

/// Records `engine`'s full state under `name` (any standard random engine).
template <class Engine>
void save_engine(rng_state& s, const std::string& name, const Engine& engine) {
  std::ostringstream out;
  out << engine;
  s.std_engines[name] = out.str();
}

/// Restores `engine` from the state recorded under `name`. Throws `error{not_found}` when there
/// is none and `error{decode_error}` when the text does not parse as that engine's state.
template <class Engine>
void restore_engine(const rng_state& s, const std::string& name, Engine& engine) {
  auto it = s.std_engines.find(name);
  if (it == s.std_engines.end())
    fail(error_code::not_found, "rng_state: no engine named '" + name + "'");
  std::istringstream in(it->second);
  Engine restored;
  in >> restored;
  if (in.fail())
    fail(error_code::decode_error,
         "rng_state: the state of engine '" + name + "' does not parse as this engine type");
  engine = restored;
}

} // namespace rlforge::backends
