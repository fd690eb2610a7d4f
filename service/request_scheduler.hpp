#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tinker/error.hpp"
#include "tinker/types.hpp"

namespace rlforge::service {

/// Why a scheduled operation did not produce a result, and whose fault it is.
struct failure {
  tinker::error_category category = tinker::error_category::server;
  std::string message;
};

/// Runs the heavy operations of the Tinker service on a pool of worker threads.
///
/// Ordering contract (per model):
/// - Training operations of one model carry a `seq_id` and execute in strictly increasing
///   `seq_id` order, one at a time, whatever order they were submitted in. Gaps are buffered.
/// - Consecutive `forward_backward` requests (same `forward_only`) that are all ready when the
///   model becomes idle go to the batch function together, at most `max_batch` of them (the
///   backend computes each on its own, so batching changes no result). Every other ordered
///   operation (optim_step, load_weights, save_*) is a barrier: it runs alone, after everything
///   before it and before everything after it.
/// - Gap rule: when the next expected `seq_id` of a model has not arrived `gap_timeout` after
///   the oldest buffered later request arrived, every buffered request of that model fails
///   (category user) with a message naming the missing `seq_id`, and the model's expected
///   `seq_id` moves past the failed ones, so the model keeps serving later requests. A late
///   arrival of a skipped `seq_id` is rejected as stale.
/// - Unordered operations of a model (create, unload) run when no other operation of that model
///   runs, in submission order among themselves.
///
/// Sampling (fair, bounded):
/// - Sample requests queue per sampling lane: the engine they run on (the base model, a model's
///   snapshots, a persisted checkpoint), independent of the models' training queues, so sampling
///   a snapshot runs while its model trains.
/// - A lane runs one backend call at a time. Each call takes, from up to `max_batch` queued
///   requests in round-robin order, one slice of at most `sample_slice` samples each (samples
///   [first_sample, first_sample + n) of the request): a request for 20,000 samples advances one
///   slice per call, and a small request that arrives meanwhile joins the next call instead of
///   waiting for the large one. A request completes when all its slices have; sample j's result
///   depends only on (seed, j) (see `tinker::sample_request`), so slicing changes no sample.
/// - Streamed requests (`try_submit_stream`, the OpenAI endpoints' `stream: true`) queue on the
///   same lanes. Each call advances each of a streamed request's unfinished samples (at most
///   `sample_slice` of them) by one chunk of `chunk_tokens` tokens, a continuation of what it
///   generated before (`tinker::sample_request::generated`), and hands the new tokens to the
///   sink at once; the request then goes to the back of its lane. So a stream takes turns with
///   the lane's other requests instead of holding the engine for its whole generation, and a
///   cancelled stream stops generating within one chunk.
/// - At most `max_pending_samples` requests wait or run at once: beyond that `try_submit_sample`
///   and `try_submit_stream` refuse (the server answers 429).
/// - Workers alternate between training and sampling work when both are ready.
///
/// Completion callbacks run on a worker thread, exactly once per accepted submission, and must
/// not call back into the scheduler. All public functions are thread-safe.
class request_scheduler {
public:
  struct options {
    size_t workers = 2;                            ///< worker threads (>= 1)
    std::chrono::milliseconds gap_timeout{120000}; ///< wait for a missing seq_id (> 0)
    size_t max_batch = 64;                         ///< requests per backend call (>= 1)
    size_t max_pending_samples = 256;              ///< queued sample requests (>= 1)
    int64_t sample_slice = 32;                     ///< samples of a request per call (>= 1)
  };

  /// One output per request, in order (see `actors::tinker_backend::forward_backward`).
  using forward_backward_fn = std::function<std::vector<tinker::forward_backward_output>(
      const std::vector<tinker::forward_backward_request>&)>;
  /// One response per request, in order (see `actors::tinker_backend::sample`); the requests of
  /// one call share a lane.
  using sample_fn = std::function<std::vector<tinker::sample_response>(
      const std::vector<tinker::sample_request>&)>;

  template <class T> struct completion {
    std::function<void(T)> done;
    std::function<void(const failure&)> failed;
  };

