#include "actors/dispatcher_backend.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/dispatcher.hpp"
#include "actors/tinker_checkpoints.hpp"
#include "actors/tinker_groups.hpp"
#include "actors/tinker_healing.hpp"
#include "actors/tinker_models.hpp"
#include "actors/tinker_sampling.hpp"
#include "actors/tinker_training.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/detokenizer.hpp"
#include "runtime/logging.hpp"
#include "tinker/error.hpp"

namespace rlforge::actors {

namespace fs = std::filesystem;

struct dispatcher_backend::impl {
  dispatcher_backend_options opts;
  std::string name;
  backends::model_config config;
  tinker::model_limits limits;
  std::optional<std::string> tokenizer_id; ///< the base directory, absolute, when it has one
  std::unique_ptr<tinker_groups> groups;
  std::unique_ptr<tinker_healing> healing;
  caf::actor dispatcher;
  std::unique_ptr<tinker_models> models;
  std::unique_ptr<tinker_sampling> sampling;
  std::atomic<uint64_t> recovery_checkpoints{0}; ///< names them
  std::atomic<int64_t> models_rebuilt{0};

  /// Brings `m` (locked) to the current placement generation: a model spawned under an older
  /// one (its node was lost) or whose last rebuild did not finish is rebuilt from its journal.
  void make_current(tinker_model& m);

  /// Runs `call` on model `model_id`, locked, as the call named `op`. With healing enabled, a
  /// server error whose model rank was lost heals (tinker_healing::heal), rebuilds the model
  /// and runs `call` again: the rebuild brings the model back to where it was before `call`.
  /// After `call` succeeded, `entry_of(m)` (a `std::optional<journal_entry>`) is what the
  /// model's journal records of it, and an optimizer step may write a recovery checkpoint.
  template <class Call, class Entry>
  auto healed(const std::string& model_id, const char* op, Call call, Entry entry_of);

  /// What a call that changes no model state records.
  static std::optional<journal_entry> nothing(tinker_model&) { return std::nullopt; }

