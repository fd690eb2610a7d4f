#include "backends/engine/scheduler.hpp"

#include <algorithm>
#include <set>
#include <string>

#include "backends/error.hpp"

namespace rlforge::backends {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

} // namespace

scheduler::scheduler(scheduler_limits limits)
    : limits_(limits), allocator_(limits.num_blocks) {
  if (limits.block_size < 1)
    fail(error_code::invalid_argument,
         "scheduler: block_size must be >= 1, got " + std::to_string(limits.block_size));
  if (limits.max_num_seqs < 1)
    fail(error_code::invalid_argument,
         "scheduler: max_num_seqs must be >= 1, got " + std::to_string(limits.max_num_seqs));
  if (limits.max_step_tokens < limits.max_num_seqs)
    fail(error_code::invalid_argument,
         "scheduler: max_step_tokens (" + std::to_string(limits.max_step_tokens) +
             ") must be >= max_num_seqs (" + std::to_string(limits.max_num_seqs) +
             "), so every decoding sequence gets its position each step");
}

int64_t scheduler::worst_case_blocks(int64_t prompt_length, int64_t num_samples,
                                     int64_t max_new_tokens) const {
  const int64_t bs = limits_.block_size;
  const int64_t prompt_blocks = ceil_div(prompt_length, bs);
  // A sample caches positions [P, P + max_new - 1): its last token is never fed. The partial
  // last prompt block, once written, is a copy of its own.
  int64_t own = 0;
  if (max_new_tokens > 1)
    own = (prompt_length + max_new_tokens - 2) / bs - prompt_length / bs + 1;
  return prompt_blocks + num_samples * own;
}

void scheduler::check_fits(int64_t prompt_length, int64_t num_samples,
                           int64_t max_new_tokens) const {
  const int64_t worst = worst_case_blocks(prompt_length, num_samples, max_new_tokens);
  if (worst > limits_.num_blocks)
    fail(error_code::invalid_argument,
         "request of " + std::to_string(num_samples) + " sample(s) with a prompt of " +
             std::to_string(prompt_length) + " tokens and up to " +
             std::to_string(max_new_tokens) + " new tokens each needs up to " +
             std::to_string(worst) + " KV-cache blocks of " + std::to_string(limits_.block_size) +
             " tokens, but the engine's cache has only " + std::to_string(limits_.num_blocks) +
             " (raise kv_cache_bytes, or lower max_tokens / num_samples)");
}

scheduled_group& scheduler::add(uint64_t id, int64_t key, std::vector<int64_t> prompt,
                                std::vector<std::vector<int64_t>> generated,
                                int64_t max_new_tokens) {
  if (groups_.count(id))
    fail(error_code::invalid_argument, "scheduler: request id " + std::to_string(id) +
                                           " is already queued or running");
  if (prompt.empty() || generated.empty())
    fail(error_code::invalid_argument, "scheduler: a request needs a prompt and >= 1 sample");
  const auto p = static_cast<int64_t>(prompt.size());
  const auto n = static_cast<int64_t>(generated.size());
  check_fits(p, n, max_new_tokens);
  auto g = std::make_unique<scheduled_group>();
  g->id = id;
  g->key = key;
  g->arrival = next_arrival_++;
  g->prompt = std::move(prompt);
  g->max_new_tokens = max_new_tokens;
  g->seqs.resize(generated.size());
  for (size_t i = 0; i < generated.size(); ++i)
    g->seqs[i].generated = std::move(generated[i]);
  auto& ref = *g;
  by_arrival_[ref.arrival] = &ref;
  groups_[id] = std::move(g);
  return ref;
}

scheduled_group* scheduler::find(uint64_t id) {
  auto i = groups_.find(id);
  return i == groups_.end() ? nullptr : i->second.get();
}

std::vector<int64_t> scheduler::keys() const {
  std::set<int64_t> ks;
  for (auto& [id, g] : groups_)
    ks.insert(g->key);
  return {ks.begin(), ks.end()};
}

