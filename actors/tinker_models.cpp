#include "actors/tinker_models.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <caf/all.hpp>

#include "actors/dispatcher.hpp"
#include "actors/protocol.hpp"
#include "tinker/error.hpp"
#include "strings/format.hpp"

namespace rlforge::actors {

namespace {

using strings::in_quotes;

/// How the worker builds a model of the Tinker backend from the base directory.
model_spec spec_of(const tinker_model& m, const dispatcher_backend_options& o) {
  model_spec s;
  s.hf_dir = o.base_model_dir;
  s.seed = m.lora.has_seed ? static_cast<uint64_t>(m.lora.seed) : 0;
  s.lora_rank = m.lora.rank;
  s.lora_alpha = o.lora_alpha;
  s.compute_dtype = o.compute_dtype;
  s.batch_invariant = o.batch_invariant;
  if (m.lora.rank > 0) {
    if (m.lora.train_attn)
      s.lora_target_modules.insert(s.lora_target_modules.end(),
                                   {"q_proj", "k_proj", "v_proj", "o_proj"});
    if (m.lora.train_mlp)
      s.lora_target_modules.insert(s.lora_target_modules.end(),
                                   {"gate_proj", "up_proj", "down_proj"});
    if (m.lora.train_unembed)
      s.lora_target_modules.push_back("lm_head");
  }
  return s;
}

} // namespace

journal_entry
journal_entry::of_forward_backward(std::vector<tinker::forward_backward_request> batch) {
  journal_entry e;
  e.type = kind::forward_backward;
  e.batch = std::move(batch);
  return e;
}

journal_entry journal_entry::of_optim_step(const tinker::adam_params& adam) {
  journal_entry e;
  e.type = kind::optim_step;
  e.adam = adam;
  return e;
}

journal_entry journal_entry::of_load_checkpoint(tinker::checkpoint_ref where, bool with_optimizer) {
  journal_entry e;
  e.type = kind::load_checkpoint;
  e.where = std::move(where);
  e.with_optimizer = with_optimizer;
  return e;
}

journal_entry journal_entry::of_sampler_snapshot(int64_t version) {
  journal_entry e;
  e.type = kind::sampler_snapshot;
  e.version = version;
  return e;
}

tinker_models::tinker_models(tinker_groups& groups, caf::actor dispatcher)
    : groups_(groups), dispatcher_(std::move(dispatcher)) {}

void tinker_models::create(const std::string& model_id, const tinker::lora_config& lora,
                           tinker::model_role role, int64_t max_rank) {
  auto context = "create_model(" + model_id + ")";
  if (model_id.empty())
    tinker::fail_user("create_model: model_id is empty");
  if (lora.rank < 0)
    tinker::fail_user(context + ": lora rank must be >= 0, got " + std::to_string(lora.rank));
  if (lora.rank > max_rank)
    tinker::fail_user(context + ": lora rank " + std::to_string(lora.rank) +
                      " exceeds the base model's hidden size " + std::to_string(max_rank));
  if (lora.rank > 0 && !lora.train_attn && !lora.train_mlp && !lora.train_unembed)
    tinker::fail_user(context + ": train_attn, train_mlp and train_unembed are all false: LoRA "
                                "would adapt nothing");
  if (lora.has_seed && lora.seed < 0)
    tinker::fail_user(context + ": lora seed must be >= 0, got " + std::to_string(lora.seed));
  auto m = std::make_shared<tinker_model>();
  m->id = model_id;
  m->role = role;
  m->lora = lora;
  std::unique_lock<std::mutex> lock(m->mutex);
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (models_.count(model_id))
      tinker::fail_user(context + ": a model with this id already exists");
    models_.emplace(model_id, m);
  }
  try {
    build(*m, context);
    m->built = true;
    m->ready = true;
  } catch (const tinker::request_error& e) {
    try {
      tear_down(*m);
    } catch (const tinker::request_error&) { // the creation error is the one to report
    }
    {
      std::lock_guard<std::mutex> guard(mutex_);
      models_.erase(model_id);
    }
    // The request was checked above: what fails now (the base directory, the runtime) is the
    // server's.
    tinker::fail_server(e.what());
  }
}

void tinker_models::build(tinker_model& m, const std::string& context) {
  auto [group, generation] = groups_.spawn(tinker::to_string(m.role), context);
  m.group = group;
  m.generation = generation;
  auto c = groups_.client(dispatcher_);
  value_of(c.register_group(m.id, m.group), context + ": registering the group");
  value_of(c.init_model(m.id, spec_of(m, groups_.options())), context + ": building the model");
  algorithm_config passes;
  passes.max_tokens_per_micro_batch = groups_.options().max_tokens_per_micro_batch;
  check(c.set_algorithm_config(m.id, passes), context + ": configuring its passes");
}

void tinker_models::rebuild(tinker_model& m) {
  m.built = false;
  {
    caf::scoped_actor self{groups_.system()};
    self->request(dispatcher_, std::chrono::seconds(30), dispatcher_unregister_atom::value, m.id)
        .receive([] {}, [](caf::error&) {});
  }
  m.group.stop(); // its rank is gone already; the routing actor and the share go now
  build(m, "rebuilding model '" + m.id + "'");
}

std::pair<std::shared_ptr<tinker_model>, std::unique_lock<std::mutex>>
tinker_models::lock(const std::string& model_id, const char* op) {
  std::shared_ptr<tinker_model> m;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto i = models_.find(model_id);
    if (i != models_.end() && i->second->ready)
      m = i->second;
  }
  if (!m)
    tinker::fail_not_found(std::string{op} + ": unknown model " + in_quotes(model_id));
  std::unique_lock<std::mutex> lock(m->mutex);
  if (!m->ready) // deleted while we waited
    tinker::fail_not_found(std::string{op} + ": unknown model " + in_quotes(model_id));
  return {std::move(m), std::move(lock)};
}

bool tinker_models::has(const std::string& model_id) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto i = models_.find(model_id);
  return i != models_.end() && i->second->ready;
}

void tinker_models::remove(const std::string& model_id,
                           const std::function<void(tinker_model&)>& before_stop) {
  auto [m, lock] = this->lock(model_id, "delete_model");
  m->ready = false;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    models_.erase(model_id);
  }
  if (before_stop)
    before_stop(*m);
  tear_down(*m);
}

void tinker_models::tear_down(tinker_model& m) {
  caf::scoped_actor self{groups_.system()};
  self->request(dispatcher_, std::chrono::seconds(30), dispatcher_unregister_atom::value, m.id)
      .receive([] {}, [](caf::error&) {});
  groups_.stop_and_wait(m.group);
#if defined(__GLIBC__)
  malloc_trim(0); // the ranks' arenas would keep the freed model resident
#endif
}

void tinker_models::stop_all() {
  std::map<std::string, std::shared_ptr<tinker_model>> models;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    models.swap(models_);
  }
  for (auto& [id, m] : models) {
    std::lock_guard<std::mutex> guard(m->mutex);
    m->ready = false;
    m->group.stop();
  }
}

std::vector<caf::actor> tinker_models::ranks(const std::string& model_id) {
  std::shared_ptr<tinker_model> m;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto i = models_.find(model_id);
    if (i == models_.end() || !i->second->ready)
      return {};
    m = i->second;
  }
  auto r = m->group.rank_handles();
  return r ? *r : std::vector<caf::actor>{};
}

} // namespace rlforge::actors
