#include "actors/dispatcher_backend.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <utility>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/dispatcher.hpp"
#include "actors/tinker_checkpoints.hpp"
#include "actors/tinker_groups.hpp"
#include "actors/tinker_models.hpp"
#include "actors/tinker_sampling.hpp"
#include "actors/tinker_training.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/detokenizer.hpp"
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
  caf::actor dispatcher;
  std::unique_ptr<tinker_models> models;
  std::unique_ptr<tinker_sampling> sampling;
};

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
  p.dispatcher = p.groups->spawn_dispatcher();
  p.models = std::make_unique<tinker_models>(*p.groups, p.dispatcher);
  p.sampling = std::make_unique<tinker_sampling>(*p.groups, p.limits, p.name);
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
  p.models->remove(model_id, [&](tinker_model& m) { p.sampling->drop_model(m.id); });
}

std::vector<tinker::forward_backward_output>
dispatcher_backend::forward_backward(const std::vector<tinker::forward_backward_request>& batch) {
  auto& p = *impl_;
  if (batch.empty())
    tinker::fail_user("forward_backward: empty batch of requests");
  auto [m, lock] = p.models->lock(batch.front().model_id,
                                  batch.front().forward_only ? "forward" : "forward_backward");
  return tinker_forward_backward(*p.groups, p.dispatcher, *m, p.limits, batch);
}

std::map<std::string, double> dispatcher_backend::optim_step(const std::string& model_id,
                                                             const tinker::adam_params& a) {
  auto& p = *impl_;
  auto [m, lock] = p.models->lock(model_id, "optim_step");
  return tinker_optim_step(*p.groups, p.dispatcher, *m, a);
}

int64_t dispatcher_backend::save_sampler_snapshot(const std::string& model_id) {
  auto& p = *impl_;
  auto [m, lock] = p.models->lock(model_id, "save_weights_for_sampler");
  return p.sampling->save_snapshot(*m);
}

void dispatcher_backend::export_sampler_weights(const std::string& model_id,
                                                const tinker::checkpoint_ref& where) {
  auto& p = *impl_;
  auto [m, lock] = p.models->lock(model_id, "save_weights_for_sampler");
  export_tinker_sampler_weights(*p.groups, p.dispatcher, *m, where);
}

std::vector<tinker::sample_response>
dispatcher_backend::sample(const std::vector<tinker::sample_request>& requests) {
  return impl_->sampling->sample(requests);
}

void dispatcher_backend::save_checkpoint(const std::string& model_id,
                                         const tinker::checkpoint_ref& where, bool with_optimizer) {
  auto& p = *impl_;
  auto [m, lock] = p.models->lock(model_id, "save_checkpoint");
  save_tinker_checkpoint(*p.groups, p.dispatcher, *m, where, with_optimizer, p.name);
}

void dispatcher_backend::load_checkpoint(const std::string& model_id,
                                         const tinker::checkpoint_ref& where, bool with_optimizer) {
  auto& p = *impl_;
  auto [m, lock] = p.models->lock(model_id, "load_checkpoint");
  load_tinker_checkpoint(*p.groups, p.dispatcher, *m, where, with_optimizer);
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
  try {
    return impl_->sampling->stats(std::chrono::seconds(5));
  } catch (const std::exception&) {
    return {}; // a scrape must not fail the server; the next one asks again
  }
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
