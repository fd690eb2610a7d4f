#include "actors/engine.hpp"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_kind.hpp"
#include "actors/backend_seam.hpp"
#include "actors/batch_wire.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "backends/storage_bytes.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors {

namespace {

namespace be = rlforge::backends;
using be::error_code;

const char* const tag_weights = "weights";
const char* const tag_kv_cache = "kv_cache";

/// A retained weight version: copies of every parameter, by name.
struct snapshot {
  std::map<std::string, at::Tensor> weights; ///< empty while the version is still the current one
  uint64_t last_used = 0;
};

/// One engine rank: its model copy, weight version, retained versions, sleep and pause state.
struct engine_state {
  std::unique_ptr<be::causal_lm> model;
  int64_t version = 0;
  /// Versions kept for `generate` after newer weights arrive (`retain_weights`), LRU-bounded.
  std::map<int64_t, snapshot> retained;
  size_t max_retained = 0;
  uint64_t clock = 0;
  std::set<std::string> asleep;
  /// While `weights` sleeps: each parameter's storage, moved out of the model.
  std::map<std::string, at::Tensor> host_weights;
  bool paused = false;
  /// Calls received while paused: (reply ticket, requests), in arrival order.
  std::vector<std::pair<uint64_t, std::vector<sample_request>>> queue;
};

template <class... Ts>
void expect_args(const caf::message& args, const char* op, const char* signature) {
  if (!args.match_elements<Ts...>())
    be::fail(error_code::invalid_argument,
             std::string{op} + " expects (" + signature + "), got " + caf::to_string(args));
}

be::causal_lm& model_of(engine_state& st, const char* op) {
  if (!st.model)
    be::fail(error_code::invalid_argument,
             std::string{op} + " before init_model: the engine has no model yet");
  return *st.model;
}

using be::storage_bytes;

std::vector<std::string> parse_tags(const std::vector<std::string>& tags, const char* op) {
  if (tags.empty())
    return {tag_weights, tag_kv_cache};
  for (auto& t : tags)
    if (t != tag_weights && t != tag_kv_cache)
      be::fail(error_code::invalid_argument,
               std::string{op} + ": unknown tag '" + t + "' (tags: weights, kv_cache)");
  return tags;
}

void check_awake(const engine_state& st) {
  for (const char* tag : {tag_weights, tag_kv_cache})
    if (st.asleep.count(tag))
      be::fail(error_code::invalid_argument,
               std::string{"engine is asleep ("} + tag + "); call wake_up");
}

/// Checks every request, naming its index and the bad value, and expands `num_samples`.
void expand_requests(const be::causal_lm& model, const std::vector<sample_request>& requests,
                     std::vector<std::vector<int64_t>>& prompts,
                     std::vector<be::sampling_params>& params) {
  if (requests.empty())
    be::fail(error_code::invalid_argument, "generate: no requests");
  const auto& cfg = model.config();
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& r = requests[i];
    auto where = "generate: request " + std::to_string(i) + ": ";
    if (r.prompt.empty())
      be::fail(error_code::invalid_argument, where + "empty prompt");
    if (static_cast<int64_t>(r.prompt.size()) >= cfg.max_position_embeddings)
      be::fail(error_code::invalid_argument,
               where + "prompt of " + std::to_string(r.prompt.size()) +
                   " tokens leaves no room in the model's context of " +
                   std::to_string(cfg.max_position_embeddings) + " tokens");
    for (size_t j = 0; j < r.prompt.size(); ++j)
      if (r.prompt[j] < 0 || r.prompt[j] >= cfg.vocab_size)
        be::fail(error_code::out_of_range, where + "prompt token " + std::to_string(j) +
                                               " has id " + std::to_string(r.prompt[j]) +
                                               ", outside the vocabulary [0, " +
                                               std::to_string(cfg.vocab_size) + ")");
    if (r.max_tokens <= 0)
      be::fail(error_code::invalid_argument,
               where + "max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
    if (r.num_samples < 1)
      be::fail(error_code::invalid_argument,
               where + "num_samples must be >= 1, got " + std::to_string(r.num_samples));
    be::sampling_params p;
    p.max_tokens = r.max_tokens;
    p.temperature = r.temperature;
    p.top_k = r.top_k;
    p.top_p = r.top_p;
    p.stop_token_ids = r.stop_token_ids;
    p.prompt_logprobs = r.prompt_logprobs;
    try {
      be::validate(p, cfg.vocab_size);
    } catch (const be::error& e) {
      be::fail(e.code(), where + e.what());
    }
    if (r.first_sample < 0)
      be::fail(error_code::invalid_argument,
               where + "first_sample must be >= 0, got " + std::to_string(r.first_sample));
    for (int64_t j = 0; j < r.num_samples; ++j) {
      auto row = p;
      if (r.has_seed)
        row.seed = be::sample_seed(r.seed, static_cast<uint64_t>(r.first_sample + j));
      prompts.push_back(r.prompt);
      params.push_back(std::move(row));
    }
  }
}

/// Puts `weights` into the model's parameters (by name, storage swap, no copy) and returns what
/// they held, so a second call puts that back.
std::map<std::string, at::Tensor> swap_weights(be::causal_lm& model,
                                               std::map<std::string, at::Tensor> weights) {
  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> previous;
  for (auto& [name, p] : model.named_parameters()) {
    previous.emplace(name, p.detach());
    p.set_(weights.at(name));
  }
  return previous;
}

/// Generates `requests` on the weights of `version` (0 or the current version: the live
/// weights; otherwise a retained snapshot, swapped in for the call and out again).
std::vector<sample_output> generate_on(engine_state& st, int64_t version,
                                       const std::vector<sample_request>& requests) {
  auto& model = *st.model;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<be::sampling_params> params;
  expand_requests(model, requests, prompts, params);
  std::map<std::string, at::Tensor> live;
  if (version != 0 && version != st.version) {
    auto it = st.retained.find(version);
    if (it == st.retained.end() || it->second.weights.empty())
      be::fail(error_code::not_found, "generate: weights version " + std::to_string(version) +
                                          " are no longer held by this engine (it holds version " +
                                          std::to_string(st.version) + " and keeps the " +
                                          std::to_string(st.max_retained) +
                                          " most recently used retained versions)");
    it->second.last_used = ++st.clock;
    live = swap_weights(model, it->second.weights);
  } else if (auto it = st.retained.find(st.version); it != st.retained.end()) {
    it->second.last_used = ++st.clock;
  }
  std::vector<be::sample_result> results;
  try {
    results = be::generate(model, prompts, params);
  } catch (...) {
    if (!live.empty())
      swap_weights(model, std::move(live));
    throw;
  }
  if (!live.empty())
    swap_weights(model, std::move(live));
  std::vector<sample_output> out;
  out.reserve(results.size());
  for (auto& r : results)
    out.push_back({std::move(r.tokens), std::move(r.logprobs), std::move(r.stop_reason),
                   std::move(r.prompt_logprobs)});
  return out;
}

caf::message run_generate(engine_state& st, const std::vector<sample_request>& requests) {
  model_of(st, "generate");
  check_awake(st);
  if (requests.empty())
    be::fail(error_code::invalid_argument, "generate: no requests");
  // One batch per weight version (a forward pass never mixes two versions); rows come back in
  // request order.
  std::map<int64_t, std::vector<size_t>> by_version;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto v = requests[i].weight_version;
    if (v < 0)
      be::fail(error_code::invalid_argument, "generate: request " + std::to_string(i) +
                                                 ": weight_version must be >= 0, got " +
                                                 std::to_string(v));
    by_version[v == st.version ? 0 : v].push_back(i);
  }
  if (by_version.size() == 1)
    return caf::make_message(generate_on(st, by_version.begin()->first, requests));
  std::vector<std::vector<sample_output>> per_request(requests.size());
  for (auto& [version, indices] : by_version) {
    std::vector<sample_request> group;
    for (auto i : indices)
      group.push_back(requests[i]);
    auto rows = generate_on(st, version, group);
    size_t row = 0;
    for (auto i : indices) {
      auto n = static_cast<size_t>(requests[i].num_samples);
      per_request[i].assign(std::make_move_iterator(rows.begin() + row),
                            std::make_move_iterator(rows.begin() + row + n));
      row += n;
    }
  }
  std::vector<sample_output> out;
  for (auto& rows : per_request)
    for (auto& r : rows)
      out.push_back(std::move(r));
  return caf::make_message(std::move(out));
}

