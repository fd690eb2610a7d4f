// A worker rank's checkpoints and residency (worker_state.hpp): save, load, save_hf_model,
// offload, onload, memory.
#include "actors/worker_state.hpp"

#include <c10/core/GradMode.h>
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_kind.hpp"
#include "actors/base_weights.hpp"
#include "actors/batch_wire.hpp"
#include "actors/rank_device.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "backends/algo/kl.hpp"
#include "backends/algo/losses.hpp"
#include "backends/collective_group.hpp"
#include "backends/devices.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "backends/storage_bytes.hpp"
#include "backends/storage_copier.hpp"
#include "backends/train/checkpoint.hpp"
#include "backends/train/lr_schedule.hpp"
#include "backends/train/micro_batches.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/rng_state.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors::worker_detail {

/// Where a save/load_checkpoint call points: the role's directory is the worker's own unless
/// the call names one.
be::checkpoint_location location_of(const rank_context& ctx, const worker_state& st,
                                    const std::string& root, int64_t global_step,
                                    const std::optional<std::string>& role) {
  return be::checkpoint_location{root, global_step, role.value_or(st.role), ctx.info.rank,
                                 ctx.info.world_size};
}

caf::expected<no_values> save_checkpoint(rank_context& ctx, worker_state& st,
                                            const std::string& root, const int64_t& global_step,
                                            const std::optional<std::string>& role) {
  auto where = location_of(ctx, st, root, global_step, role);
  auto& model = resident_model(st, worker_ops::save_checkpoint.name);
  require_resident_optimizer(st, worker_ops::save_checkpoint.name);
  where.validate();
  be::save_rank_state(where, model.named_parameters(), st.optimizer, &*st.schedule,
                      be::capture_rng_state());
  return no_values{};
}

caf::expected<int64_t> load_checkpoint(rank_context& ctx, worker_state& st,
                                            const std::string& root, const int64_t& global_step,
                                            const std::optional<std::string>& role,
                                            const std::optional<bool>& restore_optimizer) {
  auto where = location_of(ctx, st, root, global_step, role);
  const bool with_optimizer = restore_optimizer.value_or(true);
  auto& model = resident_model(st, worker_ops::load_checkpoint.name);
  if (with_optimizer)
    require_resident_optimizer(st, worker_ops::load_checkpoint.name);
  if (where.global_step < 0) {
    auto latest = be::latest_step(where.root);
    if (!latest)
      be::fail(error_code::not_found,
               "no committed checkpoint in '" + where.root + "' (no latest_global_step.txt)");
    where.global_step = *latest;
  }
  where.validate();
  auto step = where.global_step;
  // Restore into copies first: a refused checkpoint leaves the live state untouched.
  auto schedule = *st.schedule;
  be::adamw optimizer;
  auto loaded = be::load_rank_state(where);
  if (!with_optimizer) {
    // Weights only: the optimizer starts fresh (its moments belonged to other weights); the
    // schedule and the RNG stay as they are.
    be::load_parameters(model.named_parameters(), loaded.model);
    if (st.optimizer_offloaded) {
      st.optimizer_offloaded = false;
      st.host_optimizer = be::adamw_state{};
    }
    st.optimizer = be::adamw{};
    be::zero_grad(model.named_parameters());
    return step;
  }
  optimizer.load_state(loaded.optimizer);
  if (!loaded.scheduler)
    be::fail(error_code::decode_error,
             "checkpoint '" + be::rank_directory(where) + "' has no learning-rate schedule");
  schedule = *loaded.scheduler;
  be::load_parameters(model.named_parameters(), loaded.model);
  be::restore_rng_state(loaded.rng);
  st.optimizer = std::move(optimizer);
  st.schedule = std::move(schedule);
  be::zero_grad(model.named_parameters());
  return step;
}

caf::expected<no_values> save_hf_model(rank_context& ctx, worker_state& st,
                                          const std::string& dir) {
  auto& model = resident_model(st, worker_ops::save_hf_model.name);
  if (dir.empty())
    be::fail(error_code::invalid_argument, "save_hf_model: empty directory");
  if (ctx.info.rank == 0)
    model.save_hf(dir);
  return no_values{};
}

/// Moves parameters and accumulated gradients into host buffers, then frees the device side.
void offload_model(worker_state& st) {
  c10::NoGradGuard no_grad;
  auto params = st.model->named_parameters();
  at::Device device = params.empty() ? at::Device{at::kCPU} : params.front().second.device();
  // Copy everything first: if a copy fails, the model is untouched.
  storage_copier to_host{at::kCPU};
  std::map<std::string, at::Tensor> host_params, host_grads;
  for (auto& [name, p] : params) {
    host_params.emplace(name, to_host(p));
    if (p.grad().defined())
      host_grads.emplace(name, to_host(p.grad()));
  }
  // The model's tensors keep their identity (the optimizer and LoRA hold them) but no storage.
  for (auto& [name, p] : params) {
    if (p.grad().defined())
      p.mutable_grad() = at::Tensor{};
    p.set_();
  }
  // Nothing of the model stays on the device: its bf16 copies go too.
  st.model->drop_compute_copies();
  st.host_params = std::move(host_params);
  st.host_grads = std::move(host_grads);
  st.model_device = device;
  st.model_offloaded = true;
}

