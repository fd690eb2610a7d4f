// The engine rank's ops (engine_state.hpp): the model, its configuration, generation, streams,
// sleep and pause, weights, stats.
#include "actors/engine_state.hpp"

#include <c10/core/GradMode.h>
#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_kind.hpp"
#include "actors/backend_seam.hpp"
#include "actors/batch_wire.hpp"
#include "actors/engine.hpp"
#include "actors/engine_requests.hpp"
#include "actors/engine_weights.hpp"
#include "actors/rank_device.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "backends/devices.hpp"
#include "backends/engine/continuous_engine.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/detokenizer.hpp"
#include "backends/model/model_config.hpp"
#include "backends/storage_bytes.hpp"
#include "backends/storage_copier.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"

namespace rlforge::actors::engine_detail {

// -- ops ------------------------------------------------------------------------------------

/// (Re)builds the engine over the current model with the current settings.
void build_engine(engine_state& st) {
  st.engine.reset();
  st.engine = std::make_unique<be::continuous_engine>(*st.model, st.config);
  if (st.asleep.count(tag_kv_cache))
    st.engine->release_cache();
}

/// The tokenizer for stop strings of a model built from `spec`: `tokenizer_dir`'s (refused when
/// it holds none), else `hf_dir`'s when it has one. A tokenizer that does not load (malformed, or
/// a SentencePiece model in this process) leaves the engine serving without stop strings; the
/// reason is kept for the requests that ask for them.
engine_tokenizer load_tokenizer(const model_spec& spec, int32_t rank) {
  engine_tokenizer t;
  const std::string& dir = spec.tokenizer_dir.empty() ? spec.hf_dir : spec.tokenizer_dir;
  if (dir.empty()) {
    t.missing = "a model built from a preset or config_json has none";
    return t;
  }
  if (!be::has_tokenizer(dir)) {
    if (!spec.tokenizer_dir.empty())
      be::fail(error_code::not_found, "init_model: tokenizer_dir '" + dir +
                                          "' holds no tokenizer (neither tokenizer.json nor "
                                          "tokenizer.model)");
    t.missing = "'" + dir + "' has none (neither tokenizer.json nor tokenizer.model)";
    return t;
  }
  try {
    t.tokenizer = be::load_detokenizer(dir);
  } catch (const std::exception& e) {
    t.missing = e.what(); // names the directory and why (backends/model/detokenizer.hpp)
    runtime::logger("actors.engine")
        ->warn("tokenizer_unavailable rank={} dir={} reason={}", rank, dir, e.what());
  }
  return t;
}

caf::expected<int64_t> init_model(rank_context& ctx, engine_state& st,
                                       const model_spec& spec) {
  if (spec.lora_rank != 0)
    be::fail(error_code::invalid_argument,
             "init_model: an engine serves merged weights; lora_rank must be 0, got " +
                 std::to_string(spec.lora_rank));
  const auto dtype = compute_dtype_of(spec);
  auto tokenizer = load_tokenizer(spec, st.rank);
  // An engine only infers: in bf16 it holds its weights in bf16 (half the memory, and weight
  // syncs send half the bytes: weights_for_sync), read from an HF directory straight into bf16.
  const bool hf_only = !spec.hf_dir.empty() && spec.preset.empty() && spec.config_json.empty();
  auto model = dtype == be::compute_dtype::bf16 && hf_only
                   ? be::causal_lm::load_for_inference(spec.hf_dir, dtype)
                   : build_model(spec);
  if (spec.untie_word_embeddings)
    model->untie_word_embeddings();
  if (dtype == be::compute_dtype::bf16)
    model->store_weights_in_bf16();
  model->to(compute_device(ctx.info)); // the rank's CUDA device, or the CPU for a virtual GPU
  model->set_batch_invariant(spec.batch_invariant);
  {
    c10::NoGradGuard no_grad;
    for (auto& [name, p] : model->named_parameters())
      p.requires_grad_(false);
  }
  model->set_training(false);
  be::validate(st.config, model->config());
  fail_everything(ctx, st,
                  make_error(errc::invalid_argument,
                             "init_model replaced the engine's model while the request ran"));
  st.engine.reset();
  st.model = std::move(model);
  st.tokenizer = std::move(tokenizer);
  st.weights.reset(st.model.get());
  st.asleep.clear();
  st.host_weights.clear();
  build_engine(st);
  return st.model->num_parameters();
}

caf::expected<no_values> configure(rank_context& ctx, engine_state& st,
                                      const engine_options& o) {
  auto& model = model_of(st, engine_ops::configure.name);
  be::engine_config c;
  c.kv_cache_bytes = o.kv_cache_bytes;
  c.block_size = o.block_size;
  c.max_num_seqs = o.max_num_seqs;
  c.max_step_tokens = o.max_step_tokens;
  c.prefix_caching = o.prefix_caching;
  const auto busy = st.origins.size() + st.queue.size();
  if (busy > 0)
    be::fail(error_code::invalid_argument,
             "configure: " + std::to_string(busy) +
                 " requests or queued calls are in flight; wait for them (or pause(abort))");
  be::validate(c, model.config());
  st.config = c;
  build_engine(st);
  return no_values{};
}

caf::expected<answered_later<std::vector<sample_output>>>
generate(rank_context& ctx, engine_state& st, const std::vector<sample_request>& requests) {
  model_of(st, engine_ops::generate.name);
  if (st.paused) {
    queued_work q;
    q.ticket = ctx.defer_reply();
    q.requests = requests;
    st.queue.push_back(std::move(q));
    return answered_later<std::vector<sample_output>>{};
  }
  check_awake(st);
  auto converted =
      check_requests(requests, *st.engine, st.weights, st.tokenizer, engine_ops::generate.name);
  start_call(st, ctx.defer_reply(), std::move(converted));
  return answered_later<std::vector<sample_output>>{};
}

caf::expected<int64_t> submit(rank_context& ctx, engine_state& st, const caf::actor& consumer,
                                   const std::vector<int64_t>& ids,
                                   const std::vector<sample_request>& requests,
                                   const int64_t& timeout_ms) {
  model_of(st, engine_ops::submit.name);
  check_submission(st, consumer, ids, requests.size(), timeout_ms);
  check_awake(st);
  auto converted =
      check_requests(requests, *st.engine, st.weights, st.tokenizer, engine_ops::submit.name);
  if (st.paused) {
    st.queue.push_back(queued_work{0, requests, consumer, ids, timeout_ms,
                                   clock_type::now() + std::chrono::milliseconds(timeout_ms)});
  } else {
    start_stream(st, consumer, ids, std::move(converted), timeout_ms,
                 clock_type::now() + std::chrono::milliseconds(timeout_ms));
  }
  return static_cast<int64_t>(requests.size());
}

caf::expected<int64_t> cancel(rank_context& ctx, engine_state& st, const caf::actor& consumer,
                                   const std::vector<int64_t>& ids) {
  model_of(st, engine_ops::cancel.name);
  int64_t n = 0;
  for (auto uid : ids) {
    if (auto i = st.streams.find({consumer, uid}); i != st.streams.end()) {
      stop_request(ctx, st, i->second);
      ++n;
      continue;
    }
    for (auto q = st.queue.begin(); q != st.queue.end(); ++q) {
      auto pos = std::find(q->ids.begin(), q->ids.end(), uid);
      if (q->ticket || q->consumer != consumer || pos == q->ids.end())
        continue;
      const auto i = static_cast<size_t>(pos - q->ids.begin());
      std::vector<sample_output> rows(
          static_cast<size_t>(std::max<int64_t>(1, q->requests[i].num_samples)),
          sample_output{{}, {}, "abort", {}, {}, {}, {}});
      send_result(ctx, st, consumer, uid, std::move(rows), {});
      q->ids.erase(pos);
      q->requests.erase(q->requests.begin() + static_cast<std::ptrdiff_t>(i));
      if (q->ids.empty())
        st.queue.erase(q);
      ++n;
      break;
    }
  }
  return n;
}

caf::expected<no_values> sleep_op(rank_context& ctx, engine_state& st,
                                     const std::vector<std::string>& tags) {
  auto& model = model_of(st, engine_ops::sleep.name);
  for (auto& tag : parse_tags(tags, engine_ops::sleep.name)) {
    if (st.asleep.count(tag))
      continue;
    if (tag == tag_weights) {
      // Move each storage out of the model: the saved tensor keeps it alive, the model's
      // tensor is emptied in place (tied weights stay tied through shared storage). On a
      // virtual GPU that is no copy; from a CUDA device the storages go to pinned host memory.
      c10::NoGradGuard no_grad;
      std::map<std::string, at::Tensor> saved;
      auto params = model.named_parameters();
      be::storage_copier to_host{at::kCPU};
      for (auto& [name, p] : params)
        saved.emplace(name, p.is_cuda() ? to_host(p) : p.detach());
      for (auto& [name, p] : params)
        p.set_();
      st.host_weights = std::move(saved);
    } else {
      // Running requests lose their keys/values and recompute them after wake_up.
      st.engine->release_cache();
    }
    st.asleep.insert(tag);
  }
  // A CUDA device's freed blocks return to the driver for the role that runs next.
  be::release_cached_memory();
  (void)ctx;
  return no_values{};
}

caf::expected<no_values> wake_up(rank_context& ctx, engine_state& st,
                                    const std::vector<std::string>& tags) {
  auto& model = model_of(st, engine_ops::wake_up.name);
  for (auto& tag : parse_tags(tags, engine_ops::wake_up.name)) {
    if (!st.asleep.count(tag))
      continue;
    if (tag == tag_weights) {
      c10::NoGradGuard no_grad;
      const auto device = compute_device(ctx.info);
      be::storage_copier to_device{device};
      for (auto& [name, p] : model.named_parameters()) {
        auto i = st.host_weights.find(name);
        if (i == st.host_weights.end())
          be::fail(error_code::internal, "wake_up: no saved storage for parameter '" + name + "'");
        p.set_(device.is_cpu() ? i->second : to_device(i->second));
      }
      st.host_weights.clear();
    } else {
      st.engine->restore_cache();
    }
    st.asleep.erase(tag);
  }
  (void)ctx;
  return no_values{};
}

caf::expected<std::tuple<int64_t, int64_t>> memory(rank_context&, engine_state& st) {
  auto& model = model_of(st, engine_ops::memory.name);
  auto resident = be::storage_bytes(model.named_parameters()) + st.weights.bytes() +
                  st.engine->cache_bytes();
  auto host = be::storage_bytes(st.host_weights);
  return std::make_tuple(resident, host);
}

caf::expected<int64_t> pause_op(rank_context& ctx, engine_state& st,
                                     const std::optional<std::string>& given) {
  model_of(st, engine_ops::pause.name);
  const std::string mode = given.value_or("keep");
  if (mode != "keep" && mode != "abort")
    be::fail(error_code::invalid_argument,
             "pause: unknown mode '" + mode + "' (modes: keep, abort)");
  st.paused = true;
  return mode == "abort" ? abort_everything(ctx, st) : int64_t{0};
}

caf::expected<int64_t> resume(rank_context& ctx, engine_state& st) {
  model_of(st, engine_ops::resume.name);
  st.paused = false;
  return release_queue(ctx, st);
}

caf::expected<int64_t> weight_version(rank_context&, engine_state& st) {
  model_of(st, engine_ops::weight_version.name);
  return st.weights.current();
}

/// Before the live weights change: copies of the current version for who still needs it.
void before_new_weights(engine_state& st) {
  st.weights.before_change([&](int64_t v) { return version_in_use(st, v); });
}

/// After the live weights changed to `version`.
void after_new_weights(engine_state& st, int64_t version) {
  st.weights.set_current(version);
  st.engine->weights_changed();
}

caf::expected<no_values> set_weights(rank_context& ctx, engine_state& st,
                                        const tensor_map& weights, const int64_t& version) {
  auto& model = model_of(st, engine_ops::set_weights.name);
  if (version < 0)
    be::fail(error_code::invalid_argument,
             "set_weights: version must be >= 0, got " + std::to_string(version));
  if (st.asleep.count(tag_weights))
    be::fail(error_code::invalid_argument,
             "set_weights: engine is asleep (weights); call wake_up first");
  auto tensors = from_blobs(weights);
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
  before_new_weights(st);
  c10::NoGradGuard no_grad;
  for (auto& [name, p] : params)
    p.copy_(tensors->at(name));
  // Written in place: a Gloo channel's receiving buffer no longer holds what its sender sent.
  st.channels.forget_bases();
  after_new_weights(st, version);
  return no_values{};
}

caf::expected<int64_t> receive_weights(rank_context& ctx, engine_state& st,
                                            const weight_sync_spec& spec) {
  auto& model = model_of(st, engine_ops::receive_weights.name);
  if (st.asleep.count(tag_weights))
    be::fail(error_code::invalid_argument,
             "receive_weights: engine is asleep (weights); call wake_up first");
  bool torn = false;
  before_new_weights(st);
  try {
    after_new_weights(st, receive_model_weights(model, st.weights.current(),
                                                spec, torn,
                                                st.channels));
  } catch (...) {
    // A refused transfer changed nothing. One that broke after the copy began left a mix of
    // two versions: no coherent version is held until the next complete transfer.
    if (torn)
      after_new_weights(st, 0);
    throw;
  }
  return st.weights.current();
}

caf::expected<std::vector<int64_t>> retain_weights(rank_context&, engine_state& st, const int64_t& version,
                                           const int64_t& max_retained) {
  model_of(st, engine_ops::retain_weights.name);
  return st.weights.retain(version, max_retained);
}

caf::expected<tensor_map> get_weights(rank_context&, engine_state& st) {
  auto& model = model_of(st, engine_ops::get_weights.name);
  if (st.asleep.count(tag_weights))
    be::fail(error_code::invalid_argument,
             "get_weights: engine is asleep (weights); call wake_up first");
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, p] : model.named_parameters())
    tensors.emplace(name, p.detach());
  auto blobs = to_blobs(tensors);
  if (!blobs)
    return std::move(blobs.error());
  return std::move(*blobs);
}