size_t scheduler::num_running() const {
  size_t n = 0;
  for (auto& [id, g] : groups_)
    n += g->running ? 1 : 0;
  return n;
}

int64_t scheduler::num_running_seqs() const {
  int64_t n = 0;
  for (auto& [id, g] : groups_)
    if (g->running)
      for (auto& s : g->seqs)
        n += s.finished ? 0 : 1;
  return n;
}

void scheduler::release_all(scheduled_group& g) {
  for (int32_t b : g.prompt_blocks)
    allocator_.release(b);
  g.prompt_blocks.clear();
  for (auto& s : g.seqs) {
    for (int32_t b : s.blocks)
      allocator_.release(b);
    s.blocks.clear();
  }
}

void scheduler::preempt(scheduled_group& g, step_plan& plan) {
  release_all(g);
  for (auto& s : g.seqs)
    s.cached = 0;
  g.prompt_cached = 0;
  g.prompt_phase = true;
  g.running = false;
  ++counters_.preemptions;
  plan.preempted.push_back(g.id);
  auto& items = plan.items;
  for (auto& it : items)
    if (it.group == &g)
      plan.tokens -= it.count;
  items.erase(std::remove_if(items.begin(), items.end(),
                             [&](const step_item& it) { return it.group == &g; }),
              items.end());
  // Copies into blocks the group just gave up are moot (and the blocks may be handed out
  // again in this plan): drop them.
  auto& copies = plan.copies;
  copies.erase(std::remove_if(copies.begin(), copies.end(),
                              [&](const std::pair<int32_t, int32_t>& c) {
                                return allocator_.ref_count(c.second) == 0;
                              }),
               copies.end());
}

std::vector<uint64_t> scheduler::preempt_all() {
  step_plan scratch;
  for (auto& [arrival, g] : by_arrival_)
    if (g->running)
      preempt(*g, scratch);
  return scratch.preempted;
}

void scheduler::preempt_group(uint64_t id) {
  step_plan scratch;
  if (auto* g = find(id); g && g->running)
    preempt(*g, scratch);
}

scheduled_group* scheduler::youngest_running_other_than(const scheduled_group& g) {
  for (auto i = by_arrival_.rbegin(); i != by_arrival_.rend(); ++i)
    if (i->second != &g && i->second->running)
      return i->second;
  return nullptr;
}

bool scheduler::ensure_slots(scheduled_group& g, size_t seq, int64_t count, step_plan& plan) {
  const int64_t bs = limits_.block_size;
  auto& s = g.seqs[seq];
  const int64_t first_block = s.cached / bs;
  const int64_t last_block = (s.cached + count - 1) / bs;
  auto needed = [&] {
    int64_t n = 0;
    for (int64_t b = first_block; b <= last_block; ++b)
      if (b >= static_cast<int64_t>(s.blocks.size()) ||
          allocator_.ref_count(s.blocks[static_cast<size_t>(b)]) > 1)
        ++n;
    return n;
  };
  while (allocator_.num_available() < needed()) {
    auto* victim = youngest_running_other_than(g);
    if (victim && victim->arrival > g.arrival) {
      preempt(*victim, plan);
      continue;
    }
    if (!victim)
      fail(error_code::internal,
           "scheduler: request " + std::to_string(g.id) +
               " runs alone yet finds no free KV-cache block (its worst case was checked)");
    preempt(g, plan); // the youngest waits for the older ones
    return false;
  }
  for (int64_t b = first_block; b <= last_block; ++b) {
    if (b < static_cast<int64_t>(s.blocks.size())) {
      auto& slot = s.blocks[static_cast<size_t>(b)];
      if (allocator_.ref_count(slot) > 1) {
        const int32_t copy = *allocator_.allocate();
        plan.copies.emplace_back(slot, copy);
        allocator_.release(slot);
        slot = copy;
        ++counters_.copies;
      }
    } else {
      s.blocks.push_back(*allocator_.allocate());
    }
  }
  return true;
}