/// Before the live weights change: a retained current version keeps a copy of them.
void keep_current(engine_state& st) {
  auto it = st.retained.find(st.version);
  if (it == st.retained.end() || !it->second.weights.empty())
    return;
  at::NoGradGuard no_grad;
  for (auto& [name, p] : st.model->named_parameters())
    it->second.weights.emplace(name, p.detach().clone());
}

// -- ops --------------------------------------------------------------------------------------

caf::expected<caf::message> init_model(rank_context& ctx, const caf::message& args) {
  expect_args<model_spec>(args, "init_model", "model_spec");
  auto& st = ctx.as<engine_state>();
  const auto& spec = args.get_as<model_spec>(0);
  if (spec.lora_rank != 0)
    be::fail(error_code::invalid_argument,
             "init_model: an engine serves merged weights; lora_rank must be 0, got " +
                 std::to_string(spec.lora_rank));
  const auto dtype = compute_dtype_of(spec);
  auto model = build_model(spec);
  if (spec.untie_word_embeddings)
    model->untie_word_embeddings();
  // An engine only infers: in bf16 it holds its weights in bf16 (half the memory, and weight
  // syncs send half the bytes: weights_for_sync).
  if (dtype == be::compute_dtype::bf16)
    model->store_weights_in_bf16();
  model->set_batch_invariant(spec.batch_invariant);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : model->named_parameters())
      p.requires_grad_(false);
  }
  model->set_training(false);
  st.model = std::move(model);
  st.version = 0;
  st.retained.clear();
  st.asleep.clear();
  st.host_weights.clear();
  return caf::make_message(st.model->num_parameters());
}

