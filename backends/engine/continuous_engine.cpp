#include "backends/engine/continuous_engine.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <set>
#include <string>

#include "backends/engine/paged_attention.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/stop_strings.hpp"

namespace rlforge::backends {

struct continuous_engine::request_state {
  sampling_params params;
  int64_t budget = 0; ///< most tokens per sample, continuation included
  std::vector<row_generator> generators;
  /// One per sample when the request has stop strings, fed every token of the sample
  /// (continuation included) in order; empty otherwise.
  std::vector<stop_string_matcher> stop_strings;
  std::vector<engine_sample> samples;
  /// What the prompt's prefill scored (prompt_logprobs / topk_prompt_logprobs), complete once
  /// `prompt_logprobs_done`.
  std::vector<double> prompt_logprobs;
  std::vector<int64_t> topk_prompt_ids;
  std::vector<double> topk_prompt_logprobs;
  bool prompt_logprobs_done = false;
  scheduled_group* group = nullptr; ///< owned by the scheduler

  bool scores_prompt() const { return params.prompt_logprobs || params.topk_prompt_logprobs > 0; }
  /// A preempted request prefills again: what its prompt scored so far is dropped.
  void forget_partial_prompt() {
    if (prompt_logprobs_done)
      return;
    prompt_logprobs.clear();
    topk_prompt_ids.clear();
    topk_prompt_logprobs.clear();
  }
};

void validate(const engine_config& c, const model_config& config) {
  auto bad = [](const std::string& what) {
    fail(error_code::invalid_argument, "engine_config: " + what);
  };
  if (c.block_size < 1)
    bad("block_size must be >= 1, got " + std::to_string(c.block_size));
  if (c.max_num_seqs < 1)
    bad("max_num_seqs must be >= 1, got " + std::to_string(c.max_num_seqs));
  if (c.max_step_tokens < c.max_num_seqs)
    bad("max_step_tokens (" + std::to_string(c.max_step_tokens) +
        ") must be >= max_num_seqs (" + std::to_string(c.max_num_seqs) + ")");
  const int64_t block = paged_kv_cache::block_bytes(config, c.block_size);
  if (c.kv_cache_bytes < block)
    bad("kv_cache_bytes " + std::to_string(c.kv_cache_bytes) + " is below one block (" +
        std::to_string(block) + " bytes for " + std::to_string(c.block_size) +
        " positions of this model)");
}

namespace {

/// The cache's element type: fp32 on the CPU (its kernels read floats), the compute dtype on a
/// CUDA device.
c10::ScalarType cache_dtype(const causal_lm& model) {
  return model.device().is_cuda() && model.compute_precision() == compute_dtype::bf16
             ? at::kBFloat16
             : at::kFloat;
}

} // namespace

continuous_engine::continuous_engine(causal_lm& model, engine_config config)
    : model_(model), config_(config),
      cache_(model.config(), config.block_size, model.device(), cache_dtype(model)) {
  validate(config_, model.config());
  scheduler_limits limits;
  limits.num_blocks =
      config_.kv_cache_bytes /
      paged_kv_cache::block_bytes(model.config(), config_.block_size,
                                  static_cast<int64_t>(c10::elementSize(cache_.dtype())));
  limits.block_size = config_.block_size;
  limits.max_num_seqs = config_.max_num_seqs;
  limits.max_step_tokens = config_.max_step_tokens;
  limits.prefix_caching = config_.prefix_caching;
  scheduler_ = std::make_unique<scheduler>(limits);
  cache_.allocate(limits.num_blocks);
}

continuous_engine::~continuous_engine() = default;

void continuous_engine::check(const engine_request& request) const {
  const auto& cfg = model_.config();
  const auto p = static_cast<int64_t>(request.prompt.size());
  if (request.prompt.empty())
    fail(error_code::invalid_argument, "empty prompt");
  for (size_t j = 0; j < request.prompt.size(); ++j)
    if (request.prompt[j] < 0 || request.prompt[j] >= cfg.vocab_size)
      fail(error_code::out_of_range, "prompt token " + std::to_string(j) + " has id " +
                                         std::to_string(request.prompt[j]) +
                                         ", outside the vocabulary [0, " +
                                         std::to_string(cfg.vocab_size) + ")");
  if (p >= cfg.max_position_embeddings)
    fail(error_code::invalid_argument,
         "prompt of " + std::to_string(p) + " tokens leaves no room in the model's context of " +
             std::to_string(cfg.max_position_embeddings) + " tokens");
  validate(request.params, cfg.vocab_size);
  const auto n = request.seeds.size();
  if (n == 0)
    fail(error_code::invalid_argument, "a request needs at least one sample");
  if (!request.generated.empty() && request.generated.size() != n)
    fail(error_code::invalid_argument,
         "continuation tokens for " + std::to_string(request.generated.size()) +
             " samples, but the request has " + std::to_string(n));
  const int64_t budget = std::min(request.params.max_tokens, cfg.max_position_embeddings - p);
  const auto& stops = request.params.stop_token_ids;
  for (size_t s = 0; s < n; ++s) {
    if (request.generated.empty())
      break;
    const auto& g = request.generated[s];
    if (static_cast<int64_t>(g.size()) >= budget)
      fail(error_code::invalid_argument,
           "sample " + std::to_string(s) + " continues after " + std::to_string(g.size()) +
               " tokens, but it may generate only " + std::to_string(budget));
    for (size_t j = 0; j < g.size(); ++j) {
      if (g[j] < 0 || g[j] >= cfg.vocab_size)
        fail(error_code::out_of_range, "sample " + std::to_string(s) + " continuation token " +
                                           std::to_string(j) + " has id " + std::to_string(g[j]) +
                                           ", outside the vocabulary");
      if (std::find(stops.begin(), stops.end(), g[j]) != stops.end())
        fail(error_code::invalid_argument, "sample " + std::to_string(s) +
                                               " continuation holds stop token " +
                                               std::to_string(g[j]) + ": it already stopped");
    }
    if (!request.params.stop_strings.empty()) {
      stop_string_matcher m(*request.params.tokenizer, request.params.stop_strings);
      for (size_t j = 0; j < g.size(); ++j)
        if (auto hit = m.push(g[j]))
          fail(error_code::invalid_argument,
               "sample " + std::to_string(s) + " continuation completes stop string " +
                   std::to_string(*hit) + " at token " + std::to_string(j) +
                   ": it already stopped");
    }
  }
  scheduler_->check_fits(p, static_cast<int64_t>(n), budget);
}

void continuous_engine::add(uint64_t id, engine_request request) {
  check(request);
  const auto p = static_cast<int64_t>(request.prompt.size());
  const auto n = request.seeds.size();
  request.generated.resize(n);
  const int64_t budget =
      std::min(request.params.max_tokens, model_.config().max_position_embeddings - p);
  if (requests_.count(id))
    fail(error_code::invalid_argument,
         "request id " + std::to_string(id) + " is already queued or running");
  auto state = std::make_unique<request_state>();
  state->params = request.params;
  state->budget = budget;
  state->samples.resize(n);
  state->generators.reserve(n);
  for (size_t s = 0; s < n; ++s) {
    state->generators.emplace_back(request.seeds[s]);
    // A sampling row drew one number per token it generated before.
    if (state->params.temperature > 0.0)
      for (size_t j = 0; j < request.generated[s].size(); ++j)
        state->generators.back().next_uniform();
    // The text of a continuation is seen first, so a stop string may span the seam.
    if (!state->params.stop_strings.empty()) {
      state->stop_strings.emplace_back(*state->params.tokenizer, state->params.stop_strings);
      for (int64_t t : request.generated[s])
        state->stop_strings.back().push(t);
    }
  }
  auto& group = scheduler_->add(id, request.key, std::move(request.prompt),
                                std::move(request.generated), budget);
  group.allow_prefix_hits = !state->scores_prompt();
  state->group = &group;
  requests_[id] = std::move(state);
}

engine_output continuous_engine::take_output(request_state& r, uint64_t id, bool aborted) {
  engine_output out;
  out.id = id;
  out.aborted = aborted;
  out.samples = std::move(r.samples);
  for (size_t s = 0; s < out.samples.size(); ++s)
    if (out.samples[s].stop_reason.empty())
      out.samples[s].stop_reason = "abort";
  if (r.prompt_logprobs_done) {
    out.prompt_logprobs = std::move(r.prompt_logprobs);
    out.topk_prompt_ids = std::move(r.topk_prompt_ids);
    out.topk_prompt_logprobs = std::move(r.topk_prompt_logprobs);
  }
  return out;
}

at::Tensor continuous_engine::forward(const step_plan& plan) {
  std::vector<int64_t> ids, positions;
  ids.reserve(static_cast<size_t>(plan.tokens));
  positions.reserve(static_cast<size_t>(plan.tokens));
  std::vector<attention_item> items;
  items.reserve(plan.items.size());
  for (auto& it : plan.items) {
    const auto& g = *it.group;
    items.push_back({static_cast<int64_t>(ids.size()), it.first, it.count, &it.blocks(), g.id});
    for (int64_t j = 0; j < it.count; ++j) {
      const int64_t pos = it.first + j;
      ids.push_back(it.seq < 0 ? g.prompt[static_cast<size_t>(pos)]
                               : g.token(static_cast<size_t>(it.seq), pos));
      positions.push_back(pos);
    }
  }
  paged_attention attention(cache_, model_.config().num_attention_heads, std::move(items));
  return model_.forward_tokens(at::tensor(ids, at::kLong), at::tensor(positions, at::kLong),
                               attention);
}

void continuous_engine::add_prompt_logprobs(const step_plan& plan, const at::Tensor& hidden) {
  // Each prefilled position that has a next prompt token predicts it.
  int64_t row = 0;
  for (auto& it : plan.items) {
    auto& r = *requests_.at(it.group->id);
    const auto p = static_cast<int64_t>(it.group->prompt.size());
    if (it.seq < 0 && r.scores_prompt() && !r.prompt_logprobs_done) {
      std::vector<int64_t> rows, targets;
      for (int64_t j = 0; j < it.count && it.first + j + 1 < p; ++j) {
        rows.push_back(row + j);
        targets.push_back(it.group->prompt[static_cast<size_t>(it.first + j + 1)]);
      }
      if (!rows.empty()) {
        auto logits =
            model_.logits(hidden.index_select(0, at::tensor(rows, at::kLong).to(hidden.device())));
        if (r.params.prompt_logprobs) {
          auto lp = token_logprobs(logits, targets);
          r.prompt_logprobs.insert(r.prompt_logprobs.end(), lp.begin(), lp.end());
        }
        if (r.params.topk_prompt_logprobs > 0) {
          auto top = top_token_logprobs(logits, r.params.topk_prompt_logprobs);
          r.topk_prompt_ids.insert(r.topk_prompt_ids.end(), top.ids.begin(), top.ids.end());
          r.topk_prompt_logprobs.insert(r.topk_prompt_logprobs.end(), top.logprobs.begin(),
                                        top.logprobs.end());
        }
      }
      if (it.first + it.count == p) {
        r.prompt_logprobs_done = true;
        it.group->allow_prefix_hits = true; // a recompute may now reuse cached blocks
      }
    }
    row += it.count;
  }
}

std::vector<engine_output> continuous_engine::step(int64_t key, int64_t version) {
  if (!cache_.allocated())
    fail(error_code::invalid_argument, "the KV cache is released (asleep); restore it first");
  const int64_t salt[2] = {key, version};
  auto plan = scheduler_->schedule(key, block_hash(0x6b762d6361636865ull, salt, 2));
  for (auto id : plan.preempted) {
    requests_.at(id)->forget_partial_prompt();
  }
  if (plan.items.empty())
    return {};
  // Which sample draws from which row (decided before the fork changes the groups).
  struct draw {
    scheduled_group* group;
    size_t seq;
    int64_t row;
  };
  std::vector<draw> draws;
  std::vector<sampled_token> sampled;
  try {
    c10::NoGradGuard no_grad;
    for (auto& [src, dst] : plan.copies)
      cache_.copy_block(src, dst);
    auto hidden = forward(plan);
    add_prompt_logprobs(plan, hidden);
    int64_t row = 0;
    for (auto& it : plan.items) {
      const int64_t last = row + it.count - 1;
      row += it.count;
      if (!it.samples)
        continue;
      if (it.seq >= 0) {
        draws.push_back({it.group, static_cast<size_t>(it.seq), last});
        continue;
      }
      for (size_t s = 0; s < it.group->seqs.size(); ++s)
        if (!it.group->seqs[s].finished && it.group->seqs[s].generated.empty())
          draws.push_back({it.group, s, last});
    }
    if (!draws.empty()) {
      std::vector<int64_t> rows;
      std::vector<const sampling_params*> params;
      std::vector<row_generator*> generators;
      for (auto& d : draws) {
        auto& r = *requests_.at(d.group->id);
        rows.push_back(d.row);
        params.push_back(&r.params);
        generators.push_back(&r.generators[d.seq]);
      }
      auto index = at::tensor(rows, at::kLong).to(hidden.device());
      sampled = sample_tokens(model_.logits(hidden.index_select(0, index)), params, generators);
    }
  } catch (...) {
    // The step's blocks may hold positions that were never written: recompute those requests.
    for (auto& it : plan.items) {
      scheduler_->preempt_group(it.group->id);
      requests_.at(it.group->id)->forget_partial_prompt();
    }
    throw;
  }
  scheduler_->complete(plan);
  std::vector<uint64_t> touched;
  for (size_t k = 0; k < draws.size(); ++k) {
    auto& d = draws[k];
    auto& r = *requests_.at(d.group->id);
    auto& out = r.samples[d.seq];
    const int64_t token = sampled[k].token;
    scheduler_->append(*d.group, d.seq, token);
    out.tokens.push_back(token);
    out.logprobs.push_back(sampled[k].logprob);
    out.versions.push_back(version);
    ++generated_tokens_;
    const auto& stops = r.params.stop_token_ids;
    // Every token goes through the matcher, also one that a stop token id ends the sample with.
    const bool stop_string = !r.stop_strings.empty() && r.stop_strings[d.seq].push(token);
    if (std::find(stops.begin(), stops.end(), token) != stops.end() || stop_string)
      out.stop_reason = "stop";
    else if (static_cast<int64_t>(d.group->seqs[d.seq].generated.size()) >= r.budget)
      out.stop_reason = "length";
    if (!out.stop_reason.empty()) {
      scheduler_->finish(*d.group, d.seq);
      touched.push_back(d.group->id);
    }
  }

  // Requests whose last sample finished, oldest first.
  std::vector<std::pair<uint64_t, uint64_t>> done; // (arrival, id)
  for (auto id : touched) {
    auto* g = scheduler_->find(id);
    if (g && g->all_finished())
      done.emplace_back(g->arrival, id);
  }
  std::sort(done.begin(), done.end());
  done.erase(std::unique(done.begin(), done.end()), done.end());
  std::vector<engine_output> outputs;
  for (auto& [arrival, id] : done) {
    auto i = requests_.find(id);
    outputs.push_back(take_output(*i->second, id, false));
    scheduler_->remove(id);
    requests_.erase(i);
  }
  return outputs;
}

std::optional<engine_output> continuous_engine::abort(uint64_t id) {
  auto i = requests_.find(id);
  if (i == requests_.end())
    return std::nullopt;
  auto out = take_output(*i->second, id, true);
  scheduler_->remove(id);
  requests_.erase(i);
  return out;
}

std::vector<engine_output> continuous_engine::abort_all() {
  std::vector<engine_output> out;
  for (auto id : ids())
    out.push_back(*abort(id));
  return out;
}

std::vector<uint64_t> continuous_engine::ids() const {
  std::vector<std::pair<uint64_t, uint64_t>> by_arrival;
  for (auto& [id, r] : requests_)
    by_arrival.emplace_back(r->group->arrival, id);
  std::sort(by_arrival.begin(), by_arrival.end());
  std::vector<uint64_t> out;
  for (auto& [arrival, id] : by_arrival)
    out.push_back(id);
  return out;
}

void continuous_engine::release_cache() {
  for (auto id : scheduler_->preempt_all()) {
    requests_.at(id)->forget_partial_prompt();
  }
  scheduler_->invalidate_prefix_cache();
  cache_.release();
}

void continuous_engine::restore_cache() {
  if (!cache_.allocated())
    cache_.allocate(scheduler_->limits().num_blocks);
}

void continuous_engine::weights_changed() {
  scheduler_->invalidate_prefix_cache();
}

engine_stats continuous_engine::stats() const {
  engine_stats s;
  s.counters = scheduler_->counters();
  s.num_blocks = scheduler_->blocks().num_blocks();
  s.free_blocks = scheduler_->blocks().num_available();
  s.cached_blocks = scheduler_->blocks().num_cached();
  s.block_size = config_.block_size;
  s.running = static_cast<int64_t>(scheduler_->num_running());
  s.waiting = static_cast<int64_t>(scheduler_->num_groups()) - s.running;
  s.generated_tokens = generated_tokens_;
  for (auto& [id, r] : requests_)
    for (auto& sample : r->samples)
      s.in_flight_tokens += static_cast<int64_t>(sample.tokens.size());
  return s;
}

} // namespace rlforge::backends
