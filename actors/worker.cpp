#include "actors/worker.hpp"
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
#include "backends/algo/kl.hpp"
#include "backends/algo/losses.hpp"
#include "backends/collective_group.hpp"
#include "backends/devices.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "backends/storage_bytes.hpp"
#include "backends/train/checkpoint.hpp"
#include "backends/train/lr_schedule.hpp"
#include "backends/train/optimizer.hpp"
#include "runtime/logging.hpp"
#include "backends/train/rng_state.hpp"
#include "backends/train/micro_batches.hpp"
#include "backends/storage_copier.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors {

namespace worker_detail {

bool is_trainable(const worker_state& st) {
  return st.role != "ref";
}

/// The moments of an optimizer state as (name, tensor) pairs, for `storage_bytes`.
std::vector<std::pair<std::string, at::Tensor>> moments_of(const be::adamw_state& s) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, ps] : s.params) {
    out.emplace_back(name, ps.exp_avg);
    out.emplace_back(name, ps.exp_avg_sq);
  }
  return out;
}

/// The tags an offload/onload call names: all of the kind's when empty. Throws before anything
/// moves for an unknown tag or `optimizer` on a ref worker.
std::vector<std::string> parse_tags(const worker_state& st, const std::vector<std::string>& tags,
                                    const char* op) {
  if (tags.empty()) {
    if (is_trainable(st))
      return {tag_model, tag_optimizer};
    return {tag_model};
  }
  for (const auto& t : tags) {
    if (t == tag_optimizer && !is_trainable(st))
      be::fail(error_code::invalid_argument,
               std::string{op} + ": a " + st.role +
                   " worker has no optimizer; its only tag is 'model'");
    if (t != tag_model && t != tag_optimizer)
      be::fail(error_code::invalid_argument,
               std::string{op} + ": unknown tag '" + t +
                   "' (tags: " + (is_trainable(st) ? "model, optimizer" : "model") + ")");
  }
  return tags;
}

be::causal_lm& model_of(worker_state& st, const char* op) {
  if (!st.model)
    be::fail(error_code::invalid_argument,
             std::string{op} + " before init_model: the " + st.role + " worker has no model yet");
  return *st.model;
}

/// The model, refusing `op` while it is offloaded (its parameters hold no storage then).
be::causal_lm& resident_model(worker_state& st, const char* op) {
  auto& model = model_of(st, op);
  if (st.model_offloaded)
    be::fail(error_code::invalid_argument,
             st.role + " worker: " + op +
                 " needs the model on the device but it is offloaded; call onload (the "
                 "dispatcher does this for you)");
  return model;
}

/// Refuses `op` while the optimizer state is offloaded.
void require_resident_optimizer(const worker_state& st, const char* op) {
  if (st.optimizer_offloaded)
    be::fail(error_code::invalid_argument,
             st.role + " worker: " + op +
                 " needs the optimizer state on the device but it is offloaded; call onload (the "
                 "dispatcher does this for you)");
}

/// The trainable parameters (those that take gradients), in the model's stable order.
be::named_parameters trainable_parameters(const be::causal_lm& m) {
  be::named_parameters out;
  for (auto& [name, p] : m.named_parameters())
    if (p.requires_grad())
      out.emplace_back(name, p);
  return out;
}

// -- ops --------------------------------------------------------------------------------------

caf::expected<int64_t> init_model(rank_context& ctx, worker_state& st,
                                       const model_spec& spec) {
  const auto dtype = compute_dtype_of(spec); // refused before anything is built
  auto model = build_model(spec);
  model->to(compute_device(ctx.info)); // the rank's CUDA device, or the CPU for a virtual GPU
  model->set_compute_dtype(dtype);
  model->set_batch_invariant(spec.batch_invariant);
  if (spec.lora_rank < 0)
    be::fail(error_code::invalid_argument,
             "init_model: lora_rank must be >= 0, got " + std::to_string(spec.lora_rank));
  if (spec.lora_rank > 0) {
    be::lora_config lora;
    lora.rank = spec.lora_rank;
    lora.alpha = spec.lora_alpha;
    lora.dropout = spec.lora_dropout;
    if (!spec.lora_target_modules.empty())
      lora.target_modules = spec.lora_target_modules;
    lora.validate();
    model->enable_lora(lora, spec.seed + 1);
  }
  if (st.role == "critic" && !model->has_value_head())
    model->add_value_head(spec.seed + 2);
  std::optional<be::lr_schedule> schedule;
  if (is_trainable(st)) {
    be::lr_schedule_config sc;
    sc.kind = be::parse_lr_schedule_kind(spec.lr_schedule);
    sc.base_lr = spec.learning_rate;
    sc.warmup_steps = spec.warmup_steps;
    sc.total_steps = spec.total_steps;
    sc.min_lr_ratio = spec.min_lr_ratio;
    schedule.emplace(sc);
  }
  if (ctx.collective && ctx.collective->world_size() > 1) {
    // Same seed gives the same weights; the broadcast makes it a guarantee (HF loads too).
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> tensors;
    for (auto& [name, p] : model->named_parameters())
      tensors.push_back(p.detach());
    ctx.collective->broadcast(tensors, 0);
  }
  // After the broadcast, which writes into the parameters: shared tensors are never written.
  std::shared_ptr<const void> shared_base;
  if (spec.lora_rank > 0 && !spec.hf_dir.empty())
    shared_base = share_frozen_base(*model, spec.hf_dir);
  st.model = std::move(model);
  st.shared_base = std::move(shared_base);
  st.optimizer.reset();
  st.schedule = std::move(schedule);
  st.model_offloaded = false;
  st.host_params.clear();
  st.host_grads.clear();
  st.optimizer_offloaded = false;
  st.host_optimizer = be::adamw_state{};
  return st.model->num_parameters();
}

