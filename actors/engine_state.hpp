#pragma once

// An engine rank's state and the helpers its source files share. Internal: the engine's
// interface is actors/engine.hpp. The engine is one rank kind in two files:
//  - engine.cpp: results to calls and consumers, admission while paused, deadlines, the step
//    loop, the kind's registration;
//  - engine_ops.cpp: the ops (init_model, configure, generate, submit, cancel, sleep, wake_up,
//    memory, pause, resume, weight ops, stats).
//
// Ownership: `engine_state` belongs to its rank (rank_context::state; the ops get it by type).
// Thread-safety: everything here runs on the rank's thread (its ops and its step loop), one at a
// time.

#include <c10/core/GradMode.h>
#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_kind.hpp"
#include "actors/backend_seam.hpp"
#include "actors/batch_wire.hpp"
#include "actors/engine_requests.hpp"
#include "actors/engine_weights.hpp"
#include "actors/rank_device.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "backends/devices.hpp"
#include "backends/engine/continuous_engine.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/detokenizer.hpp"
#include "backends/model/model_config.hpp"
#include "backends/storage_bytes.hpp"
#include "backends/storage_copier.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors::engine_detail {

namespace be = rlforge::backends;
using be::error_code;
using clock_type = std::chrono::steady_clock;

inline const char* const tag_weights = "weights";
inline const char* const tag_kv_cache = "kv_cache";

/// Where the result of one request in flight goes.
struct origin {
  uint64_t call = 0;   ///< the deferred `generate` call it belongs to (0: a stream request)
  size_t index = 0;    ///< its index in that call
  caf::actor consumer; ///< stream: who receives the `generation_result`
  int64_t user_id = 0; ///< stream: the submitter's id
  int64_t timeout_ms = 0;
  clock_type::time_point deadline; ///< stream: stopped with a timeout error after this
  int64_t key = 0;                 ///< the weights it runs on (0: live)
};

/// A `generate` call waiting for its requests; answered when the last one finishes.
struct pending_call {
  std::vector<std::vector<sample_output>> rows; ///< per request
  std::vector<uint64_t> ids;                    ///< the engine ids of its requests
  size_t remaining = 0;
};

/// Work that arrived while paused; `resume` releases it in arrival order.
struct queued_work {
  uint64_t ticket = 0; ///< a deferred `generate` call, or 0 for a stream submission
  std::vector<sample_request> requests;
  caf::actor consumer;
  std::vector<int64_t> ids;
  int64_t timeout_ms = 0;
  clock_type::time_point deadline; ///< stream: its requests time out at this point
};

/// One engine rank: its model, the continuous-batching engine over it, weight versions, sleep
/// and pause state, and the requests in flight with where their results go.
struct engine_state final : kind_state {
  int32_t rank = 0;
  std::unique_ptr<be::causal_lm> model;
  be::engine_config config;
  std::unique_ptr<be::continuous_engine> engine; ///< refers to `model`; destroyed first
  engine_weights weights;
  engine_tokenizer tokenizer; ///< for stop strings: the model's, or why there is none
  std::set<std::string> asleep;
  /// While `weights` sleeps: each parameter's storage, moved out of the model.
  std::map<std::string, at::Tensor> host_weights;
  bool paused = false;
  std::deque<queued_work> queue;
  uint64_t next_id = 1;
  std::map<uint64_t, origin> origins;
  std::map<uint64_t, pending_call> calls; ///< by reply ticket
  std::map<std::pair<caf::actor, int64_t>, uint64_t> streams; ///< (consumer, id) → engine id
  int64_t last_key = -1;
  /// The Gloo channel to the trainer, kept between weight syncs (weight_sync.hpp).
  weight_channels channels;
  /// Wall seconds this rank spent in forward passes (`engine_step`) since it started: the
  /// engine's busy time; a caller measuring an interval takes the difference.
  double busy_seconds = 0;
  /// When the pending deadline timer fires (none pending: nullopt).
  std::optional<clock_type::time_point> timer_at;
};

// -- engine.cpp --------------------------------------------------------------------------------

be::causal_lm& model_of(engine_state& st, const char* op);

