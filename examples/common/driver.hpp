#pragma once
// Driver plumbing shared by the examples (sft, ppo, grpo, placement_demo): command-line
// options, the JSONL metrics file, the actor-system configuration, the model config, fatal-error
// handling and the driver's exit paths (run_driver: failures and stop signals stop the job's
// actors before the actor system goes), spawning a worker group in its own placement group,
// shutdown and the first/last averages the examples check. Header-only so each example stays a
// single translation unit. Everything here runs on the driver's main thread, except
// `job_stops`, which run_driver's signal thread uses too.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/cluster.hpp"
#include "actors/dispatcher.hpp"
#include "actors/placement_manager.hpp"
#include "actors/trainer_client.hpp"
#include "runtime/logging.hpp"
#include "runtime/stop_signals.hpp"
#include "runtime/system_config.hpp"
#include "examples/common/command_line.hpp"

namespace rlforge::examples {

/// The options every example takes; `count` is the loop length (`--steps`, `--iterations`).
struct driver_options {
  int count = 0;
  int batch = 32;
  int ranks = 2;
  double lr = 0;
  uint64_t seed = 1;
  std::string metrics;
  bool quiet = false;
  std::string cluster; ///< HOST:PORT of a cluster head (--cluster); empty = embedded
  std::string tls;     ///< the cluster's TLS directory (--tls)
  std::string log_level; ///< --log-level (empty: the default, or SPDLOG_LEVEL)
  std::string log_format; ///< --log-format (empty: text)
};

namespace detail {

/// Checks and stores the value of flag `name` (as CLI11 captured it) into `o`; returns the error
/// naming the flag and the value, or "".
inline std::string store_flag(const std::string& name, const std::string& count_flag,
                              const std::string& v, driver_options& o) {
  long long n = 0;
  if (name == count_flag || name == "--batch" || name == "--ranks") {
    if (!parse_integer(v, 1, 1000000000, n))
      return name + " must be an integer >= 1, got '" + v + "'";
    (name == count_flag ? o.count : name == "--batch" ? o.batch : o.ranks) = static_cast<int>(n);
  } else if (name == "--lr") {
    if (!parse_number(v, o.lr) || !(o.lr > 0))
      return "--lr must be a finite number > 0, got '" + v + "'";
  } else if (name == "--seed") {
    if (!parse_integer(v, 0, std::numeric_limits<long long>::max(), n))
      return "--seed must be a non-negative integer, got '" + v + "'";
    o.seed = static_cast<uint64_t>(n);
  } else if (name == "--log-level") {
    if (auto why = runtime::check_log_level(v); !why.empty())
      return "--" + why;
    o.log_level = v;
  } else if (name == "--log-format") {
    if (auto why = runtime::check_log_format(v); !why.empty())
      return "--" + why;
    o.log_format = v;
  } else {
    if (v.empty())
      return name + " needs a non-empty value";
    (name == "--metrics" ? o.metrics : name == "--cluster" ? o.cluster : o.tls) = v;
  }
  return "";
}

} // namespace detail

/// What a driver's command line says besides its options.
struct driver_help {
  const char* about;      ///< what the program does (one paragraph)
  const char* count_help; ///< what `count_flag` counts
  const char* example;    ///< one command line
};

/// Parses `count_flag N`, `--batch B`, `--ranks R`, `--lr X`, `--seed S`, `--metrics FILE`,
/// `--quiet`, `--cluster HOST:PORT`, `--tls DIR` and `--log-level L` into `o` with CLI11 (the
/// values `o` holds are the defaults --help shows). On a bad argument prints "<prog>: ..." naming
/// the flag and the value, and where to find the help, to stderr and returns false. `--help`
/// (or `-h`) prints the usage line, `help.about`, each flag with its meaning and default, and the
/// example to stdout and ends the process with status 0 (nothing has started yet).
inline bool parse_options(int argc, char** argv, const char* prog, const std::string& count_flag,
                          driver_options& o, const driver_help& help) {
  CLI::App app{"", prog};
  describe(app, std::string(help.about) + "\nIt runs embedded (one process) unless --cluster.",
           std::string("  ") + help.example);
  std::vector<std::pair<std::string, std::string>> given;
  auto valued = [&](const std::string& name, const char* value, const std::string& what,
                    const std::string& def) {
    auto* opt = app.add_option_function<std::string>(
        name, [&given, name](const std::string& v) { given.emplace_back(name, v); }, what);
    opt->type_name(value);
    if (!def.empty())
      opt->default_str(def);
  };
  std::ostringstream lr;
  lr << o.lr;
  valued(count_flag, "N", help.count_help, std::to_string(o.count));
  valued("--batch", "B", "examples per step", std::to_string(o.batch));
  valued("--ranks", "R", "data-parallel ranks (virtual GPUs)", std::to_string(o.ranks));
  valued("--lr", "X", "learning rate (> 0)", lr.str());
  valued("--seed", "S", "seed of the model and the data (>= 0)", std::to_string(o.seed));
  valued("--metrics", "FILE", "JSONL metrics, one record per step", o.metrics);
  app.add_flag("--quiet", o.quiet, "no progress bar");
  valued("--cluster", "HOST:PORT", "run the ranks on a cluster's nodes (rlforge head / node)",
         "");
  valued("--tls", "DIR", "the cluster's TLS directory", "");
  valued("--log-level", "L", "trace, debug, info, warn, error, critical or off", "");
  valued("--log-format", "F", "log lines: text, or json (one object per line)", "");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (see %s --help)\n", prog, e.what(), prog);
    return false;
  }
  for (const auto& [name, value] : given)
    if (auto why = detail::store_flag(name, count_flag, value, o); !why.empty()) {
      std::fprintf(stderr, "%s: %s (see %s --help)\n", prog, why.c_str(), prog);
      return false;
    }
  return true;
}