caf::expected<caf::message> generate(rank_context& ctx, const caf::message& args) {
  expect_args<std::vector<sample_request>>(args, "generate", "std::vector<sample_request>");
  auto& st = ctx.as<engine_state>();
  model_of(st, "generate");
  const auto& requests = args.get_as<std::vector<sample_request>>(0);
  if (st.paused) {
    auto ticket = ctx.defer_reply();
    st.queue.emplace_back(ticket, requests);
    return caf::message{};
  }
  return run_generate(st, requests);
}

caf::expected<caf::message> sleep_op(rank_context& ctx, const caf::message& args) {
  expect_args<std::vector<std::string>>(args, "sleep", "std::vector<std::string> tags");
  auto& st = ctx.as<engine_state>();
  auto& model = model_of(st, "sleep");
  for (auto& tag : parse_tags(args.get_as<std::vector<std::string>>(0), "sleep")) {
    if (st.asleep.count(tag))
      continue;
    if (tag == tag_weights) {
      // Move each storage out of the model: the saved tensor keeps it alive, the model's
      // tensor is emptied in place (no copy; tied weights stay tied through shared storage).
      at::NoGradGuard no_grad;
      std::map<std::string, at::Tensor> saved;
      auto params = model.named_parameters();
      for (auto& [name, p] : params)
        saved.emplace(name, p.detach());
      for (auto& [name, p] : params)
        p.set_();
      st.host_weights = std::move(saved);
    }
    st.asleep.insert(tag);
  }
  return caf::message{};
}

