#include "actors/trainer_client.hpp"

#include <filesystem>

#include <cmath>
#include <limits>
#include <utility>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/backend_seam.hpp"
#include "actors/batch_wire.hpp"
#include "actors/dispatcher.hpp"
#include "actors/engine.hpp"
#include "actors/rank_actor.hpp"
#include "actors/worker.hpp"
#include "backends/train/checkpoint.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors {

double train_output::metric(const std::string& name) const {
  auto i = metrics.find(name);
  return i == metrics.end() ? std::numeric_limits<double>::quiet_NaN() : i->second;
}

trainer_client::trainer_client(caf::actor_system& sys, caf::actor dispatcher,
                               std::chrono::milliseconds timeout)
    : sys_(&sys), dispatcher_(std::move(dispatcher)), timeout_(timeout) {
  if (timeout_.count() <= 0)
    timeout_ = std::chrono::seconds(600);
}

namespace {

caf::expected<void> as_void(caf::expected<no_values> m) {
  if (!m)
    return std::move(m.error());
  return caf::unit;
}

} // namespace

caf::expected<caf::message> trainer_client::call(const std::string& role, caf::atom_value op,
                                                 caf::message args) {
  if (!dispatcher_)
    return make_error(errc::invalid_argument, "trainer_client: no dispatcher");
  caf::scoped_actor self{*sys_};
  caf::expected<caf::message> out{caf::message{}};
  // The groups bound every rank by timeout_; the outer deadline adds routing slack.
  self->request(dispatcher_, timeout_ + std::chrono::seconds(5), dispatcher_call_atom::value, role,
                op, std::move(args), static_cast<int64_t>(timeout_.count()))
      .receive([&](op_result& r) { out = std::move(r.value); },
               [&](caf::error& e) {
                 if (e == caf::sec::request_timeout)
                   out = make_error(errc::timeout, "dispatcher role '" + role + "' op '" +
                                                       op_name(op) +
                                                       "': no answer from the dispatcher");
                 else
                   out = std::move(e);
               });
  return out;
}

