#include "backends/engine/block_allocator.hpp"

#include <string>

#include "backends/error.hpp"

namespace rlforge::backends {

block_allocator::block_allocator(int64_t num_blocks) {
  if (num_blocks < 0)
    fail(error_code::invalid_argument,
         "block_allocator: num_blocks must be >= 0, got " + std::to_string(num_blocks));
  refs_.assign(static_cast<size_t>(num_blocks), 0);
  for (int64_t b = 0; b < num_blocks; ++b)
    free_.insert(free_.end(), static_cast<int32_t>(b));
}

void block_allocator::check(int32_t block, const char* op) const {
  if (block < 0 || block >= num_blocks())
    fail(error_code::internal, std::string{"block_allocator::"} + op + ": block " +
                                   std::to_string(block) + " outside the pool of " +
                                   std::to_string(num_blocks()));
}

std::optional<int32_t> block_allocator::allocate() {
  int32_t block = -1;
  if (!free_.empty()) {
    block = *free_.begin();
    free_.erase(free_.begin());
  } else if (!evictable_.empty()) {
    block = evictable_.front();
    evictable_.pop_front();
    evictable_pos_.erase(block);
    auto h = hash_of_.find(block);
    if (h != hash_of_.end()) {
      by_hash_.erase(h->second);
      hash_of_.erase(h);
    }
  } else {
    return std::nullopt;
  }
  refs_[static_cast<size_t>(block)] = 1;
  return block;
}

void block_allocator::share(int32_t block) {
  check(block, "share");
  auto& r = refs_[static_cast<size_t>(block)];
  if (r < 1)
    fail(error_code::internal,
         "block_allocator::share: block " + std::to_string(block) + " is not referenced");
  ++r;
}

void block_allocator::release(int32_t block) {
  check(block, "release");
  auto& r = refs_[static_cast<size_t>(block)];
  if (r < 1)
    fail(error_code::internal,
         "block_allocator::release: block " + std::to_string(block) + " is not referenced");
  if (--r > 0)
    return;
  if (hash_of_.count(block)) {
    evictable_.push_back(block);
    evictable_pos_[block] = std::prev(evictable_.end());
  } else {
    free_.insert(block);
  }
}

int32_t block_allocator::ref_count(int32_t block) const {
  check(block, "ref_count");
  return refs_[static_cast<size_t>(block)];
}

void block_allocator::publish(int32_t block, uint64_t hash) {
  check(block, "publish");
  if (refs_[static_cast<size_t>(block)] < 1)
    fail(error_code::internal,
         "block_allocator::publish: block " + std::to_string(block) + " is not referenced");
  if (by_hash_.count(hash) || hash_of_.count(block))
    return;
  by_hash_[hash] = block;
  hash_of_[block] = hash;
}

std::optional<int32_t> block_allocator::lookup(uint64_t hash) {
  ++queries_;
  auto i = by_hash_.find(hash);
  if (i == by_hash_.end())
    return std::nullopt;
  ++hits_;
  const int32_t block = i->second;
  auto& r = refs_[static_cast<size_t>(block)];
  if (r == 0) {
    auto pos = evictable_pos_.find(block);
    evictable_.erase(pos->second);
    evictable_pos_.erase(pos);
  }
  ++r;
  return block;
}

void block_allocator::clear_hashes() {
  for (int32_t block : evictable_)
    free_.insert(block);
  evictable_.clear();
  evictable_pos_.clear();
  by_hash_.clear();
  hash_of_.clear();
}

uint64_t block_hash(uint64_t parent, const int64_t* tokens, int64_t count) noexcept {
  // FNV-1a over the parent hash and the token ids, finished with a splitmix64 round so that
  // nearby inputs spread over all 64 bits.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= (x >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(parent);
  mix(static_cast<uint64_t>(count));
  for (int64_t i = 0; i < count; ++i)
    mix(static_cast<uint64_t>(tokens[i]));
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

} // namespace rlforge::backends