caf::expected<caf::message> wake_up(rank_context& ctx, const caf::message& args) {
  expect_args<std::vector<std::string>>(args, "wake_up", "std::vector<std::string> tags");
  auto& st = ctx.as<engine_state>();
  auto& model = model_of(st, "wake_up");
  for (auto& tag : parse_tags(args.get_as<std::vector<std::string>>(0), "wake_up")) {
    if (!st.asleep.count(tag))
      continue;
    if (tag == tag_weights) {
      at::NoGradGuard no_grad;
      for (auto& [name, p] : model.named_parameters()) {
        auto i = st.host_weights.find(name);
        if (i == st.host_weights.end())
          be::fail(error_code::internal, "wake_up: no saved storage for parameter '" + name + "'");
        p.set_(i->second);
      }
      st.host_weights.clear();
    }
    st.asleep.erase(tag);
  }
  return caf::message{};
}

caf::expected<caf::message> memory(rank_context& ctx, const caf::message&) {
  auto& st = ctx.as<engine_state>();
  auto& model = model_of(st, "memory");
  auto resident = storage_bytes(model.named_parameters());
  for (auto& [version, snap] : st.retained)
    resident += storage_bytes(snap.weights);
  auto host = storage_bytes(st.host_weights);
  return caf::make_message(resident, host);
}

caf::expected<caf::message> pause_op(rank_context& ctx, const caf::message&) {
  auto& st = ctx.as<engine_state>();
  model_of(st, "pause");
  st.paused = true;
  return caf::message{};
}

caf::expected<caf::message> resume(rank_context& ctx, const caf::message&) {
  auto& st = ctx.as<engine_state>();
  model_of(st, "resume");
  st.paused = false;
  auto queue = std::move(st.queue);
  st.queue.clear();
  for (auto& [ticket, requests] : queue) {
    try {
      ctx.deliver(ticket, run_generate(st, requests));
    } catch (...) {
      ctx.deliver(ticket, current_exception_to_error("queued generate"));
    }
  }
  return caf::make_message(static_cast<int64_t>(queue.size()));
}

caf::expected<caf::message> weight_version(rank_context& ctx, const caf::message&) {
  auto& st = ctx.as<engine_state>();
  model_of(st, "weight_version");
  return caf::make_message(st.version);
}

caf::expected<caf::message> set_weights(rank_context& ctx, const caf::message& args) {
  expect_args<tensor_map, int64_t>(args, "set_weights", "tensor_map weights, int64 version");
  auto& st = ctx.as<engine_state>();
  auto& model = model_of(st, "set_weights");
  auto version = args.get_as<int64_t>(1);
  if (version < 0)
    be::fail(error_code::invalid_argument,
             "set_weights: version must be >= 0, got " + std::to_string(version));
  if (st.asleep.count(tag_weights))
    be::fail(error_code::invalid_argument,
             "set_weights: engine is asleep (weights); call wake_up first");
  auto tensors = from_blobs(args.get_as<tensor_map>(0));
  if (!tensors)
    be::fail(error_code::invalid_argument, "set_weights: " + error_message(tensors.error()));
  auto params = model.named_parameters();
  for (auto& [name, p] : params) {
    auto i = tensors->find(name);
    if (i == tensors->end())
      be::fail(error_code::invalid_argument, "set_weights: missing parameter '" + name + "'");
    const auto& t = i->second;
    if (t.sizes() != p.sizes())
      be::fail(error_code::invalid_argument, "set_weights: parameter '" + name + "' has shape " +
                                                 c10::str(t.sizes()) + ", the model's is " +
                                                 c10::str(p.sizes()));
    if (t.scalar_type() != p.scalar_type())
      be::fail(error_code::invalid_argument, "set_weights: parameter '" + name + "' has dtype " +
                                                 std::string{c10::toString(t.scalar_type())} +
                                                 ", the model's is " +
                                                 std::string{c10::toString(p.scalar_type())});
  }
  if (tensors->size() != params.size()) {
    for (auto& [name, t] : *tensors) {
      bool known = std::any_of(params.begin(), params.end(),
                               [&](const auto& kv) { return kv.first == name; });
      if (!known)
        be::fail(error_code::invalid_argument,
                 "set_weights: the model has no parameter '" + name + "'");
    }
  }
  keep_current(st);
  at::NoGradGuard no_grad;
  for (auto& [name, p] : params)
    p.copy_(tensors->at(name));
  st.version = version;
  return caf::message{};
}

