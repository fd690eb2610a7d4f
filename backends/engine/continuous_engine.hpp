#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "backends/engine/paged_kv_cache.hpp"
#include "backends/engine/scheduler.hpp"
#include "backends/model/sampling_params.hpp"
#include "backends/model/token_sampler.hpp"

namespace rlforge::backends {

class causal_lm;

/// Settings of a continuous-batching engine.
struct engine_config {
  /// Memory budget of the paged key/value cache (vLLM's gpu_memory_utilization, in bytes): the
  /// pool holds floor(kv_cache_bytes / block bytes) blocks, allocated up front.
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int64_t block_size = 16;        ///< positions per block
  int64_t max_num_seqs = 256;     ///< sequences decoded together (a bigger group runs alone)
  int64_t max_step_tokens = 2048; ///< tokens per forward pass: decode first, then prefill chunks
  bool prefix_caching = true;     ///< reuse full prompt blocks across requests
};

/// Throws `backends::error(invalid_argument)` naming the field when `c` is unusable for a model
/// of `config` (sizes < 1, a budget below one block, max_step_tokens < max_num_seqs).
void validate(const engine_config& c, const model_config& config);

/// One request: a prompt and its samples (one seed each; nullopt = unseeded).
struct engine_request {
  std::vector<int64_t> prompt;
  sampling_params params;                       ///< `seed` is ignored: see `seeds`
  std::vector<std::optional<uint64_t>> seeds;   ///< one per sample (num_samples = size)
  /// Tokens each sample already generated (a continuation of a stopped run): empty, or one list
  /// per sample. They are re-fed, count towards max_tokens, and a seeded sample skips the draws
  /// they took, so the continuation samples what the uninterrupted run would have.
  std::vector<std::vector<int64_t>> generated;
  /// The weights the request runs on; the caller steps each key with its weights in the model.
  int64_t key = 0;
};

/// One sample's output. `tokens` and `logprobs` hold what this engine generated (not the
/// `generated` tokens a continuation came with); `versions[i]` is the weights version passed to
/// the `step` that produced `tokens[i]`.
struct engine_sample {
  std::vector<int64_t> tokens;
  std::vector<double> logprobs;
  std::vector<int64_t> versions;
  std::string stop_reason; ///< "stop", "length", or "abort" (stopped by `abort`)
};

/// A finished (or aborted) request.
struct engine_output {
  uint64_t id = 0;
  std::vector<engine_sample> samples;
  std::vector<double> prompt_logprobs; ///< n-1 entries when asked for (empty when aborted early)
  /// (n-1) x k when topk_prompt_logprobs = k was asked for (sample_result says how; empty when
  /// aborted early).
  std::vector<int64_t> topk_prompt_ids;
  std::vector<double> topk_prompt_logprobs;
  bool aborted = false;
};

/// Counters and gauges of an engine.
struct engine_stats {
  scheduler_counters counters;
  int64_t num_blocks = 0;
  int64_t free_blocks = 0;   ///< available to allocate (free + cached)
  int64_t cached_blocks = 0; ///< unreferenced blocks holding a cached prefix
  int64_t block_size = 0;
  int64_t running = 0;       ///< requests admitted
  int64_t waiting = 0;       ///< requests queued
  int64_t generated_tokens = 0;
  /// Tokens sampled so far by the requests still queued or running (continuations included):
  /// the partial rows in flight.
  int64_t in_flight_tokens = 0;
  /// Prefix-cache hit rate over prompt positions looked up (0 when none was).
  double prefix_hit_rate() const {
    return counters.prefix_query_tokens == 0
               ? 0.0
               : static_cast<double>(counters.prefix_hit_tokens) /
                     static_cast<double>(counters.prefix_query_tokens);
  }
};

/// Continuous batching over a paged key/value cache (vLLM's design on the CPU): requests join
/// the running batch at any step and leave when they finish; the n samples of a request prefill
/// their prompt once and share its blocks (copy-on-write of the last, partial one); full prompt
/// blocks stay cached for later requests with the same prefix (`prefix_caching`); when the cache
/// is full the youngest requests are preempted and recomputed later, never failed.
///
/// Semantics equal `backends::generate` run on each sample alone: same tokens for the same
/// seeds (one uniform draw per sampled token, so batch-mates do not matter), log-probs equal to
/// float rounding, stop tokens kept as the last token, stop strings matched on each sample's
/// decoded text (backends/model/stop_strings.hpp; the completing token is the last one, and the
/// sample frees its blocks at once), `max_tokens` capped by the context, prompt log-probs under
/// the raw distribution.
///
/// The engine does not own the model: the caller keeps it alive, may swap its weights between
/// steps (each `step` names the `key` whose weights are in the model and the version to tag
/// tokens with), and must not use it concurrently. One forward pass never mixes keys.
/// Thread-safety: none; one owner thread.
class continuous_engine {
public:
  /// Allocates the cache for `model`'s shape. Throws as `validate`.
  continuous_engine(causal_lm& model, engine_config config);
  ~continuous_engine();
  continuous_engine(const continuous_engine&) = delete;
  continuous_engine& operator=(const continuous_engine&) = delete;

