// `rlforge serve`: the Tinker-compatible training service (service/http_server.hpp) over the
// models of one base model. The API key comes from the environment (RLFORGE_API_KEY), never from
// the command line, where `ps` would show it.
#include "cli/command.hpp"
#include "runtime/stop_signals.hpp"

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <pthread.h>
#include <string>
#include <vector>
#include <thread>

#include <caf/actor_system.hpp>

#include "actors/cluster.hpp"
#include "actors/dispatcher_backend.hpp"
#include "actors/placement_manager.hpp"
#include "actors/engine.hpp"
#include "actors/tinker_backend.hpp"
#include "actors/worker.hpp"
#include "runtime/system_config.hpp"
#include "service/future_store.hpp"
#include "service/http_server.hpp"
#include "tinker/types.hpp"

namespace rlforge::cli {
namespace {

struct usage_error {
  std::string message;
};

int64_t parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || v < lo || v > hi)
    throw usage_error{flag + " expects an integer in " + std::to_string(lo) + ".." +
                      std::to_string(hi) + ", got '" + text + "'"};
  return static_cast<int64_t>(v);
}

/// What `rlforge serve` was asked for.
struct serve_config {
  std::string base_model_dir;
  std::string db = "rlforge-serve.db";
  int32_t threads = 1;              ///< torch threads of each model's rank
  std::string dtype = "fp32";       ///< compute dtype of models and engines
  bool batch_invariant = false;     ///< batch-invariant numerics
  int64_t max_tokens_per_micro_batch = 16384; ///< padding-free micro-batch budget
  size_t max_sampler_snapshots = 8; ///< sampler snapshots each model keeps
  int max_restarts = 0;             ///< rank losses healed (--max-restarts)
  int64_t recovery_timeout_s = 120; ///< how long one recovery waits for room
  int64_t recovery_checkpoint_every = 10; ///< optimizer steps between recovery checkpoints
  std::vector<std::string> node_args; ///< --log-level, --log-format: the actor system's
  service::server_options server;
};

/// The backend `rlforge serve` computes with and the actor system it runs on (destroyed in
/// reverse order: the backend stops its actors before the system goes).
struct serve_backend {
  std::unique_ptr<runtime::system_config> cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<actors::tinker_backend> backend;
};

/// Builds the backend: the one call that names the implementation (the dispatcher backend over
/// an in-process actor system: one actor group per model, engines for sampling). With
/// `--cluster HOST:PORT` the service attaches to that cluster as a driver and its models' ranks
/// run on a node of it: one placement group ("rlforge-serve", one bundle of `--threads` CPUs),
/// every model's group and engines in it; the head frees it when the service ends. With
/// `--max-restarts N` a lost node is healed (actors/tinker_healing.hpp): the placement group is
/// placed again and each model rebuilt from its recovery checkpoint and journal. Throws
/// `tinker::request_error` naming the base model directory when it cannot be loaded, and
/// `tinker::fail_server` naming the cluster when it cannot be reached or has no room.
serve_backend make_backend(const serve_config& c) {
  actors::register_worker_kinds();
  actors::register_engine_kind();
  serve_backend b;
  b.cfg = std::make_unique<runtime::system_config>();
  if (auto err = b.cfg->parse_args(c.node_args))
    tinker::fail_server("actor system configuration: " + caf::to_string(err));
  b.sys = std::make_unique<caf::actor_system>(*b.cfg);
  actors::dispatcher_backend_options o;
  o.base_model_dir = c.base_model_dir;
  o.threads_per_rank = c.threads;
  o.compute_dtype = c.dtype;
  o.batch_invariant = c.batch_invariant;
  o.max_tokens_per_micro_batch = c.max_tokens_per_micro_batch;
  o.max_sampler_snapshots = c.max_sampler_snapshots;
  o.max_restarts = c.max_restarts;
  o.recovery_timeout = std::chrono::seconds(c.recovery_timeout_s);
  o.recovery_checkpoint_every = c.recovery_checkpoint_every;
  o.recovery_dir = (std::filesystem::path(c.server.checkpoint_dir) / "recovery").string();
  if (!b.cfg->cluster.empty()) {
    auto manager = actors::placement_manager_for(*b.sys, *b.cfg, std::chrono::seconds(60));
    if (!manager)
      tinker::fail_server("--cluster: " + b.sys->render(manager.error()));
    actors::placement_client pgs{*b.sys, *manager};
    o.placement_request = {"rlforge-serve", {{{"CPU", static_cast<double>(c.threads)}}}, "pack",
                           60};
    auto pg = pgs.create(o.placement_request);
    if (!pg)
      tinker::fail_server("--cluster: no room for the service's models: " +
                          b.sys->render(pg.error()));
    o.placement = *pg;
    o.placement_manager = *manager;
  }
  b.backend = std::make_unique<actors::dispatcher_backend>(*b.sys, o);
  return b;
}

