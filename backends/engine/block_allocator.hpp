#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

namespace rlforge::backends {

/// Bookkeeping of a paged key/value cache's fixed-size blocks (no tensors): reference counts,
/// the free blocks, and an optional prefix cache of full blocks by content hash.
///
/// A block is either free, referenced (count >= 1: by one sequence, or shared by several, e.g.
/// the prompt blocks of the n samples of one request), or cached: unreferenced but still holding
/// the keys/values of a full block whose content `hash` names, so a later request with the same
/// prefix can take it back (`lookup`). Cached blocks count as available: `allocate` evicts the
/// least recently released one when no free block is left.
///
/// Free blocks are handed out lowest id first, so the blocks of one fresh prompt tend to be
/// consecutive (the attention kernels multiply runs of consecutive blocks in one product).
///
/// Thread-safety: none; one owner (the engine's scheduler). Throws `backends::error` on misuse
/// (an id outside the pool, releasing an unreferenced block): these are bugs of the caller.
class block_allocator {
public:
  /// A pool of `num_blocks` free blocks (>= 0).
  explicit block_allocator(int64_t num_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(refs_.size()); }

  /// Blocks that `allocate` can hand out now: free plus cached.
  int64_t num_available() const {
    return static_cast<int64_t>(free_.size() + evictable_.size());
  }

  /// Unreferenced blocks that still hold a cached prefix.
  int64_t num_cached() const { return static_cast<int64_t>(evictable_.size()); }

  /// A block with reference count 1, or nullopt when none is available. Evicts the least
  /// recently released cached block (forgetting its hash) when no free block is left.
  std::optional<int32_t> allocate();

  /// Adds a reference (the block becomes shared).
  void share(int32_t block);

  /// Drops a reference; at zero the block becomes cached when it has a hash, free otherwise.
  void release(int32_t block);

  int32_t ref_count(int32_t block) const;

  /// Records that `block` (referenced) holds the full block whose content `hash` names, so it
  /// can be found by `lookup`. A hash already owned by another block is left with that block.
  void publish(int32_t block, uint64_t hash);

  /// The block holding `hash`, with one more reference (taken back from the cached list when it
  /// was unreferenced), or nullopt. Counts a query, and a hit when found.
  std::optional<int32_t> lookup(uint64_t hash);

  /// Forgets every hash (cached blocks become free); referenced blocks keep their references.
  void clear_hashes();

  /// Prefix-cache lookups and hits since construction (`lookup` calls).
  int64_t queries() const { return queries_; }
  int64_t hits() const { return hits_; }

private:
  void check(int32_t block, const char* op) const;

  std::vector<int32_t> refs_;
  std::set<int32_t> free_;
  /// Cached (unreferenced, hashed) blocks, least recently released first.
  std::list<int32_t> evictable_;
  std::unordered_map<int32_t, std::list<int32_t>::iterator> evictable_pos_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::unordered_map<int32_t, uint64_t> hash_of_;
  int64_t queries_ = 0;
  int64_t hits_ = 0;
};

/// The content hash of a full block of `tokens` that follows the block hashed `parent` (the
/// first block of a prompt takes a root hash, e.g. one naming the weights version): a chain, so
/// equal hashes mean equal prefixes up to and including this block (barring 64-bit collisions).
uint64_t block_hash(uint64_t parent, const int64_t* tokens, int64_t count) noexcept;

} // namespace rlforge::backends
