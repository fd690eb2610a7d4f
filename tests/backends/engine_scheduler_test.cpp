// The paged cache's bookkeeping without tensors: block allocation, sharing and the prefix
// cache (block_allocator), and the continuous-batching scheduler: admission, chunked prefill,
// fork and copy-on-write, decode priority, preemption by recompute, prefix-cache hits and the
// refusal of requests that can never fit.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "backends/engine/block_allocator.hpp"
#include "backends/engine/scheduler.hpp"
#include "backends/error.hpp"

using namespace rlforge::backends;

namespace {

std::vector<int64_t> iota_tokens(int64_t n, int64_t from = 1) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

scheduler_limits limits(int64_t blocks, int64_t block_size = 4, int64_t max_seqs = 8,
                        int64_t step_tokens = 64, bool prefix = false) {
  scheduler_limits l;
  l.num_blocks = blocks;
  l.block_size = block_size;
  l.max_num_seqs = max_seqs;
  l.max_step_tokens = step_tokens;
  l.prefix_caching = prefix;
  return l;
}

/// Plays the engine: completes each step, samples token 7 for every sampling item, finishes
/// samples at `max_new` tokens; returns the number of steps until `s` is empty.
int run_to_end(scheduler& s, int64_t max_new, int max_steps = 10000) {
  int steps = 0;
  while (!s.empty() && steps < max_steps) {
    ++steps;
    auto plan = s.schedule(0, 1);
    std::vector<std::pair<scheduled_group*, size_t>> draws;
    for (auto& it : plan.items) {
      if (!it.samples)
        continue;
      if (it.seq >= 0)
        draws.emplace_back(it.group, static_cast<size_t>(it.seq));
      else
        for (size_t k = 0; k < it.group->seqs.size(); ++k)
          if (!it.group->seqs[k].finished && it.group->seqs[k].generated.empty())
            draws.emplace_back(it.group, k);
    }
    s.complete(plan);
    std::vector<uint64_t> done;
    for (auto& [g, k] : draws) {
      s.append(*g, k, 7);
      if (static_cast<int64_t>(g->seqs[k].generated.size()) >= max_new) {
        s.finish(*g, k);
        if (g->all_finished())
          done.push_back(g->id);
      }
    }
    for (auto id : done)
      s.remove(id);
  }
  return steps;
}

} // namespace

TEST(BlockAllocator, HandsOutLowestFirstAndCountsReferences) {
  block_allocator a(4);
  EXPECT_EQ(a.num_available(), 4);
  EXPECT_EQ(*a.allocate(), 0);
  EXPECT_EQ(*a.allocate(), 1);
  a.share(1);
  EXPECT_EQ(a.ref_count(1), 2);
  a.release(1);
  EXPECT_EQ(a.ref_count(1), 1);
  a.release(0);
  EXPECT_EQ(*a.allocate(), 0); // freed blocks come back, lowest first
  EXPECT_EQ(*a.allocate(), 2);
  EXPECT_EQ(*a.allocate(), 3);
  EXPECT_FALSE(a.allocate());
  EXPECT_THROW(a.release(9), error);
  a.release(3);
  EXPECT_THROW(a.release(3), error); // not referenced any more
}

TEST(BlockAllocator, CachedBlocksAreFoundAgainAndEvictedLeastRecentlyReleasedFirst) {
  block_allocator a(3);
  auto b0 = *a.allocate(), b1 = *a.allocate();
  a.publish(b0, 100);
  a.publish(b1, 101);
  a.release(b0);
  a.release(b1);
  EXPECT_EQ(a.num_cached(), 2);
  EXPECT_EQ(a.num_available(), 3);
  // Found again with a reference.
  EXPECT_EQ(a.lookup(101), b1);
  EXPECT_EQ(a.ref_count(b1), 1);
  EXPECT_FALSE(a.lookup(555));
  EXPECT_EQ(a.queries(), 2);
  EXPECT_EQ(a.hits(), 1);
  a.release(b1); // now b0 was released before b1
  // The free block goes first, then the least recently released cached one (b0).
  EXPECT_EQ(*a.allocate(), 2);
  EXPECT_EQ(*a.allocate(), b0);
  EXPECT_FALSE(a.lookup(100)); // evicted: its hash is gone
  EXPECT_EQ(a.lookup(101), b1);
  a.release(b1);
  a.clear_hashes();
  EXPECT_EQ(a.num_cached(), 0);
  EXPECT_FALSE(a.lookup(101));
}