int run_serve(const parsed_flags& flags) {
  if (flags.has("--api-key")) {
    std::cerr << "rlforge serve: the API key is read from the environment variable "
                 "RLFORGE_API_KEY, never from the command line\n";
    return 2;
  }
  serve_config c;
  c.node_args = flags.node_args();
  try {
    c.base_model_dir = *flags.get("--base-model");
    if (!std::filesystem::is_directory(c.base_model_dir))
      throw usage_error{"--base-model '" + c.base_model_dir + "' is not a directory"};
    auto& o = c.server;
    o.host = flags.get("--host").value_or("127.0.0.1");
    o.port = static_cast<int>(parse_int("--port", flags.get("--port").value_or("8000"), 0, 65535));
    c.db = flags.get("--db").value_or(c.db);
    o.checkpoint_dir = flags.get("--checkpoint-dir").value_or("rlforge-checkpoints");
    if (auto v = flags.get("--workers"))
      o.scheduler.workers = static_cast<size_t>(parse_int("--workers", *v, 1, 256));
    if (auto v = flags.get("--max-pending-samples"))
      o.scheduler.max_pending_samples =
          static_cast<size_t>(parse_int("--max-pending-samples", *v, 1, 1 << 20));
    if (auto v = flags.get("--max-num-samples"))
      o.max_num_samples = parse_int("--max-num-samples", *v, 1, 1 << 24);
    if (auto v = flags.get("--sample-slice"))
      o.scheduler.sample_slice = parse_int("--sample-slice", *v, 1, 1 << 20);
    if (auto v = flags.get("--stream-chunk-tokens"))
      o.stream_chunk_tokens = parse_int("--stream-chunk-tokens", *v, 1, 4096);
    if (auto v = flags.get("--max-sampler-snapshots"))
      c.max_sampler_snapshots =
          static_cast<size_t>(parse_int("--max-sampler-snapshots", *v, 1, 4096));
    if (auto v = flags.get("--max-body-mb"))
      o.max_body_bytes = static_cast<size_t>(parse_int("--max-body-mb", *v, 1, 4096)) << 20;
    if (auto v = flags.get("--long-poll-s"))
      o.long_poll_hold = std::chrono::seconds(parse_int("--long-poll-s", *v, 1, 40));
    if (auto v = flags.get("--gap-timeout-s"))
      o.scheduler.gap_timeout = std::chrono::seconds(parse_int("--gap-timeout-s", *v, 1, 86400));
    if (auto v = flags.get("--threads"))
      c.threads = static_cast<int32_t>(parse_int("--threads", *v, 1, 256));
    if (auto v = flags.get("--dtype")) {
      if (*v != "fp32" && *v != "bf16")
        throw usage_error{"--dtype expects fp32 or bf16, got '" + *v + "'"};
      c.dtype = *v;
    }
    c.batch_invariant = flags.has("--batch-invariant");
    if (auto v = flags.get("--max-restarts"))
      c.max_restarts = static_cast<int>(parse_int("--max-restarts", *v, 0, 1000));
    if (auto v = flags.get("--recovery-timeout"))
      c.recovery_timeout_s = parse_int("--recovery-timeout", *v, 1, 86400);
    if (auto v = flags.get("--recovery-checkpoint-every"))
      c.recovery_checkpoint_every = parse_int("--recovery-checkpoint-every", *v, 1, 1 << 20);
    if (auto v = flags.get("--max-tokens-per-micro-batch"))
      c.max_tokens_per_micro_batch = parse_int("--max-tokens-per-micro-batch", *v, 1, 1 << 30);
    o.insecure_no_auth = flags.has("--insecure-no-auth");
    const char* key = std::getenv("RLFORGE_API_KEY");
    o.api_key = key ? key : "";
    if (o.api_key.empty() && !o.insecure_no_auth)
      throw usage_error{"RLFORGE_API_KEY is not set: set it to the key clients send (the SDK's "
                        "TINKER_API_KEY), or pass --insecure-no-auth to serve without "
                        "authentication"};
    if (!o.api_key.empty() && o.insecure_no_auth)
      throw usage_error{"--insecure-no-auth and RLFORGE_API_KEY contradict each other; unset one"};
  } catch (const usage_error& e) {
    std::cerr << "rlforge serve: " << e.message << " (see `rlforge serve --help`)\n";
    return 2;
  }

  auto stop_signals = runtime::block_stop_signals();
  try {
    auto store = service::future_store::open(c.db);
    if (store->failed_at_open() > 0)
      std::cerr << "rlforge serve: " << store->failed_at_open()
                << " request(s) pending at the last stop are now reported failed\n";
    auto built = make_backend(c);
    auto& backend = built.backend;
    service::http_server server(c.server, *backend, *store);
    int port = server.start();
    std::cerr << "rlforge serve: " << backend->base_model_name() << " on http://" << c.server.host
              << ":" << port << "/api/v1/ (db " << c.db << ", checkpoints "
              << c.server.checkpoint_dir << ")"
              << (c.server.insecure_no_auth ? " WITHOUT AUTHENTICATION" : "") << "\n";
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::cerr << "rlforge serve: signal " << sig << ", stopping\n";
    server.stop();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rlforge serve: " << e.what() << "\n";
    return 1;
  }
}