caf::expected<caf::message> receive_weights(rank_context& ctx, const caf::message& args) {
  expect_args<weight_sync_spec>(args, "receive_weights", "weight_sync_spec");
  auto& st = ctx.as<engine_state>();
  auto& model = model_of(st, "receive_weights");
  if (st.asleep.count(tag_weights))
    be::fail(error_code::invalid_argument,
             "receive_weights: engine is asleep (weights); call wake_up first");
  bool torn = false;
  keep_current(st);
  try {
    st.version = receive_model_weights(model, st.version, args.get_as<weight_sync_spec>(0), torn);
  } catch (...) {
    // A refused transfer changed nothing. One that broke after the copy began left a mix of
    // two versions: no coherent version is held until the next complete transfer.
    if (torn)
      st.version = 0;
    throw;
  }
  return caf::make_message(st.version);
}

caf::expected<caf::message> retain_weights(rank_context& ctx, const caf::message& args) {
  expect_args<int64_t, int64_t>(args, "retain_weights", "int64 version, int64 max_retained");
  auto& st = ctx.as<engine_state>();
  model_of(st, "retain_weights");
  auto version = args.get_as<int64_t>(0);
  auto max_retained = args.get_as<int64_t>(1);
  if (max_retained < 1)
    be::fail(error_code::invalid_argument,
             "retain_weights: max_retained must be >= 1, got " + std::to_string(max_retained));
  if (version != st.version || version < 1)
    be::fail(error_code::invalid_argument, "retain_weights: version " + std::to_string(version) +
                                               " is not the engine's current weights version " +
                                               std::to_string(st.version));
  st.max_retained = static_cast<size_t>(max_retained);
  st.retained[version].last_used = ++st.clock;
  std::vector<int64_t> evicted;
  while (st.retained.size() > st.max_retained) {
    auto oldest = st.retained.end();
    for (auto i = st.retained.begin(); i != st.retained.end(); ++i)
      if (i->first != st.version &&
          (oldest == st.retained.end() || i->second.last_used < oldest->second.last_used))
        oldest = i;
    if (oldest == st.retained.end())
      break;
    evicted.push_back(oldest->first);
    st.retained.erase(oldest);
  }
  return caf::make_message(std::move(evicted));
}

caf::expected<caf::message> get_weights(rank_context& ctx, const caf::message&) {
  auto& st = ctx.as<engine_state>();
  auto& model = model_of(st, "get_weights");
  if (st.asleep.count(tag_weights))
    be::fail(error_code::invalid_argument,
             "get_weights: engine is asleep (weights); call wake_up first");
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, p] : model.named_parameters())
    tensors.emplace(name, p.detach());
  auto blobs = to_blobs(tensors);
  if (!blobs)
    return std::move(blobs.error());
  return caf::make_message(std::move(*blobs));
}

actor_kind make_kind() {
  actor_kind k;
  k.name = "engine";
  k.make_state = [](const rank_info&) { return std::make_shared<engine_state>(); };
  k.ops["init_model"] = init_model;
  k.ops["generate"] = generate;
  k.ops["sleep"] = sleep_op;
  k.ops["wake_up"] = wake_up;
  k.ops["memory"] = memory;
  k.ops["pause"] = pause_op;
  k.ops["resume"] = resume;
  k.ops["weight_version"] = weight_version;
  k.ops["set_weights"] = set_weights;
  k.ops["get_weights"] = get_weights;
  k.ops["retain_weights"] = retain_weights;
  k.ops["receive_weights"] = receive_weights;
  return k;
}

} // namespace

void register_engine_kind() {
  register_kind(make_kind());
}

} // namespace rlforge::actors