caf::expected<std::string> stats(rank_context&, engine_state& st) {
  model_of(st, engine_ops::stats.name);
  const auto s = st.engine->stats();
  const auto& c = s.counters;
  nlohmann::json j{
      {"num_blocks", s.num_blocks},
      {"free_blocks", s.free_blocks},
      {"cached_blocks", s.cached_blocks},
      {"block_size", s.block_size},
      {"kv_cache_bytes", st.engine->cache_bytes()},
      {"running", s.running},
      {"waiting", s.waiting},
      {"queued_calls", st.queue.size()},
      {"paused", st.paused},
      {"weight_version", st.weights.current()},
      {"prompt_tokens", c.prompt_tokens},
      {"recompute_tokens", c.recompute_tokens},
      {"decode_tokens", c.decode_tokens},
      {"generated_tokens", s.generated_tokens},
      {"in_flight_tokens", s.in_flight_tokens},
      {"busy_seconds", st.busy_seconds},
      {"prefix_query_tokens", c.prefix_query_tokens},
      {"prefix_hit_tokens", c.prefix_hit_tokens},
      {"prefix_hit_rate", s.prefix_hit_rate()},
      {"preemptions", c.preemptions},
      {"copies", c.copies},
      {"steps", c.steps},
  };
  return j.dump();
}

} // namespace rlforge::actors::engine_detail