  /// Starts the worker threads. Throws `std::invalid_argument` naming a bad option.
  request_scheduler(options opts, forward_backward_fn fb, sample_fn sample);

  /// Fails everything still queued (category server, "server shutting down"), waits for running
  /// operations to finish and joins the workers.
  ~request_scheduler();

  request_scheduler(const request_scheduler&) = delete;
  request_scheduler& operator=(const request_scheduler&) = delete;

  /// Declares the first `seq_id` expected for `model_id` (1 for a new model, the last executed
  /// + 1 after a restart). Ignored when the model already has state.
  void open_model(const std::string& model_id, int64_t next_seq_id);

  /// Queues a `forward_backward` (or `forward` when `r.forward_only`) in `r.seq_id` order.
  /// Throws `tinker::request_error` (user) when that `seq_id` is already queued or was already
  /// passed; nothing is queued then.
  void submit_forward_backward(tinker::forward_backward_request r,
                               completion<tinker::forward_backward_output> c);

  /// Queues a barrier operation of `model_id` at `seq_id`; `run` executes it (it may throw
  /// `tinker::request_error`; other exceptions are reported as category server), `c.done`
  /// receives its result. Same rejection rules as `submit_forward_backward`.
  void submit_ordered(const std::string& model_id, int64_t seq_id, std::function<std::string()> run,
                      completion<std::string> c);

  /// Consumes `seq_id` of `model_id` without running anything: for a request refused at
  /// submission (bad input) whose seq_id the client has nevertheless used up, so later requests
  /// do not wait for it. Ignored when that seq_id is already queued or passed, or the model has
  /// no state here.
  void skip(const std::string& model_id, int64_t seq_id);

  /// Queues an operation of `model_id` without a seq_id (create, unload); see the class comment.
  void submit_unordered(const std::string& model_id, std::function<std::string()> run,
                        completion<std::string> c);

  /// Queues a sample request on the lane of `r.sampler`. Returns false, queueing nothing, when
  /// `max_pending_samples` requests already wait.
  bool try_submit_sample(tinker::sample_request r, completion<tinker::sample_response> c);

  /// Where a streamed request's tokens go. `tokens` and `failed` run on a worker thread, one
  /// call at a time per request, in generation order, and must not call back into the scheduler.
  struct stream_sink {
    /// Sample `index` (0-based in the request) generated `delta.tokens` (with their log-probs)
    /// since the last call for it; `finished` on its last call, `delta.stop_reason` then says why
    /// ("stop" or "length"; empty before).
    std::function<void(int64_t index, tinker::sampled_sequence delta, bool finished)> tokens;
    /// The request failed; no call follows.
    std::function<void(const failure&)> failed;
    /// Read before and after each chunk: once true, the request generates nothing more and the
    /// sink gets no further call (a client that went away).
    std::shared_ptr<std::atomic<bool>> cancelled;
    /// Optional pacing, read (under the scheduler's lock: it must be quick and must not call
    /// back) before each chunk: false holds the stream's next chunk, e.g. until its client has
    /// taken the last one, so a stream runs at most one chunk ahead of its reader. Call `wake()`
    /// when it turns true.
    std::function<bool()> ready;
  };

  /// Queues `r` (prompt log-probs off, `generated` empty) to be generated in chunks of
  /// `chunk_tokens` (>= 1) tokens per sample and streamed to `sink`; sample j's tokens equal those
  /// of sample j of the same request run whole (a seeded sample draws from the same stream).
  /// Returns false, queueing nothing, when `max_pending_samples` requests already wait. Throws
  /// `std::invalid_argument` for a request the streaming form cannot take.
  bool try_submit_stream(tinker::sample_request r, int64_t chunk_tokens, stream_sink sink);

  /// Looks for work again: a held stream's `ready` turned true.
  void wake();

  /// Fails every queued training operation of `model_id` (category not_found, naming the model)
  /// and forgets its seq_id state. An operation running now finishes normally; an operation of
  /// the model itself may call this (unload does).
  void close_model(const std::string& model_id);

