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
#include "backends/storage_bytes.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors {

namespace {

namespace be = rlforge::backends;
using be::error_code;

const char* const tag_weights = "weights";
const char* const tag_kv_cache = "kv_cache";

/// One engine rank: its model copy, weight version, sleep and pause state.
struct engine_state {
  std::unique_ptr<be::causal_lm> model;
  int64_t version = 0;
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
    be::fail(error_code::invalid_argument, std::string{op} + " expects (" + signature
                                             + "), got " + caf::to_string(args));
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
      be::fail(error_code::invalid_argument, std::string{op} + ": unknown tag '" + t
                                               + "' (tags: weights, kv_cache)");
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
               where + "prompt of " + std::to_string(r.prompt.size())
                 + " tokens leaves no room in the model's context of "
                 + std::to_string(cfg.max_position_embeddings) + " tokens");
    for (size_t j = 0; j < r.prompt.size(); ++j)
      if (r.prompt[j] < 0 || r.prompt[j] >= cfg.vocab_size)
        be::fail(error_code::out_of_range,
                 where + "prompt token " + std::to_string(j) + " has id "
                   + std::to_string(r.prompt[j]) + ", outside the vocabulary [0, "
                   + std::to_string(cfg.vocab_size) + ")");
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
    for (int64_t j = 0; j < r.num_samples; ++j) {
      auto row = p;
      if (r.has_seed)
        row.seed = r.seed + static_cast<uint64_t>(j);
      prompts.push_back(r.prompt);
      params.push_back(std::move(row));
    }
  }
}

caf::message run_generate(engine_state& st, const std::vector<sample_request>& requests) {
  auto& model = model_of(st, "generate");
  check_awake(st);
  std::vector<std::vector<int64_t>> prompts;
  std::vector<be::sampling_params> params;
  expand_requests(model, requests, prompts, params);
  model.set_training(false);
  auto results = be::generate(model, prompts, params);
  std::vector<sample_output> out;
  out.reserve(results.size());
  for (auto& r : results)
    out.push_back({std::move(r.tokens), std::move(r.logprobs), std::move(r.stop_reason),
                   std::move(r.prompt_logprobs)});
  return caf::make_message(std::move(out));
}

// -- ops --------------------------------------------------------------------------------------

caf::expected<caf::message> init_model(rank_context& ctx, const caf::message& args) {
  expect_args<model_spec>(args, "init_model", "model_spec");
  auto& st = ctx.as<engine_state>();
  const auto& spec = args.get_as<model_spec>(0);
  if (spec.lora_rank != 0)
    be::fail(error_code::invalid_argument,
             "init_model: an engine serves merged weights; lora_rank must be 0, got "
               + std::to_string(spec.lora_rank));
  auto model = build_model(spec);
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : model->named_parameters())
      p.requires_grad_(false);
  }
  model->set_training(false);
  st.model = std::move(model);
  st.version = 0;
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
      be::fail(error_code::invalid_argument,
               "set_weights: parameter '" + name + "' has shape " + c10::str(t.sizes())
                 + ", the model's is " + c10::str(p.sizes()));
    if (t.scalar_type() != p.scalar_type())
      be::fail(error_code::invalid_argument,
               "set_weights: parameter '" + name + "' has dtype "
                 + std::string{c10::toString(t.scalar_type())} + ", the model's is "
                 + std::string{c10::toString(p.scalar_type())});
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
  k.ops["receive_weights"] = receive_weights;
  return k;
}

} // namespace

void register_engine_kind() {
  register_kind(make_kind());
}

} // namespace rlforge::actors