  const engine_config& config() const { return config_; }

  /// Throws `backends::error` naming the bad value when `request` cannot be added:
  /// `invalid_argument` for an empty prompt or no samples, a prompt that fills the context,
  /// invalid params (`validate`), continuation tokens that reach max_tokens, hold a stop token
  /// or complete a stop string, a request whose worst case exceeds the cache; `out_of_range` for
  /// a token id outside the vocabulary.
  void check(const engine_request& request) const;

  /// Queues a request under `id` (unique among queued and running ones). Throws as `check`,
  /// and for a duplicate id; nothing is queued then.
  void add(uint64_t id, engine_request request);

  /// Whether any request is queued or running.
  bool has_work() const { return !scheduler_->empty(); }

  /// Keys with queued or running requests, ascending.
  std::vector<int64_t> keys() const { return scheduler_->keys(); }

  /// One forward pass for the requests of `key` (whose weights the model holds now): admits
  /// what fits, prefills or decodes one position per sequence, samples, and returns the
  /// requests that finished in this step, oldest first. Tokens produced are tagged `version`.
  /// Throws when the cache is released (`release_cache`).
  std::vector<engine_output> step(int64_t key, int64_t version);

  /// Stops request `id` (queued or running) and returns what it generated so far, unfinished
  /// samples with stop_reason "abort"; nullopt for an unknown id.
  std::optional<engine_output> abort(uint64_t id);

  /// Stops every request (oldest first), as `abort`.
  std::vector<engine_output> abort_all();

  /// Frees the cache memory; running requests are preempted (they recompute once restored).
  void release_cache();
  /// Allocates the cache again after `release_cache`.
  void restore_cache();
  bool cache_allocated() const { return cache_.allocated(); }
  /// Bytes of cache memory held now.
  int64_t cache_bytes() const { return cache_.bytes(); }

  /// The weights of `key` changed: cached prefixes computed with the old ones are dropped.
  /// Running requests keep their keys/values and continue on the new weights.
  void weights_changed();

  engine_stats stats() const;

  /// The ids of queued and running requests, oldest first.
  std::vector<uint64_t> ids() const;

private:
  struct request_state;
  engine_output take_output(request_state& r, uint64_t id, bool aborted);
  /// The flattened forward pass of `plan`'s items: final hidden states, one row per token.
  at::Tensor forward(const step_plan& plan);
  void add_prompt_logprobs(const step_plan& plan, const at::Tensor& hidden);

  causal_lm& model_;
  engine_config config_;
  paged_kv_cache cache_;
  std::unique_ptr<scheduler> scheduler_;
  std::map<uint64_t, std::unique_ptr<request_state>> requests_;
  int64_t generated_tokens_ = 0;
};

} // namespace rlforge::backends
