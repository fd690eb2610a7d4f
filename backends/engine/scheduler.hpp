#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "backends/engine/block_allocator.hpp"

namespace rlforge::backends {

/// Limits of one engine's scheduler.
struct scheduler_limits {
  int64_t num_blocks = 0;        ///< blocks in the key/value pool
  int64_t block_size = 16;       ///< token positions per block
  int64_t max_num_seqs = 256;    ///< sequences admitted at once (a larger group runs alone)
  int64_t max_step_tokens = 2048; ///< tokens fed to one forward pass (decode first)
  bool prefix_caching = true;    ///< keep full prompt blocks for later requests
};

/// One sample of a request: its generated tokens and where its keys/values live.
struct scheduled_sequence {
  std::vector<int64_t> generated; ///< sampled tokens so far (the engine appends)
  std::vector<int32_t> blocks;    ///< block table: position p lives in blocks[p / block_size]
  int64_t cached = 0;             ///< positions [0, cached) have their keys/values in the cache
  bool finished = false;
};

/// One request: a prompt and its n samples, which share the prompt's blocks.
///
/// Life cycle: waiting → prompt phase (the prompt is prefilled once, in chunks, into the group's
/// own blocks) → fork (each unfinished sample references the prompt blocks; the last, partial
/// prompt block is copied on a sample's first write to it) → decode (one token per step per
/// sample) → finished when every sample is. Preemption (recompute) frees every block and puts
/// the group back in the waiting queue by its arrival order; on readmission the prompt is
/// prefilled again and each sample re-feeds its generated tokens before decoding on.
struct scheduled_group {
  uint64_t id = 0;
  int64_t key = 0;                ///< weights the group runs on (the engine's choice)
  uint64_t arrival = 0;           ///< priority: lower = older = preempted last
  std::vector<int64_t> prompt;
  std::vector<scheduled_sequence> seqs;
  int64_t max_new_tokens = 0;     ///< most tokens a sample may generate (worst-case sizing)
  /// Whether admission may reuse cached prompt blocks (the engine turns it off while it still
  /// needs the hidden states of every prompt position, for prompt log-probs).
  bool allow_prefix_hits = true;

  bool running = false;           ///< admitted (prompt phase or decode)
  bool prompt_phase = true;       ///< the prompt is (being) prefilled
  std::vector<int32_t> prompt_blocks;
  int64_t prompt_cached = 0;
  std::vector<uint64_t> prompt_hashes; ///< content hash of each full prompt block
  bool publish = false;           ///< publish full prompt blocks to the prefix cache
  int64_t published = 0;          ///< leading prompt blocks already published (or cached)
  int64_t prefill_count = 0;      ///< times the prompt phase completed (1 unless preempted)

  int64_t length(size_t seq) const {
    return static_cast<int64_t>(prompt.size() + seqs[seq].generated.size());
  }
  int64_t token(size_t seq, int64_t position) const {
    const auto p = static_cast<int64_t>(prompt.size());
    return position < p ? prompt[static_cast<size_t>(position)]
                        : seqs[seq].generated[static_cast<size_t>(position - p)];
  }
  bool all_finished() const {
    for (auto& s : seqs)
      if (!s.finished)
        return false;
    return true;
  }
};

/// What one step feeds for one sequence (or for a group's prompt, `seq` = -1).
struct step_item {
  scheduled_group* group = nullptr;
  int32_t seq = -1;   ///< sample index, -1 = the group's prompt phase
  int64_t first = 0;  ///< first position fed (everything before is cached)
  int64_t count = 0;  ///< positions fed: [first, first + count)
  /// The logits of the last fed position give the next token: of this sequence, or (prompt
  /// phase) of every unfinished sample that has none yet.
  bool samples = false;