const command_registrar reg{
    "serve",
    {"Tinker-compatible training service over HTTP, with OpenAI-compatible /v1 endpoints "
     "(API key: env RLFORGE_API_KEY)",
     {required_flag("--base-model", "HF checkpoint directory every model is created on"),
      optional_flag("--host", "address to bind", "127.0.0.1"),
      optional_flag("--port", "TCP port (0 = an ephemeral one)", "8000"),
      optional_flag("--db", "SQLite file of sessions, models, futures and checkpoints",
                    "rlforge-serve.db"),
      optional_flag("--checkpoint-dir", "where checkpoints are written", "rlforge-checkpoints"),
      optional_flag("--workers", "scheduler worker threads (1..256)", "2"),
      optional_flag("--max-pending-samples", "sample requests queued before 429", "256"),
      optional_flag("--max-num-samples", "most samples one request may ask for", "4096"),
      optional_flag("--sample-slice", "samples of a request per engine call (fairness)", "32"),
      optional_flag("--stream-chunk-tokens",
                    "tokens a streamed OpenAI sample generates per turn (1..4096)", "8"),
      optional_flag("--max-sampler-snapshots", "sampler snapshots each model keeps", "8"),
      optional_flag("--max-body-mb", "largest request body, MiB", "64"),
      optional_flag("--long-poll-s", "how long retrieve_future holds a pending future (1..40)",
                    "25"),
      optional_flag("--gap-timeout-s", "wait for a missing seq_id before failing later ones",
                    "120"),
      optional_flag("--threads", "torch threads of each model's rank (1..256)", "1"),
      optional_flag("--dtype", "compute dtype of models and engines: fp32 or bf16", "fp32"),
      switch_flag("--batch-invariant", "batch-invariant numerics (bit-identical replays)"),
      optional_flag("--max-tokens-per-micro-batch", "padding-free micro-batch budget", "16384"),
      optional_flag("--max-restarts",
                    "lost ranks (a dead node, a failed actor) healed in place: re-placed, "
                    "rebuilt and the failed call retried (0..1000; 0 = calls fail)",
                    "0"),
      optional_flag("--recovery-timeout", "seconds one recovery waits for a node with room", "120"),
      optional_flag("--recovery-checkpoint-every",
                    "optimizer steps between a model's recovery checkpoints (in "
                    "--checkpoint-dir/recovery; a recovery replays the calls since)",
                    "10"),
      switch_flag("--insecure-no-auth", "serve without an API key (development only)"),
      optional_flag("--api-key", "refused: the key comes from RLFORGE_API_KEY, never argv")},
     "RLFORGE_API_KEY=tml-key rlforge serve --base-model /tmp/base --port 8000",
     {{"--log-level", "--log-format", "--cluster", "--tls", "--heartbeat-ms", "--dead-after-ms",
       "--head-grace-ms"},
      false},
     run_serve}};

} // namespace
} // namespace rlforge::cli