caf::expected<optim_result> optim_step(rank_context& ctx, worker_state& st,
                                       const be::adam_params& given) {
  auto& model = resident_model(st, worker_ops::optim_step.name);
  require_resident_optimizer(st, worker_ops::optim_step.name);
  be::adam_params hp = given;
  if (std::isnan(hp.learning_rate))
    be::fail(error_code::invalid_argument, "optim_step: learning_rate is NaN");
  if (hp.learning_rate < 0)
    hp.learning_rate = st.schedule->lr();
  be::validate(hp); // the same on every rank: nobody enters the all-reduce when it throws
  auto params = trainable_parameters(model);
  if (ctx.collective && ctx.collective->world_size() > 1) {
    // Gradient SUM over data-parallel ranks (losses are sums, so the sum of the shards'
    // gradients is the gradient of the whole batch). Every rank sends the same list.
    std::vector<at::Tensor> grads;
    grads.reserve(params.size());
    for (auto& [name, p] : params) {
      if (!p.grad().defined())
        p.mutable_grad() = at::zeros_like(p);
      grads.push_back(p.grad());
    }
    ctx.collective->all_reduce_sum(grads);
  }
  auto res = st.optimizer.step(params, hp);
  be::zero_grad(model.named_parameters());
  if (!res.skipped)
    st.schedule->advance();
  optim_result out;
  out.grad_norm = res.grad_norm;
  out.skipped = res.skipped;
  out.clipped = res.clipped;
  out.learning_rate = hp.learning_rate;
  out.step = st.schedule->step();
  if (ctx.info.rank == 0) // one line per step of the group
    runtime::logger("actors.worker")
        ->info("event=optim_step group={} step={} grad_norm={:.6g} lr={:.6g} skipped={} "
               "clipped={}",
               ctx.info.group, out.step, out.grad_norm, out.learning_rate, out.skipped,
               out.clipped);
  return out;
}

caf::expected<no_values> set_lr(rank_context&, worker_state& st, const double& lr) {
  model_of(st, worker_ops::set_lr.name);
  if (!std::isfinite(lr) || lr < 0)
    be::fail(error_code::invalid_argument,
             "set_lr: learning rate must be finite and >= 0, got " + std::to_string(lr));
  auto j = st.schedule->to_json();
  j["base_lr"] = lr;
  st.schedule = be::lr_schedule::from_json(j);
  return no_values{};
}

caf::expected<no_values> set_algorithm_config(rank_context&, worker_state& st,
                                                 const algorithm_config& a) {
  auto bad = [](const std::string& what) { be::fail(error_code::invalid_argument, what); };
  if (a.micro_batch_size < 0)
    bad("micro_batch_size must be >= 0, got " + std::to_string(a.micro_batch_size));
  if (a.max_tokens_per_micro_batch < 0)
    bad("max_tokens_per_micro_batch must be >= 0, got " +
        std::to_string(a.max_tokens_per_micro_batch));
  if (!std::isfinite(a.temperature) || a.temperature <= 0)
    bad("temperature must be finite and > 0, got " + std::to_string(a.temperature));
  if (a.logprob_chunk_size < 1)
    bad("logprob_chunk_size must be >= 1, got " + std::to_string(a.logprob_chunk_size));
  const auto& kls = algo::kl_estimator_names();
  if (std::find(kls.begin(), kls.end(), a.kl_estimator) == kls.end())
    bad("unknown kl_estimator '" + a.kl_estimator + "' (k1, k2, k3, abs)");
  if (!std::isfinite(a.kl_loss_coef) || a.kl_loss_coef < 0)
    bad("kl_loss_coef must be finite and >= 0, got " + std::to_string(a.kl_loss_coef));
  if (!std::isfinite(a.entropy_loss_coef) || a.entropy_loss_coef < 0)
    bad("entropy_loss_coef must be finite and >= 0, got " + std::to_string(a.entropy_loss_coef));
  st.algo = a;
  return no_values{};
}