bool scheduler::try_admit(scheduled_group& g, uint64_t root_hash) {
  const int64_t bs = limits_.block_size;
  const auto p = static_cast<int64_t>(g.prompt.size());
  const int64_t blocks = ceil_div(p, bs);
  g.prompt_hashes.clear();
  g.published = 0;
  uint64_t h = root_hash;
  for (int64_t b = 0; b < p / bs; ++b) {
    h = block_hash(h, g.prompt.data() + b * bs, bs);
    g.prompt_hashes.push_back(h);
  }
  // Cached prompt blocks, at most up to the last prompt position's block: that one is fed so
  // its logits exist.
  std::vector<int32_t> hits;
  if (limits_.prefix_caching && g.allow_prefix_hits) {
    const int64_t max_hits = (p - 1) / bs;
    for (int64_t b = 0; b < max_hits; ++b) {
      auto block = allocator_.lookup(g.prompt_hashes[static_cast<size_t>(b)]);
      if (!block)
        break;
      hits.push_back(*block);
    }
  }
  int64_t unfinished = 0;
  for (auto& s : g.seqs)
    unfinished += s.finished ? 0 : 1;
  const bool alone = num_running() == 0;
  const int64_t need = blocks - static_cast<int64_t>(hits.size()) + (alone ? 0 : unfinished);
  if (allocator_.num_available() < need) {
    for (int32_t b : hits)
      allocator_.release(b);
    return false;
  }
  if (limits_.prefix_caching && g.allow_prefix_hits) {
    counters_.prefix_query_tokens += p;
    counters_.prefix_hit_tokens += static_cast<int64_t>(hits.size()) * bs;
  }
  // The leading blocks that came from the cache are already computed.
  g.prompt_cached = static_cast<int64_t>(hits.size()) * bs;
  g.published = static_cast<int64_t>(hits.size());
  g.prompt_blocks = std::move(hits);
  while (static_cast<int64_t>(g.prompt_blocks.size()) < blocks)
    g.prompt_blocks.push_back(*allocator_.allocate());
  g.running = true;
  g.prompt_phase = true;
  g.publish = limits_.prefix_caching;
  return true;
}

step_plan scheduler::schedule(int64_t key, uint64_t root_hash) {
  step_plan plan;
  plan.key = key;
  auto tokens_left = [&] { return limits_.max_step_tokens - plan.tokens; };
  auto add_item = [&](scheduled_group& g, int32_t seq, int64_t first, int64_t count,
                      bool samples) {
    plan.items.push_back({&g, seq, first, count, samples});
    plan.tokens += count;
  };
  // 1. One position for every decoding sequence, oldest group first.
  for (auto& [arrival, gp] : by_arrival_) {
    auto& g = *gp;
    if (!g.running || g.key != key || g.prompt_phase)
      continue;
    for (size_t s = 0; s < g.seqs.size() && g.running; ++s) {
      auto& seq = g.seqs[s];
      if (seq.finished || g.length(s) - seq.cached != 1 || tokens_left() <= 0)
        continue;
      if (ensure_slots(g, s, 1, plan))
        add_item(g, static_cast<int32_t>(s), seq.cached, 1, true);
    }
  }
  // 2. Prefill chunks: prompts being prefilled and generated tokens being re-fed.
  for (auto& [arrival, gp] : by_arrival_) {
    auto& g = *gp;
    if (!g.running || g.key != key)
      continue;
    if (tokens_left() <= 0)
      break;
    if (g.prompt_phase) {
      const auto p = static_cast<int64_t>(g.prompt.size());
      const int64_t c = std::min(p - g.prompt_cached, tokens_left());
      if (c > 0) {
        bool first_tokens = false;
        for (auto& s : g.seqs)
          first_tokens = first_tokens || (!s.finished && s.generated.empty());
        add_item(g, -1, g.prompt_cached, c, g.prompt_cached + c == p && first_tokens);
      }
      continue;
    }
    for (size_t s = 0; s < g.seqs.size() && g.running; ++s) {
      auto& seq = g.seqs[s];
      const int64_t pending = g.length(s) - seq.cached;
      if (seq.finished || pending <= 1)
        continue;
      const int64_t c = std::min(pending, tokens_left());
      if (c <= 0)
        break;
      if (ensure_slots(g, s, c, plan))
        add_item(g, static_cast<int32_t>(s), seq.cached, c, c == pending);
    }
  }
  // 3. Admission, by arrival, while budget, sequence limit and blocks allow.
  for (auto& [arrival, gp] : by_arrival_) {
    auto& g = *gp;
    if (g.running || g.key != key)
      continue;
    if (tokens_left() <= 0)
      break;
    int64_t unfinished = 0;
    for (auto& s : g.seqs)
      unfinished += s.finished ? 0 : 1;
    const int64_t running = num_running_seqs();
    if (running > 0 && running + unfinished > limits_.max_num_seqs)
      break;
    if (!try_admit(g, root_hash))
      break;
    const auto p = static_cast<int64_t>(g.prompt.size());
    const int64_t c = std::min(p - g.prompt_cached, tokens_left());
    bool first_tokens = false;
    for (auto& s : g.seqs)
      first_tokens = first_tokens || (!s.finished && s.generated.empty());
    add_item(g, -1, g.prompt_cached, c, g.prompt_cached + c == p && first_tokens);
  }
  return plan;
}