/// Opens the JSONL metrics file for appending; prints "<prog>: cannot open ..." on failure.
inline bool open_metrics(std::ofstream& out, const std::string& path, const char* prog) {
  out.open(path, std::ios::app);
  if (!out) {
    std::fprintf(stderr, "%s: cannot open metrics file '%s'\n", prog, path.c_str());
    return false;
  }
  return true;
}

/// Sets `gpus` virtual GPUs on `cfg` and applies the defaults (and the environment); with
/// `cluster` (or RLFORGE_CLUSTER) the driver attaches to that cluster instead of running the
/// embedded default, over TLS with `tls`; `log_level` and `log_format` (when not empty) are
/// rlforge's `--log-level` and `--log-format` (checked there: a bad value is refused naming the
/// valid ones). Prints the error
/// on failure. Also blocks SIGINT and
/// SIGTERM in this thread and the threads it starts (the actor system's), so `run_driver` takes
/// them as requests to stop the job: call it before creating the actor system.
inline bool configure(runtime::system_config& cfg, int gpus, const char* prog,
                      const std::string& cluster = {}, const std::string& tls = {},
                      const std::string& log_level = {}, const std::string& log_format = {}) {
  runtime::block_stop_signals();
  cfg.gpus = gpus;
  std::vector<std::string> args;
  if (!cluster.empty())
    args = {"--cluster", cluster};
  if (!tls.empty()) {
    args.push_back("--tls");
    args.push_back(tls);
  }
  if (!log_level.empty()) {
    args.push_back("--log-level");
    args.push_back(log_level);
  }
  if (!log_format.empty()) {
    args.push_back("--log-format");
    args.push_back(log_format);
  }
  if (auto err = cfg.parse_args(args)) {
    std::fprintf(stderr, "%s: %s\n", prog, caf::to_string(err).c_str());
    return false;
  }
  return true;
}

/// The examples' model: a 2-layer Llama (hidden 64, 4 heads, 2 KV heads) with `vocab_size` tokens
/// and `context` positions.
inline nlohmann::json llama_config(int64_t vocab_size, int64_t context = 64) {
  return nlohmann::json{{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"vocab_size", vocab_size},
                        {"hidden_size", 64},
                        {"intermediate_size", 128},
                        {"num_hidden_layers", 2},
                        {"num_attention_heads", 4},
                        {"num_key_value_heads", 2},
                        {"max_position_embeddings", context},
                        {"rms_norm_eps", 1e-6},
                        {"tie_word_embeddings", false}};
}

/// What stops a job's actors, run once (last added first), by `run_driver` after a failure or
/// from its signal thread. Thread-safe.
class job_stops {
public:
  void add(std::function<void()> stop) {
    std::lock_guard<std::mutex> guard{mutex_};
    stops_.push_back(std::move(stop));
  }

  /// Runs every stop added so far that has not run yet.
  void run() {
    std::vector<std::function<void()>> now;
    {
      std::lock_guard<std::mutex> guard{mutex_};
      now.swap(stops_);
    }
    for (auto i = now.rbegin(); i != now.rend(); ++i)
      (*i)();
  }

  /// The stop signal that ended the job (0: none).
  std::atomic<int> signal{0};

private:
  std::mutex mutex_;
  std::vector<std::function<void()>> stops_;
};

/// Ends a driver's run with `status` (thrown by `fatal_errors`, caught by `run_driver`): the
/// stack unwinds, so the actor system is shut down before static destruction.
struct fatal_exit {
  int status = 1;
};