namespace {

actor_kind make_kind(const std::string& role) {
  actor_kind k;
  k.name = role;
  k.make_state = [role](const rank_info&) {
    auto st = std::make_unique<worker_state>();
    st->role = role;
    return st;
  };
  namespace ops = worker_ops;
  if (role == "ref")
    k.implements<reference_interface>();
  else
    k.implements<trainer_interface>();
  k.add(typed_op(ops::init_model, init_model)
            .dispatched(op_dispatch::moves(op_residency::everything_on)));
  const auto model_only = op_dispatch::needs(true, false);
  const auto model_and_optimizer = op_dispatch::needs(true, true);
  k.add(typed_op(ops::forward, forward)
            .dispatched(op_dispatch::needs(true, false, op_route::split_batch)));
  k.add(typed_op(ops::tinker_forward, tinker_forward)
            .dispatched(op_dispatch::needs(true, false, op_route::split_datums)));
  k.add(typed_op(ops::set_algorithm_config, set_algorithm_config));
  k.add(typed_op(ops::save_hf_model, save_hf_model, {"dir"}).dispatched(model_only));
  k.add(typed_op(ops::offload, offload, {"tags"})
            .dispatched(op_dispatch::moves(op_residency::tagged_off, "model", "optimizer")));
  k.add(typed_op(ops::onload, onload, {"tags"})
            .dispatched(op_dispatch::moves(op_residency::tagged_on, "model", "optimizer")));
  k.add(typed_op(ops::memory, memory));
  k.add(context_op(ops::send_weights, send_weights_op)); // weight_sync.hpp
  if (role != "ref") {
    k.add(typed_op(ops::forward_backward, forward_backward)
              .dispatched(op_dispatch::needs(true, true, op_route::split_batch)));
    k.add(typed_op(ops::tinker_forward_backward, tinker_forward_backward)
              .dispatched(op_dispatch::needs(true, true, op_route::split_datums)));
    k.add(typed_op(ops::optim_step, optim_step));
    k.add(typed_op(ops::set_lr, set_lr));
    k.add(typed_op(ops::save_checkpoint, save_checkpoint, {"root", "global_step", "role"})
              .dispatched(model_and_optimizer));
    k.add(typed_op(ops::load_checkpoint, load_checkpoint,
                   {"root", "global_step", "role", "with_optimizer"})
              .dispatched(model_and_optimizer));
  }
  return k;
}

} // namespace

} // namespace worker_detail

using namespace worker_detail;

const be::causal_lm& worker_model(rank_context& ctx, const char* op) {
  return resident_model(state_as<worker_state>(ctx), op);
}

weight_channels& worker_weight_channels(rank_context& ctx) {
  return state_as<worker_state>(ctx).channels;
}

const std::vector<std::string>& worker_kind_names() {
  static const std::vector<std::string> names{"policy", "critic", "ref"};
  return names;
}

void register_worker_kinds() {
  for (const auto& role : worker_kind_names())
    register_kind(make_kind(role));
}

be::compute_dtype compute_dtype_of(const model_spec& spec) {
  if (spec.compute_dtype.empty())
    return be::default_compute_dtype();
  try {
    return be::parse_compute_dtype(spec.compute_dtype);
  } catch (const be::error& e) {
    be::fail(error_code::invalid_argument, std::string("init_model: ") + e.what());
  }
}

std::unique_ptr<be::causal_lm> build_model(const model_spec& spec) {
  int sources = !spec.hf_dir.empty() + !spec.preset.empty() + !spec.config_json.empty();
  if (sources != 1)
    be::fail(error_code::invalid_argument,
             "init_model: set exactly one of hf_dir, preset and config_json (got " +
                 std::to_string(sources) + ")");
  if (!spec.hf_dir.empty())
    return be::causal_lm::load(spec.hf_dir);
  be::model_config config;
  if (!spec.preset.empty()) {
    config = be::preset(spec.preset);
  } else {
    auto j = nlohmann::json::parse(spec.config_json, nullptr, false);
    if (j.is_discarded())
      be::fail(error_code::invalid_argument, "init_model: config_json is not valid JSON");
    config = be::parse_model_config(j);
  }
  return be::causal_lm::random(config, spec.seed);
}

} // namespace rlforge::actors