void scheduler::complete(const step_plan& plan) {
  if (!plan.items.empty())
    ++counters_.steps;
  const int64_t bs = limits_.block_size;
  for (auto& it : plan.items) {
    auto& g = *it.group;
    if (it.seq >= 0) {
      auto& s = g.seqs[static_cast<size_t>(it.seq)];
      s.cached += it.count;
      if (it.count == 1 && it.samples)
        counters_.decode_tokens += 1;
      else
        counters_.recompute_tokens += it.count;
      continue;
    }
    counters_.prompt_tokens += it.count;
    g.prompt_cached += it.count;
    for (; g.publish && g.published < static_cast<int64_t>(g.prompt_hashes.size()) &&
           (g.published + 1) * bs <= g.prompt_cached;
         ++g.published)
      allocator_.publish(g.prompt_blocks[static_cast<size_t>(g.published)],
                         g.prompt_hashes[static_cast<size_t>(g.published)]);
    if (g.prompt_cached < static_cast<int64_t>(g.prompt.size()))
      continue;
    // Fork: every unfinished sample references the prompt's blocks.
    for (auto& s : g.seqs) {
      if (s.finished)
        continue;
      for (int32_t b : g.prompt_blocks)
        allocator_.share(b);
      s.blocks = g.prompt_blocks;
      s.cached = g.prompt_cached;
    }
    for (int32_t b : g.prompt_blocks)
      allocator_.release(b);
    g.prompt_blocks.clear();
    g.prompt_phase = false;
    ++g.prefill_count;
  }
}

void scheduler::append(scheduled_group& group, size_t seq, int64_t token) {
  group.seqs[seq].generated.push_back(token);
}

void scheduler::finish(scheduled_group& group, size_t seq) {
  auto& s = group.seqs[seq];
  for (int32_t b : s.blocks)
    allocator_.release(b);
  s.blocks.clear();
  s.finished = true;
}

void scheduler::remove(uint64_t id) {
  auto i = groups_.find(id);
  if (i == groups_.end())
    return;
  release_all(*i->second);
  by_arrival_.erase(i->second->arrival);
  groups_.erase(i);
}

void scheduler::invalidate_prefix_cache() {
  allocator_.clear_hashes();
  for (auto& [id, g] : groups_)
    g->publish = false;
}

} // namespace rlforge::backends