  /// The seq_id `model_id` expects next, or -1 when the model has no state here.
  int64_t next_seq_id(const std::string& model_id) const;

  /// Number of sample requests waiting or running.
  size_t pending_samples() const;

  /// Queue depth per lane: sample requests waiting or being served on each sampling lane
  /// (`sampler_ref::engine`), and training operations waiting in each model's queue (the running one
  /// excluded). Lanes and models with nothing queued are absent.
  struct queue_depths {
    std::map<std::string, size_t> sampling;
    std::map<std::string, size_t> training;
  };
  queue_depths depths() const;

private:
  struct ordered_op {
    bool is_fb = false;
    tinker::forward_backward_request fb;
    completion<tinker::forward_backward_output> fb_done;
    std::function<std::string()> run;
    completion<std::string> done;
    std::chrono::steady_clock::time_point arrived;
  };
  struct unordered_op {
    std::function<std::string()> run;
    completion<std::string> done;
  };
  /// A sample request being served slice by slice (or, streamed, chunk by chunk).
  struct sample_op {
    tinker::sample_request request;
    completion<tinker::sample_response> done; ///< streamed: only `failed` (the sink's)
    int64_t next_sample = 0; ///< first sample not yet handed to a call (streamed: the next to
                             ///< advance, round robin)
    int64_t finished = 0;    ///< samples whose slice completed (streamed: that finished)
    bool over = false;       ///< completed, failed or cancelled: nothing more runs
    tinker::sample_response result;
    // Streamed requests only.
    bool streamed = false;
    int64_t chunk_tokens = 0;
    stream_sink sink;
    std::vector<std::vector<int64_t>> generated; ///< per sample, the tokens so far
    std::vector<bool> sample_done;               ///< per sample
  };
  struct model_state {
    int64_t next_seq = 1;
    bool busy = false;
    bool closed = false; ///< closed while busy: erased when the running job ends
    std::map<int64_t, ordered_op> ordered;
    std::deque<unordered_op> unordered;
  };
  struct sample_lane {
    bool busy = false;
    std::deque<std::shared_ptr<sample_op>> ops; ///< round-robin order
  };
  /// One slice of a sample op in a job (streamed: one chunk of one of its samples).
  struct slice {
    std::shared_ptr<sample_op> op;
    tinker::sample_request request;
    int64_t stream_index = -1; ///< streamed: which sample
    int64_t allowance = 0;     ///< streamed: tokens this chunk may add
  };
  /// A unit of work taken by a worker under the lock and run outside it.
  struct job {
    std::string model_id; ///< training work
    std::string lane;     ///< sampling work
    std::vector<ordered_op> ordered;
    std::vector<unordered_op> unordered;
    std::vector<slice> slices;
    bool empty() const { return ordered.empty() && unordered.empty() && slices.empty(); }
  };

  void enqueue_ordered(const std::string& model_id, int64_t seq_id, ordered_op op);
  bool take_job(job& out);
  bool take_training_job(job& out);
  bool take_sample_job(job& out);
  void take_stream_chunks(const std::shared_ptr<sample_op>& op, job& out);
  /// Queues `op` on its lane unless `max_pending_samples` wait (false) or the scheduler stops.
  bool enqueue_sample(std::shared_ptr<sample_op> op);
  /// Records the chunk of slice `s` (`part` its response); queues the sink's calls.
  void finish_stream_chunk(const slice& s, tinker::sample_response& part,
                           std::vector<std::function<void()>>& callbacks);
  /// Marks `op` over and releases its place in the sample bound (mutex_ held).
  void retire(sample_op& op);
  void run_job(job& j);
  void run_samples(job& j);
  void expire_gaps(std::chrono::steady_clock::time_point now);
  void worker_loop();
  void monitor_loop();

  options opts_;
  forward_backward_fn fb_;
  sample_fn sample_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable monitor_cv_;
  std::map<std::string, model_state> models_;
  std::map<std::string, sample_lane> lanes_;
  std::string last_model_;
  std::string last_lane_;
  bool prefer_samples_ = false;
  size_t pending_samples_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  std::thread monitor_;
};

} // namespace rlforge::service