/// Why the cluster head of `sys`'s session is lost, or "" (embedded, or the head is there). A
/// failure caused by the head's loss often reaches the driver first as its ranks stopping (the
/// nodes stop a lost head's ranks), so this waits up to `grace` for the session to hear of it.
inline std::string lost_head(caf::actor_system& sys, std::chrono::milliseconds grace) {
  const auto until = std::chrono::steady_clock::now() + grace;
  for (;;) {
    auto session = actors::cluster_session(sys);
    if (!session)
      return sys.render(session.error());
    if (!*session || std::chrono::steady_clock::now() >= until)
      return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

/// A failed call thrown by `fatal_errors` instead of `fatal_exit` while a `deferred_failures`
/// scope is open: the job may recover from it (a lost rank) or report it with `fail`.
struct deferred_failure {
  caf::error error;
  std::string what;
};

/// Unwraps results, or prints "<prog>: <what> failed: <error>" (and the lost cluster head when
/// that is the cause) and ends the run with status 1 (`fatal_exit`). While a `deferred_failures`
/// scope is open on it, a failed call throws `deferred_failure` instead, printing nothing.
///
/// It also keeps what stops the job's actors (`job_stops`; `run_driver` runs them on a failure
/// path or a stop signal): the placement manager, the dispatcher and the groups spawned through
/// it register themselves. Copies share the list.
struct fatal_errors {
  const char* prog;
  caf::actor_system& sys;
  std::shared_ptr<job_stops> stops = std::make_shared<job_stops>();

  /// Unwraps a spawned group and remembers to stop it on a failure path.
  actors::actor_group group(caf::expected<actors::actor_group> x, const char* what) const {
    auto g = (*this)(std::move(x), what);
    stops->add([g]() mutable { g.stop(); });
    return g;
  }

  /// A new dispatcher, stopped on a failure path.
  caf::actor dispatcher() const {
    auto d = actors::spawn_dispatcher(sys);
    stops->add([d] { caf::anon_send_exit(d, caf::exit_reason::user_shutdown); });
    return d;
  }

  template <class T> T operator()(caf::expected<T> x, const char* what) const {
    if (!x)
      failed(x.error(), what);
    return std::move(*x);
  }

  void operator()(caf::expected<void> x, const char* what) const {
    if (!x)
      failed(x.error(), what);
  }

  /// Open `deferred_failures` scopes (the driver's main thread only).
  mutable int deferring = 0;

  /// `fail`, or `deferred_failure` while a scope defers.
  [[noreturn]] void failed(const caf::error& err, const char* what) const {
    if (deferring > 0)
      throw deferred_failure{err, what};
    fail(err, what);
  }

  [[noreturn]] void fail(const caf::error& err, const char* what) const {
    std::fprintf(stderr, "\n%s: %s failed: %s\n", prog, what, sys.render(err).c_str());
    if (auto head = lost_head(sys, std::chrono::seconds(1)); !head.empty())
      std::fprintf(stderr, "%s: cause: %s\n", prog, head.c_str());
    throw fatal_exit{1};
  }
};

/// While alive, the failed calls of `or_die` throw `deferred_failure` (when `on`).
class deferred_failures {
public:
  deferred_failures(const fatal_errors& or_die, bool on) : or_die_(or_die), on_(on) {
    if (on_)
      ++or_die_.deferring;
  }
  ~deferred_failures() {
    if (on_)
      --or_die_.deferring;
  }
  deferred_failures(const deferred_failures&) = delete;
  deferred_failures& operator=(const deferred_failures&) = delete;

private:
  const fatal_errors& or_die_;
  bool on_;
};

/// Waits up to `limit` for every actor of `sys` to end; how many still run.
inline size_t wait_for_actors(caf::actor_system& sys, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (sys.registry().running() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return sys.registry().running();
}

/// Ends the process now with `status`, its output flushed: no destructor runs, so no actor can
/// run during static destruction.
[[noreturn]] inline void exit_now(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}

/// After a failure: stops the job's actors (last registered first) and waits up to 10 s for
/// every actor of the system to end, so its destructor finds nothing running. An actor that
/// cannot end (a rank blocked waiting on a peer that is gone) would hold the destructor, or run
/// while the process tears down: then the process ends here (`exit_now`). The status is
/// `status`, or 128 + the signal's number when a stop signal came.
inline int stop_after_failure(const fatal_errors& or_die, int status) {
  or_die.stops->run();
  if (int sig = or_die.stops->signal.load(); sig != 0)
    status = 128 + sig;
  if (auto left = wait_for_actors(or_die.sys, std::chrono::seconds(10)); left > 0) {
    std::fprintf(stderr, "%s: %zu actors did not stop within 10 s; exiting without them\n",
                 or_die.prog, left);
    exit_now(status);
  }
  return status;
}

/// Runs a driver's job on `or_die.sys` and returns its exit status. Every way out ends here:
/// the job's return, a `fatal_exit`, or an exception from a backend (printed, status 1). On the
/// failure paths the job's actors (its groups, dispatcher, cluster session) are stopped first
/// (`stop_after_failure`), so the actor system's destructor (in the caller, before static
/// destruction) neither waits forever nor leaves an actor running while the process exits. A
/// stop signal stops the actors too and ends the process with 128 + the signal's number.
/// stdout is line-buffered so a log follows the job.
template <class Job> int run_driver(const fatal_errors& or_die, Job&& job) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // SIGINT/SIGTERM (blocked by `configure`): the job's actors are stopped (the session tells
  // the head, which frees the job's placement groups), given 2 s to end, and the process ends
  // with 128 + the signal, whatever the job's thread is waiting for.
  runtime::stop_watcher signals{runtime::block_stop_signals(), [&or_die](int sig) {
                                  std::fprintf(stderr, "\n%s: %s: stopping the job\n", or_die.prog,
                                               strsignal(sig));
                                  or_die.stops->signal.store(sig);
                                  or_die.stops->run();
                                  wait_for_actors(or_die.sys, std::chrono::seconds(2));
                                  exit_now(128 + sig);
                                }};
  try {
    return job();
  } catch (const fatal_exit& e) {
    return stop_after_failure(or_die, e.status);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "\n%s: %s\n", or_die.prog, e.what());
    return stop_after_failure(or_die, 1);
  }
}

/// The placement-group manager of the driver: a local one in the embedded default, the cluster's
/// with --cluster (actors/cluster.hpp). Exits with a message when the cluster is unreachable.
inline caf::actor placement(const fatal_errors& or_die, caf::actor_system& sys,
                            const runtime::system_config& cfg) {
  auto manager = or_die(actors::placement_manager_for(sys, cfg, std::chrono::seconds(30)),
                        "placement manager");
  or_die.stops->add([manager] { actors::stop_placement_manager(manager); });
  return manager;
}

/// The spec of group `role`: one rank of `kind` per bundle of `pg` (times `per_bundle`) at
/// `gpu` GPU per rank, reserved through `manager` (so roles sharing a bundle add up exactly), one
/// thread each.
inline actors::group_spec role_group_spec(const caf::actor& manager,
                                          const placement_group_info& pg, const std::string& role,
                                          const std::string& kind, bool collectives, double gpu,
                                          int per_bundle = 1) {
  actors::group_spec spec;
  spec.name = role;
  spec.kind = kind;
  spec.placement = pg;
  spec.num_ranks = per_bundle * static_cast<int32_t>(pg.bundles.size());
  spec.gpu_per_rank = gpu;
  spec.threads_per_rank = 1;
  spec.collectives = collectives;
  spec.placement_manager = manager;
  return spec;
}

/// Creates placement group `pg_name` of `ranks` bundles of `bundle` and spawns a group named
/// `role` of worker kind `role` in it (`what` names the spawn in a fatal error).
inline actors::actor_group spawn_group(const fatal_errors& or_die, actors::placement_client& pgs,
                                       const caf::actor& manager, const std::string& pg_name,
                                       const std::string& role, int ranks,
                                       const resource_amounts& bundle, const char* what) {
  std::vector<resource_amounts> bundles(static_cast<size_t>(ranks), bundle);
  auto pg = or_die(pgs.create({pg_name, bundles, "pack", 30}), "placement group");
  actors::group_spec spec;
  spec.name = role;
  spec.kind = role;
  spec.placement = pg;
  spec.threads_per_rank = 1;
  spec.placement_manager = manager;
  return or_die.group(actors::actor_group::spawn(or_die.sys, spec), what);
}

/// Stops the dispatcher and the placement manager, or detaches from the cluster (stop the groups
/// first).
inline void shutdown(actors::trainer_client& client, const caf::actor& manager) {
  caf::anon_send_exit(client.dispatcher(), caf::exit_reason::user_shutdown);
  actors::stop_placement_manager(manager);
}

/// Seconds elapsed since `t0` on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Means of the first and of the last min(k, size) values (single iterations are noisy).
inline std::pair<double, double> first_last_means(const std::vector<double>& xs, size_t k) {
  k = std::min<size_t>(k, xs.size());
  double first = 0, last = 0;
  for (size_t i = 0; i < k; ++i) {
    first += xs[i] / static_cast<double>(k);
    last += xs[xs.size() - 1 - i] / static_cast<double>(k);
  }
  return {first, last};
}

} // namespace rlforge::examples