TEST(BlockHash, ChainsOverContentAndParent) {
  std::vector<int64_t> a{1, 2, 3, 4}, b{1, 2, 3, 5};
  EXPECT_EQ(block_hash(9, a.data(), 4), block_hash(9, a.data(), 4));
  EXPECT_NE(block_hash(9, a.data(), 4), block_hash(9, b.data(), 4));
  EXPECT_NE(block_hash(9, a.data(), 4), block_hash(10, a.data(), 4));
}

TEST(Scheduler, PrefillsThePromptOnceThenForksTheSamples) {
  scheduler s(limits(32));
  auto& g = s.add(1, 0, iota_tokens(10), {{}, {}, {}}, 5);
  auto plan = s.schedule(0, 1);
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].seq, -1); // the prompt, once for three samples
  EXPECT_EQ(plan.items[0].count, 10);
  EXPECT_TRUE(plan.items[0].samples);
  EXPECT_EQ(g.prompt_blocks.size(), 3u); // 10 positions in blocks of 4
  s.complete(plan);
  EXPECT_FALSE(g.prompt_phase);
  for (auto& seq : g.seqs) {
    EXPECT_EQ(seq.blocks, g.seqs[0].blocks); // all on the same prompt blocks
    EXPECT_EQ(seq.cached, 10);
  }
  EXPECT_EQ(s.blocks().ref_count(g.seqs[0].blocks[0]), 3);
  EXPECT_EQ(s.counters().prompt_tokens, 10);
  for (size_t k = 0; k < 3; ++k)
    s.append(g, k, 7);
  // Each sample's first write lands in the shared partial block: the first two copy it, the last
  // writes in place.
  plan = s.schedule(0, 1);
  ASSERT_EQ(plan.items.size(), 3u);
  EXPECT_EQ(plan.copies.size(), 2u);
  EXPECT_EQ(s.counters().copies, 2);
  EXPECT_NE(g.seqs[0].blocks[2], g.seqs[1].blocks[2]);
  EXPECT_NE(g.seqs[1].blocks[2], g.seqs[2].blocks[2]);
  EXPECT_EQ(g.seqs[0].blocks[0], g.seqs[2].blocks[0]); // full prompt blocks stay shared
  for (auto& it : plan.items) {
    EXPECT_EQ(it.first, 10);
    EXPECT_EQ(it.count, 1);
  }
  s.complete(plan);
  EXPECT_EQ(s.counters().decode_tokens, 3);
}

TEST(Scheduler, ChunkedPrefillDecodesFirstAndAdmitsByArrival) {
  scheduler s(limits(64, 4, 8, 8));
  auto& a = s.add(1, 0, iota_tokens(6), {{}}, 20);
  auto plan = s.schedule(0, 1);
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].count, 6);
  s.complete(plan);
  s.append(a, 0, 7);
  auto& b = s.add(2, 0, iota_tokens(13, 50), {{}}, 20);
  // Budget 8: a's decode position first, then 7 of b's 13 prompt tokens.
  plan = s.schedule(0, 1);
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.items[0].group, &a);
  EXPECT_EQ(plan.items[0].count, 1);
  EXPECT_EQ(plan.items[1].group, &b);
  EXPECT_EQ(plan.items[1].count, 7);
  EXPECT_FALSE(plan.items[1].samples); // the prompt is not done yet
  s.complete(plan);
  s.append(a, 0, 7);
  plan = s.schedule(0, 1);
  ASSERT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.items[1].first, 7);
  EXPECT_EQ(plan.items[1].count, 6);
  EXPECT_TRUE(plan.items[1].samples);
  s.complete(plan);
  EXPECT_EQ(b.prefill_count, 1);
}