caf::expected<int32_t> trainer_client::register_group(const std::string& role,
                                                      const actor_group& group) {
  caf::scoped_actor self{*sys_};
  caf::expected<int32_t> out{caf::error{}};
  self->request(dispatcher_, std::chrono::seconds(60), dispatcher_register_atom::value, role,
                group.handle())
      .receive([&](int32_t n) { out = n; }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<int64_t> trainer_client::init_model(const std::string& role, const model_spec& spec) {
  return call(role, worker_ops::init_model, spec);
}

namespace {

/// A batch_result's blobs as tensors.
caf::expected<train_output> train_output_of(caf::expected<batch_result> r) {
  if (!r)
    return std::move(r.error());
  auto outputs = from_blobs(r->outputs);
  if (!outputs)
    return std::move(outputs.error());
  return train_output{std::move(*outputs), std::move(r->metrics), r->tokens};
}

} // namespace

caf::expected<train_output> trainer_client::forward(const std::string& role,
                                                    const backends::training_batch& batch) {
  auto p = to_payload(batch);
  if (!p)
    return std::move(p.error());
  return train_output_of(call(role, worker_ops::forward, std::move(*p)));
}

caf::expected<train_output> trainer_client::forward(const std::string& role, batch_payload batch,
                                                    const loss_request& loss) {
  return train_output_of(call(role, worker_ops::forward, std::move(batch), loss));
}

caf::expected<train_output>
trainer_client::forward_backward(const std::string& role, const backends::training_batch& batch,
                                 const std::string& loss_fn,
                                 const backends::algo::loss_config& config) {
  auto p = to_payload(batch);
  if (!p)
    return std::move(p.error());
  return forward_backward(role, std::move(*p),
                          loss_request{loss_fn, config.values, config.options});
}

caf::expected<train_output> trainer_client::forward_backward(const std::string& role,
                                                             batch_payload batch,
                                                             const loss_request& loss) {
  return train_output_of(call(role, worker_ops::forward_backward, std::move(batch), loss));
}

caf::expected<optim_result> trainer_client::optim_step(const std::string& role,
                                                       const backends::adam_params& params) {
  return call(role, worker_ops::optim_step, params);
}

caf::expected<void> trainer_client::set_lr(const std::string& role, double lr) {
  return as_void(call(role, worker_ops::set_lr, lr));
}

caf::expected<void> trainer_client::set_algorithm_config(const std::string& role,
                                                         const algorithm_config& config) {
  return as_void(call(role, worker_ops::set_algorithm_config, config));
}

caf::expected<void> trainer_client::save_checkpoint(const std::string& root, int64_t global_step,
                                                    const std::vector<std::string>& roles,
                                                    const nlohmann::json& trainer_state) {
  if (roles.empty())
    return make_error(errc::invalid_argument, "save_checkpoint: no roles given");
  for (const auto& role : roles) {
    auto r = call(role, worker_ops::save_checkpoint, root, global_step, role);
    if (!r)
      return std::move(r.error());
  }
  // Every rank of every role has written its directory: commit the step. Ranks on other nodes
  // may have written to their own file systems (per-node directories): the driver's copy of the
  // step directory holds the trainer state and the commit marker.
  auto done = call_backend(worker_ops::save_checkpoint.name, [&] {
    std::filesystem::create_directories(backends::step_directory(root, global_step));
    backends::finalize_checkpoint(root, global_step, trainer_state);
    return true;
  });
  if (!done)
    return std::move(done.error());
  return caf::unit;
}

caf::expected<int64_t> trainer_client::load_checkpoint(const std::string& root, int64_t global_step,
                                                       const std::vector<std::string>& roles) {
  if (roles.empty())
    return make_error(errc::invalid_argument, "load_checkpoint: no roles given");
  if (global_step < 0) {
    // Resolve "latest" once, so every role loads the same step.
    auto latest =
        call_backend(worker_ops::load_checkpoint.name, [&] { return backends::latest_step(root); });
    if (!latest)
      return std::move(latest.error());
    if (!*latest)
      return make_error(errc::not_found, "load_checkpoint: no committed checkpoint in '" + root +
                                             "' (no latest_global_step.txt)");
    global_step = **latest;
  }
  // Every rank must see its files before any rank loads (ranks on other nodes may not share
  // this file system): a refused resume changes nothing.
  for (const auto& role : roles) {
    auto r = call(role, rank_ops::checkpoint_visible, root, global_step, role);
    if (!r)
      return std::move(r.error());
  }
  for (const auto& role : roles) {
    auto r = call(role, worker_ops::load_checkpoint, root, global_step, role);
    if (!r)
      return std::move(r.error());
  }
  return global_step;
}

caf::expected<void> trainer_client::save_hf_model(const std::string& role, const std::string& dir) {
  return as_void(call(role, worker_ops::save_hf_model, dir));
}

caf::expected<int32_t> trainer_client::lcm_dp_size() {
  caf::scoped_actor self{*sys_};
  caf::expected<int32_t> out{caf::error{}};
  self->request(dispatcher_, std::chrono::seconds(30), dispatcher_lcm_atom::value)
      .receive([&](int32_t n) { out = n; }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<int32_t> trainer_client::register_engines(const actor_group& engines,
                                                        const std::string& role) {
  caf::scoped_actor self{*sys_};
  caf::expected<int32_t> out{caf::error{}};
  self->request(dispatcher_, std::chrono::seconds(60), dispatcher_register_atom::value, role,
                engines.handle(), std::string{"engine"})
      .receive([&](int32_t n) { out = n; }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<void> trainer_client::colocate(const std::vector<std::string>& roles) {
  caf::scoped_actor self{*sys_};
  caf::expected<void> out{caf::unit};
  self->request(dispatcher_, std::chrono::seconds(30), dispatcher_colocate_atom::value, roles)
      .receive([&]() {}, [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<void> trainer_client::set_weight_transport(const std::string& transport) {
  caf::scoped_actor self{*sys_};
  caf::expected<void> out{caf::unit};
  self->request(dispatcher_, std::chrono::seconds(30), dispatcher_transport_atom::value, transport)
      .receive([&]() {}, [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<void> trainer_client::set_weight_delta(bool on) {
  caf::scoped_actor self{*sys_};
  caf::expected<void> out{caf::unit};
  self->request(dispatcher_, std::chrono::seconds(30), dispatcher_delta_atom::value, on)
      .receive([&]() {}, [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<std::vector<sample_output>>
trainer_client::generate(const std::vector<sample_request>& requests, const std::string& role) {
  return call(role, engine_ops::generate, requests);
}

caf::expected<int64_t> trainer_client::save_weights_for_sampler(const std::string& role,
                                                                 const std::string& pause_mode,
                                                                 int64_t least_version) {
  auto mode = pause_mode.empty() ? std::string{"keep"} : pause_mode;
  if (least_version > 0)
    return call(role, dispatcher_ops::sync_weights, mode, least_version);
  if (pause_mode.empty())
    return call(role, dispatcher_ops::sync_weights);
  return call(role, dispatcher_ops::sync_weights, mode);
}

caf::expected<nlohmann::json> trainer_client::status() {
  caf::scoped_actor self{*sys_};
  caf::expected<nlohmann::json> out{caf::error{}};
  self->request(dispatcher_, timeout_ + std::chrono::seconds(5), dispatcher_status_atom::value,
                static_cast<int64_t>(timeout_.count()))
      .receive(
          [&](std::string& text) {
            try {
              out = nlohmann::json::parse(text);
            } catch (const std::exception& e) {
              out = make_error(errc::internal, std::string{"status: "} + e.what());
            }
          },
          [&](caf::error& e) { out = std::move(e); });
  return out;
}

caf::expected<sync_totals> trainer_client::syncs() {
  caf::scoped_actor self{*sys_};
  caf::expected<sync_totals> out{caf::error{}};
  self->request(dispatcher_, timeout_ + std::chrono::seconds(5), dispatcher_syncs_atom::value)
      .receive([&](int64_t count, int64_t bytes,
                   double seconds) { out = sync_totals{count, bytes, seconds}; },
               [&](caf::error& e) { out = std::move(e); });
  return out;
}

} // namespace rlforge::actors