void onload_model(worker_state& st) {
  c10::NoGradGuard no_grad;
  auto params = st.model->named_parameters();
  storage_copier to_device{st.model_device};
  std::vector<std::pair<at::Tensor, at::Tensor>> back; // (parameter, gradient or undefined)
  back.reserve(params.size());
  for (auto& [name, p] : params) {
    auto i = st.host_params.find(name);
    if (i == st.host_params.end())
      be::fail(error_code::internal, "onload: no host copy of parameter '" + name + "'");
    auto g = st.host_grads.find(name);
    back.emplace_back(to_device(i->second),
                      g == st.host_grads.end() ? at::Tensor{} : to_device(g->second));
  }
  for (size_t k = 0; k < params.size(); ++k) {
    auto& p = params[k].second;
    p.set_(back[k].first);
    if (back[k].second.defined())
      p.mutable_grad() = back[k].second;
  }
  st.host_params.clear();
  st.host_grads.clear();
  st.model_offloaded = false;
}

/// Moves the AdamW moments into host memory; the live optimizer is left empty.
void offload_optimizer(worker_state& st) {
  auto state = st.optimizer.take_state();
  be::adamw_state host;
  at::Device device = st.model_device;
  try {
    storage_copier to_host{at::kCPU};
    host.last_params = state.last_params;
    for (const auto& [name, ps] : state.params) {
      device = ps.exp_avg.device();
      host.params[name] =
          be::adamw_param_state{to_host(ps.exp_avg), to_host(ps.exp_avg_sq), ps.step};
    }
  } catch (...) {
    st.optimizer.put_state(std::move(state));
    throw;
  }
  st.host_optimizer = std::move(host);
  st.optimizer_device = device;
  st.optimizer_offloaded = true;
}

void onload_optimizer(worker_state& st) {
  storage_copier to_device{st.optimizer_device};
  be::adamw_state state;
  state.last_params = st.host_optimizer.last_params;
  for (const auto& [name, ps] : st.host_optimizer.params)
    state.params[name] =
        be::adamw_param_state{to_device(ps.exp_avg), to_device(ps.exp_avg_sq), ps.step};
  st.optimizer.put_state(std::move(state));
  st.host_optimizer = be::adamw_state{};
  st.optimizer_offloaded = false;
}

caf::expected<no_values> offload(rank_context&, worker_state& st,
                                    const std::vector<std::string>& tags) {
  model_of(st, worker_ops::offload.name);
  for (const auto& tag : parse_tags(st, tags, worker_ops::offload.name)) {
    if (tag == tag_model && !st.model_offloaded)
      offload_model(st);
    else if (tag == tag_optimizer && !st.optimizer_offloaded)
      offload_optimizer(st);
  }
  // A CUDA device's freed blocks return to the driver for the role that runs next: once every
  // tag's tensors are gone (the allocator frees only whole segments, which tensors of the model
  // and of the optimizer may share).
  be::release_cached_memory();
  return no_values{};
}

caf::expected<no_values> onload(rank_context&, worker_state& st,
                                   const std::vector<std::string>& tags) {
  model_of(st, worker_ops::onload.name);
  for (const auto& tag : parse_tags(st, tags, worker_ops::onload.name)) {
    if (tag == tag_model && st.model_offloaded)
      onload_model(st);
    else if (tag == tag_optimizer && st.optimizer_offloaded)
      onload_optimizer(st);
  }
  return no_values{};
}

caf::expected<std::tuple<int64_t, int64_t>> memory(rank_context&, worker_state& st) {
  auto& model = model_of(st, worker_ops::memory.name);
  auto params = model.named_parameters();
  std::vector<std::pair<std::string, at::Tensor>> grads, moments;
  for (auto& [name, p] : params) {
    if (p.grad().defined())
      grads.emplace_back(name, p.grad());
    if (const auto* ps = st.optimizer.state_of(name)) {
      moments.emplace_back(name, ps->exp_avg);
      moments.emplace_back(name, ps->exp_avg_sq);
    }
  }
  std::unordered_set<const void*> seen;
  int64_t resident =
      storage_bytes(params, seen) + storage_bytes(grads, seen) + storage_bytes(moments, seen);
  std::unordered_set<const void*> seen_host;
  int64_t host = storage_bytes(st.host_params, seen_host) +
                 storage_bytes(st.host_grads, seen_host) +
                 storage_bytes(moments_of(st.host_optimizer), seen_host);
  return std::make_tuple(resident, host);
}

} // namespace rlforge::actors::worker_detail