TEST(Scheduler, FullCachePreemptsTheYoungestWhichRecomputesLater) {
  // 8 blocks of 4: two requests of 8-token prompts that grow to 20 tokens cannot both fit.
  scheduler s(limits(8));
  auto& a = s.add(1, 0, iota_tokens(8), {{}}, 12);
  auto& b = s.add(2, 0, iota_tokens(8, 30), {{}}, 12);
  int steps = 0;
  bool saw_preemption = false;
  while (!s.empty() && steps++ < 200) {
    auto plan = s.schedule(0, 1);
    for (auto id : plan.preempted) {
      saw_preemption = true;
      EXPECT_EQ(id, 2u); // never the older request
    }
    std::vector<std::pair<scheduled_group*, size_t>> draws;
    for (auto& it : plan.items)
      if (it.samples)
        draws.emplace_back(it.group, it.seq < 0 ? 0 : static_cast<size_t>(it.seq));
    s.complete(plan);
    for (auto& [g, k] : draws) {
      s.append(*g, k, 7);
      if (static_cast<int64_t>(g->seqs[k].generated.size()) >= 12) {
        s.finish(*g, k);
        s.remove(g->id);
      }
    }
  }
  EXPECT_TRUE(s.empty());
  EXPECT_TRUE(saw_preemption);
  EXPECT_GT(s.counters().preemptions, 0);
  EXPECT_GT(s.counters().recompute_tokens, 0); // b re-fed its generated tokens
  EXPECT_EQ(s.blocks().num_available(), 8);    // everything returned
  (void)a;
  (void)b;
}

TEST(Scheduler, RefusesARequestThatCanNeverFitAndAGroupLargerThanTheLimitRunsAlone) {
  scheduler s(limits(4, 4, 2));
  EXPECT_EQ(s.worst_case_blocks(8, 1, 9), 2 + 2); // positions 8..15 → 2 own blocks
  try {
    s.add(1, 0, iota_tokens(8), {{}, {}}, 9);
    FAIL() << "a request needing 6 blocks was queued in a cache of 4";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("needs up to 6 KV-cache blocks"), std::string::npos)
      << e.what();
    EXPECT_NE(std::string(e.what()).find("raise kv_cache_bytes"), std::string::npos);
  }
  EXPECT_TRUE(s.empty());
  scheduler big(limits(64, 4, 2));
  big.add(1, 0, iota_tokens(5), {{}, {}, {}}, 3); // 3 samples > max_num_seqs 2
  big.add(2, 0, iota_tokens(5), {{}}, 3);
  auto plan = big.schedule(0, 1);
  ASSERT_EQ(plan.items.size(), 1u); // the first runs alone; the second waits for room
  EXPECT_EQ(plan.items[0].group->id, 1u);
  // (A plan that is never completed is simply planned again.)
  EXPECT_GT(run_to_end(big, 3), 0);
  EXPECT_TRUE(big.empty());
  EXPECT_THROW(big.add(3, 0, {}, {{}}, 3), error);
}

TEST(Scheduler, PrefixCacheServesFullPromptBlocksOfLaterRequests) {
  scheduler s(limits(32, 4, 8, 64, /*prefix=*/true));
  s.add(1, 0, iota_tokens(10), {{}}, 2);
  run_to_end(s, 2);
  EXPECT_GT(s.blocks().num_cached(), 0);
  // Same 10-token prompt: its two full blocks (8 positions) come from the cache.
  auto& g = s.add(2, 0, iota_tokens(10), {{}}, 2);
  auto plan = s.schedule(0, 1);
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].first, 8);
  EXPECT_EQ(plan.items[0].count, 2);
  EXPECT_EQ(s.counters().prefix_query_tokens, 20);
  EXPECT_EQ(s.counters().prefix_hit_tokens, 8);
  s.complete(plan);
  (void)g;
  // Another root (other weights) finds nothing.
  s.add(3, 0, iota_tokens(10), {{}}, 2);
  auto other = s.schedule(0, 2);
  for (auto& it : other.items) {
    if (it.group->id == 3) {
      EXPECT_EQ(it.first, 0);
    }
  }
  s.complete(other);
  // After invalidation nothing is found either.
  s.invalidate_prefix_cache();
  EXPECT_EQ(s.blocks().num_cached(), 0);
}

TEST(Scheduler, PreemptAllFreesEveryBlockAndTheWorkResumes) {
  scheduler s(limits(32));
  s.add(1, 0, iota_tokens(9), {{}, {}}, 6);
  auto plan = s.schedule(0, 1);
  s.complete(plan);
  auto* g = s.find(1);
  s.append(*g, 0, 7);
  s.append(*g, 1, 7);
  auto ids = s.preempt_all();
  EXPECT_EQ(ids, (std::vector<uint64_t>{1}));
  EXPECT_EQ(s.blocks().num_available(), 32);
  EXPECT_FALSE(g->running);
  EXPECT_GT(run_to_end(s, 6), 0);
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.blocks().num_available(), 32);
}