  /// After an optimizer step: every `recovery_checkpoint_every` steps, writes a recovery
  /// checkpoint of `m` and starts its journal again from there. A failed write is logged and
  /// keeps the journal (a longer replay, nothing lost).
  void maybe_checkpoint(tinker_model& m);
};

void dispatcher_backend::impl::make_current(tinker_model& m) {
  if (m.built && m.generation == groups->generation())
    return;
  const auto t0 = std::chrono::steady_clock::now();
  models->rebuild(m);
  const auto what = "rebuilding model '" + m.id + "'";
  if (!m.journal.checkpoint.empty())
    load_tinker_checkpoint(*groups, dispatcher, m, {m.journal.checkpoint, "its recovery checkpoint"},
                           true);
  for (const auto& e : m.journal.entries) {
    switch (e.type) {
    case journal_entry::kind::forward_backward:
      tinker_forward_backward(*groups, dispatcher, m, limits, e.batch);
      break;
    case journal_entry::kind::optim_step:
      tinker_optim_step(*groups, dispatcher, m, e.adam);
      break;
    case journal_entry::kind::load_checkpoint:
      load_tinker_checkpoint(*groups, dispatcher, m, e.where, e.with_optimizer);
      break;
    case journal_entry::kind::sampler_snapshot:
      sampling->save_snapshot(m, e.version);
      break;
    }
  }
  m.built = true;
  ++models_rebuilt;
  runtime::logger("actors.tinker")
      ->warn("model_rebuilt model={} node={} from={} calls_replayed={} seconds={:.3f}", m.id,
             node_of(m.group), m.journal.checkpoint.empty() ? "creation" : "recovery checkpoint",
             m.journal.entries.size(),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

template <class Call, class Entry>
auto dispatcher_backend::impl::healed(const std::string& model_id, const char* op, Call call,
                                      Entry entry_of) {
  auto [m, lock] = models->lock(model_id, op);
  if (!healing->enabled())
    return call(*m);
  for (;;) {
    try {
      make_current(*m);
      auto out = call(*m);
      if (std::optional<journal_entry> entry = entry_of(*m)) {
        const bool step = entry->type == journal_entry::kind::optim_step;
        m->journal.entries.push_back(std::move(*entry));
        if (step)
          maybe_checkpoint(*m);
      }
      return out;
    } catch (const tinker::request_error& e) {
      if (e.category() != tinker::error_category::server || !healing->lost(m->group))
        throw;
      healing->heal(m->generation, node_of(m->group), std::string{op} + "(" + m->id + ")");
    }
  }
}

void dispatcher_backend::impl::maybe_checkpoint(tinker_model& m) {
  auto& j = m.journal;
  if (++j.optim_steps < opts.recovery_checkpoint_every)
    return;
  auto dir = fs::path(opts.recovery_dir) / ("checkpoint-" + std::to_string(++recovery_checkpoints));
  try {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      tinker::fail_server("cannot create " + dir.string() + ": " + ec.message());
    save_tinker_checkpoint(*groups, dispatcher, m, {dir.string(), "a recovery checkpoint"}, true,
                           name);
  } catch (const std::exception& e) {
    runtime::logger("actors.tinker")
        ->warn("recovery_checkpoint_failed model={} error={}", m.id, e.what());
    std::error_code ec;
    fs::remove_all(dir, ec);
    return;
  }
  if (!j.checkpoint.empty()) {
    std::error_code ec;
    fs::remove_all(j.checkpoint, ec);
  }
  j.checkpoint = dir.string();
  j.entries.clear();
  j.optim_steps = 0;
}

namespace {

void check_options(const dispatcher_backend_options& o) {
  auto bad = [](const std::string& what) { tinker::fail_server("dispatcher_backend: " + what); };
  if (o.base_model_dir.empty())
    bad("base_model_dir is empty");
  if (o.timeout.count() <= 0)
    bad("timeout must be > 0 ms, got " + std::to_string(o.timeout.count()));
  if (o.max_export_engines < 1)
    bad("max_export_engines must be >= 1");
  if (o.max_sampler_snapshots < 1)
    bad("max_sampler_snapshots must be >= 1");
  if (o.threads_per_rank < 1)
    bad("threads_per_rank must be >= 1, got " + std::to_string(o.threads_per_rank));
  if (!std::isfinite(o.gpu_per_group) || o.gpu_per_group < 0)
    bad("gpu_per_group must be finite and >= 0");
  if (!std::isfinite(o.lora_alpha) || o.lora_alpha <= 0)
    bad("lora_alpha must be finite and > 0");
  if (o.max_tokens_per_micro_batch < 1)
    bad("max_tokens_per_micro_batch must be >= 1, got " +
        std::to_string(o.max_tokens_per_micro_batch));
  if (o.compute_dtype != "fp32" && o.compute_dtype != "bf16")
    bad("compute_dtype must be fp32 or bf16, got '" + o.compute_dtype + "'");
  if (o.max_restarts < 0)
    bad("max_restarts must be >= 0, got " + std::to_string(o.max_restarts));
  if (o.max_restarts > 0) {
    if (o.recovery_dir.empty())
      bad("max_restarts > 0 needs a recovery_dir for the recovery checkpoints");
    if (o.recovery_checkpoint_every < 1)
      bad("recovery_checkpoint_every must be >= 1, got " +
          std::to_string(o.recovery_checkpoint_every));
    if (o.recovery_timeout.count() <= 0)
      bad("recovery_timeout must be > 0 ms, got " + std::to_string(o.recovery_timeout.count()));
    if (o.placement_manager && o.placement_request.name.empty())
      bad("max_restarts > 0 with a placement manager needs the placement_request to place again");
  }
}

backends::model_config read_config(const std::string& dir) {
  auto path = fs::path(dir) / "config.json";
  std::ifstream in(path);
  if (!in)
    tinker::fail_server("dispatcher_backend: cannot read " + path.string());
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded())
    tinker::fail_server("dispatcher_backend: " + path.string() + " is not valid JSON");
  try {
    return backends::parse_model_config(j);
  } catch (const std::exception& e) {
    tinker::fail_server("dispatcher_backend: " + path.string() + ": " + e.what());
  }
}

} // namespace

dispatcher_backend::dispatcher_backend(caf::actor_system& sys, dispatcher_backend_options options)
    : impl_(std::make_unique<impl>()) {
  auto& p = *impl_;
  p.opts = std::move(options);
  auto& o = p.opts;
  check_options(o);
  p.config = read_config(o.base_model_dir);
  p.limits = {p.config.vocab_size, p.config.max_position_embeddings};
  if (backends::has_tokenizer(o.base_model_dir)) {
    std::error_code ec;
    auto dir = fs::absolute(o.base_model_dir, ec);
    p.tokenizer_id = (ec ? fs::path(o.base_model_dir) : dir).lexically_normal().string();
  }
  p.name = o.base_model_name;
  if (p.name.empty()) {
    auto dir = fs::path(o.base_model_dir);
    p.name = (dir.has_filename() ? dir.filename() : dir.parent_path().filename()).string();
  }
  if (o.placement.bundles.empty()) {
    o.placement.name = "tinker";
    o.placement.strategy = "pack";
    o.placement.bundles.push_back({0, "local", {}, {{"CPU", 1.0}}});
  } else {
    o.placement.bundles.resize(1); // every group: one rank on bundle 0
  }
  p.groups = std::make_unique<tinker_groups>(sys, p.opts);
  p.healing = std::make_unique<tinker_healing>(*p.groups);
  p.dispatcher = p.groups->spawn_dispatcher();
  p.models = std::make_unique<tinker_models>(*p.groups, p.dispatcher);
  p.sampling = std::make_unique<tinker_sampling>(
      *p.groups, *p.healing, p.limits, p.name, [&p](const std::string& model_id) {
        p.healed(model_id, "sample", [](tinker_model&) { return 0; }, impl::nothing);
      });
}

dispatcher_backend::~dispatcher_backend() {
  auto& p = *impl_;
  p.sampling.reset();
  p.models->stop_all();
  p.groups->stop(p.dispatcher);
}

void dispatcher_backend::create_model(const std::string& model_id, const tinker::lora_config& lora,
                                      tinker::model_role role) {
  auto& p = *impl_;
  p.models->create(model_id, lora, role,
                   std::min(p.config.hidden_size, p.config.intermediate_size));
}

bool dispatcher_backend::has_model(const std::string& model_id) {
  return impl_->models->has(model_id);
}

void dispatcher_backend::delete_model(const std::string& model_id) {
  auto& p = *impl_;
  p.models->remove(model_id, [&](tinker_model& m) {
    p.sampling->drop_model(m.id);
    if (!m.journal.checkpoint.empty()) {
      std::error_code ec;
      fs::remove_all(m.journal.checkpoint, ec);
    }
  });
}

std::vector<tinker::forward_backward_output>
dispatcher_backend::forward_backward(const std::vector<tinker::forward_backward_request>& batch) {
  auto& p = *impl_;
  if (batch.empty())
    tinker::fail_user("forward_backward: empty batch of requests");
  const bool forward_only = batch.front().forward_only;
  return p.healed(
      batch.front().model_id, forward_only ? "forward" : "forward_backward",
      [&](tinker_model& m) {
        return tinker_forward_backward(*p.groups, p.dispatcher, m, p.limits, batch);
      },
      [&](tinker_model&) -> std::optional<journal_entry> {
        if (forward_only)
          return std::nullopt;
        return journal_entry::of_forward_backward(batch);
      });
}

std::map<std::string, double> dispatcher_backend::optim_step(const std::string& model_id,
                                                             const tinker::adam_params& a) {
  auto& p = *impl_;
  return p.healed(
      model_id, "optim_step",
      [&](tinker_model& m) { return tinker_optim_step(*p.groups, p.dispatcher, m, a); },
      [&](tinker_model&) { return std::optional{journal_entry::of_optim_step(a)}; });
}

int64_t dispatcher_backend::save_sampler_snapshot(const std::string& model_id) {
  auto& p = *impl_;
  int64_t version = 0;
  return p.healed(
      model_id, "save_weights_for_sampler",
      [&](tinker_model& m) { return version = p.sampling->save_snapshot(m); },
      [&](tinker_model&) { return std::optional{journal_entry::of_sampler_snapshot(version)}; });
}

void dispatcher_backend::export_sampler_weights(const std::string& model_id,
                                                const tinker::checkpoint_ref& where) {
  auto& p = *impl_;
  p.healed(
      model_id, "save_weights_for_sampler",
      [&](tinker_model& m) {
        export_tinker_sampler_weights(*p.groups, p.dispatcher, m, where);
        return 0;
      },
      impl::nothing);
}

std::vector<tinker::sample_response>
dispatcher_backend::sample(const std::vector<tinker::sample_request>& requests) {
  return impl_->sampling->sample(requests);
}

void dispatcher_backend::save_checkpoint(const std::string& model_id,
                                         const tinker::checkpoint_ref& where, bool with_optimizer) {
  auto& p = *impl_;
  p.healed(
      model_id, "save_checkpoint",
      [&](tinker_model& m) {
        save_tinker_checkpoint(*p.groups, p.dispatcher, m, where, with_optimizer, p.name);
        return 0;
      },
      impl::nothing);
}

void dispatcher_backend::load_checkpoint(const std::string& model_id,
                                         const tinker::checkpoint_ref& where, bool with_optimizer) {
  auto& p = *impl_;
  p.healed(
      model_id, "load_checkpoint",
      [&](tinker_model& m) {
        load_tinker_checkpoint(*p.groups, p.dispatcher, m, where, with_optimizer);
        return 0;
      },
      [&](tinker_model&) {
        return std::optional{journal_entry::of_load_checkpoint(where, with_optimizer)};
      });
}

std::string dispatcher_backend::base_model_name() const {
  return impl_->name;
}

std::optional<std::string> dispatcher_backend::tokenizer_id() const {
  return impl_->tokenizer_id;
}

int64_t dispatcher_backend::max_context_length() const {
  return impl_->config.max_position_embeddings;
}

int64_t dispatcher_backend::vocab_size() const {
  return impl_->config.vocab_size;
}

backend_stats dispatcher_backend::stats() {
  backend_stats out;
  try {
    out = impl_->sampling->stats(std::chrono::seconds(5));
  } catch (const std::exception&) {
    // a scrape must not fail the server; the next one asks again
  }
  for (const auto& r : impl_->healing->recoveries()) {
    ++out.recoveries;
    out.recovery_seconds += r.seconds;
  }
  out.models_rebuilt = impl_->models_rebuilt.load();
  return out;
}

const caf::actor& dispatcher_backend::dispatcher() const {
  return impl_->dispatcher;
}

std::vector<caf::actor> dispatcher_backend::model_ranks(const std::string& model_id) {
  return impl_->models->ranks(model_id);
}

std::unique_ptr<tinker_backend> make_dispatcher_backend(caf::actor_system& sys,
                                                        dispatcher_backend_options options) {
  return std::make_unique<dispatcher_backend>(sys, std::move(options));
}

} // namespace rlforge::actors