  const std::vector<int32_t>& blocks() const {
    return seq < 0 ? group->prompt_blocks : group->seqs[static_cast<size_t>(seq)].blocks;
  }
};

/// One step's work: the items (all of one weights `key`), block copies to run before the forward
/// pass (copy-on-write of shared partial blocks, `(source, destination)`), and the groups
/// preempted while planning (their blocks are already freed).
struct step_plan {
  int64_t key = 0;
  std::vector<step_item> items;
  std::vector<std::pair<int32_t, int32_t>> copies;
  std::vector<uint64_t> preempted;
  int64_t tokens = 0;
};

/// Counters since construction.
struct scheduler_counters {
  int64_t prompt_tokens = 0;   ///< prompt positions prefilled (each shared prompt counts once)
  int64_t recompute_tokens = 0; ///< generated positions re-fed after a preemption
  int64_t decode_tokens = 0;   ///< positions fed one per step
  int64_t prefix_query_tokens = 0; ///< prompt positions looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;   ///< of which found cached
  int64_t preemptions = 0;
  int64_t copies = 0;          ///< copy-on-write block copies
  int64_t steps = 0;
};

/// The continuous-batching scheduler of one engine: admission, chunked prefill, block tables,
/// copy-on-write, prefix caching and preemption by recompute, on a `block_allocator` (no
/// tensors, no model).
///
/// Policy (vLLM's, simplified): requests are served by arrival; each `schedule` feeds first one
/// position of every decoding sequence, then prefill chunks (prompts, re-fed tokens) oldest
/// first, then admits waiting groups while the token budget, the sequence limit and the free
/// blocks allow (admission takes every prompt block at once plus one block per sample of
/// headroom). When a sequence needs a block and none is available, the most recently arrived
/// running group is preempted (recompute: its blocks are freed and it waits again, ahead of
/// later arrivals); a group is never preempted for a younger one. `add` refuses a group whose
/// worst case (prompt + every sample at its token limit) exceeds the whole pool, so the oldest
/// group can always finish alone and the scheduler never deadlocks.
///
/// Ownership: the scheduler owns its groups; pointers in a plan stay valid until the next call
/// that changes groups (`finish`, `remove`, `schedule`, `preempt_all`). Thread-safety: none.
class scheduler {
public:
  explicit scheduler(scheduler_limits limits);

  const scheduler_limits& limits() const { return limits_; }

  /// Blocks a group needs in the worst case (prompt shared, every sample at its limit).
  int64_t worst_case_blocks(int64_t prompt_length, int64_t num_samples,
                            int64_t max_new_tokens) const;

  /// Throws `backends::error(invalid_argument)` naming the sizes when a group of this shape can
  /// never fit in the pool (its worst case exceeds it).
  void check_fits(int64_t prompt_length, int64_t num_samples, int64_t max_new_tokens) const;

  /// Queues a group (`samples` sequences, possibly with generated tokens already, e.g. a
  /// continuation). Throws `backends::error(invalid_argument)` naming the sizes when its worst
  /// case exceeds the pool, and for a duplicate id.
  scheduled_group& add(uint64_t id, int64_t key, std::vector<int64_t> prompt,
                       std::vector<std::vector<int64_t>> generated, int64_t max_new_tokens);

  /// Plans one step for the groups of `key`; `root_hash` seeds the prefix-cache hashes of
  /// groups admitted now (it should name the weights version they are computed with).
  step_plan schedule(int64_t key, uint64_t root_hash);

  /// After the forward pass of `plan`: advances the cached positions, forks groups whose prompt
  /// phase completed and publishes their full prompt blocks.
  void complete(const step_plan& plan);

  /// Appends a token to sample `seq` of `group` (its next position to feed).
  void append(scheduled_group& group, size_t seq, int64_t token);

  /// Marks a sample finished and frees its blocks.
  void finish(scheduled_group& group, size_t seq);

  /// Removes a group (finished, or aborted: its blocks are freed). Unknown ids are ignored.
  void remove(uint64_t id);

  /// Preempts every running group (e.g. the cache memory is released); returns their ids.
  std::vector<uint64_t> preempt_all();

  /// Preempts group `id` if it runs (e.g. its step failed half-way, so its blocks may hold
  /// positions that were never written). Unknown or waiting ids are ignored.
  void preempt_group(uint64_t id);

  /// Forgets every cached prefix and stops in-flight prompts from publishing theirs (the
  /// weights changed, so cached keys/values no longer match new requests).
  void invalidate_prefix_cache();

  scheduled_group* find(uint64_t id);

  /// Keys that have waiting or running groups, ascending.
  std::vector<int64_t> keys() const;

  bool empty() const { return groups_.empty(); }
  size_t num_groups() const { return groups_.size(); }
  size_t num_running() const;
  int64_t num_running_seqs() const;

  const block_allocator& blocks() const { return allocator_; }
  const scheduler_counters& counters() const { return counters_; }

private:
  bool ensure_slots(scheduled_group& g, size_t seq, int64_t count, step_plan& plan);
  void preempt(scheduled_group& g, step_plan& plan);
  scheduled_group* youngest_running_other_than(const scheduled_group& g);
  bool try_admit(scheduled_group& g, uint64_t root_hash);
  void release_all(scheduled_group& g);

  scheduler_limits limits_;
  block_allocator allocator_;
  std::map<uint64_t, std::unique_ptr<scheduled_group>> groups_;
  std::map<uint64_t, scheduled_group*> by_arrival_; ///< every group, oldest first
  uint64_t next_arrival_ = 0;
  scheduler_counters counters_;
};

} // namespace rlforge::backends