std::vector<std::string> parse_tags(const std::vector<std::string>& tags, const char* op);

void check_awake(const engine_state& st);

/// Whether requests pinned to `version` are queued or running.
bool version_in_use(const engine_state& st, int64_t version);

/// Sends a stream request's result (or failure) to its consumer.
void send_result(rank_context& ctx, engine_state& st, const caf::actor& consumer,
                 int64_t user_id, std::vector<sample_output> rows, const caf::error& err);

/// Stops request `id` in the engine and hands back what it generated.
void stop_request(rank_context& ctx, engine_state& st, uint64_t id,
                  const caf::error& err = caf::error{});

/// Answers every call and stream request in flight with `err` (the engine is being replaced).
void fail_everything(rank_context& ctx, engine_state& st, const caf::error& err);

/// Starts the requests of a `generate` call whose reply is deferred under `ticket`.
void start_call(engine_state& st, uint64_t ticket, std::vector<be::engine_request> requests);

/// Starts the requests of a stream submission.
void start_stream(engine_state& st, const caf::actor& consumer, const std::vector<int64_t>& ids,
                  std::vector<be::engine_request> requests, int64_t timeout_ms,
                  clock_type::time_point deadline);

/// Checks a stream submission's own arguments (not its requests).
void check_submission(const engine_state& st, const caf::actor& consumer,
                      const std::vector<int64_t>& ids, size_t count, int64_t timeout_ms);

/// Releases what arrived while paused, in arrival order; returns how many calls/submissions.
int64_t release_queue(rank_context& ctx, engine_state& st);

/// Hands back everything in flight or queued (`pause(abort)`): calls get their rows so far,
/// unfinished ones with stop_reason "abort"; stream requests go to their consumers the same
/// way. Returns how many requests were handed back.
int64_t abort_everything(rank_context& ctx, engine_state& st);

/// One forward pass for one weights key (round robin over the keys with work).
bool engine_step(rank_context& ctx);

// -- engine_ops.cpp ----------------------------------------------------------------------------

// Each takes the rank's context, the engine's state and the op's arguments by type; engine.cpp
// declares them as the kind's ops (`typed_op`), whose signatures name the arguments.
caf::expected<int64_t> init_model(rank_context& ctx, engine_state& st, const model_spec& spec);
caf::expected<no_values> configure(rank_context& ctx, engine_state& st, const engine_options& o);
/// Answers later, when the requests finish (`rank_context::deliver`).
caf::expected<answered_later<std::vector<sample_output>>>
generate(rank_context& ctx, engine_state& st, const std::vector<sample_request>& requests);
caf::expected<int64_t> submit(rank_context& ctx, engine_state& st, const caf::actor& consumer,
                const std::vector<int64_t>& ids, const std::vector<sample_request>& requests,
                const int64_t& timeout_ms);
caf::expected<int64_t> cancel(rank_context& ctx, engine_state& st, const caf::actor& consumer,
                const std::vector<int64_t>& ids);
caf::expected<no_values> sleep_op(rank_context& ctx, engine_state& st, const std::vector<std::string>& tags);
caf::expected<no_values> wake_up(rank_context& ctx, engine_state& st, const std::vector<std::string>& tags);
caf::expected<std::tuple<int64_t, int64_t>> memory(rank_context& ctx, engine_state& st);
caf::expected<int64_t> pause_op(rank_context& ctx, engine_state& st, const std::optional<std::string>& mode);
caf::expected<int64_t> resume(rank_context& ctx, engine_state& st);
caf::expected<int64_t> weight_version(rank_context& ctx, engine_state& st);
caf::expected<no_values> set_weights(rank_context& ctx, engine_state& st, const tensor_map& weights,
                     const int64_t& version);
caf::expected<int64_t> receive_weights(rank_context& ctx, engine_state& st, const weight_sync_spec& spec);
caf::expected<std::vector<int64_t>> retain_weights(rank_context& ctx, engine_state& st, const int64_t& version,
                        const int64_t& max_retained);
caf::expected<tensor_map> get_weights(rank_context& ctx, engine_state& st);
caf::expected<std::string> stats(rank_context& ctx, engine_state& st);

} // namespace rlforge::actors::engine_detail
