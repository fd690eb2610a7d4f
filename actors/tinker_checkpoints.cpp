#include "actors/tinker_checkpoints.hpp"

#include <filesystem>
#include <fstream>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "tinker/error.hpp"

namespace rlforge::actors {

namespace {

namespace fs = std::filesystem;

const char* const checkpoint_meta = "tinker_checkpoint.json";
const char* const checkpoint_role_dir = "model";

/// Runs `f`; a request error it throws comes out with every mention of the checkpoint's
/// directory replaced by its name.
template <class F> void hiding_paths(const tinker::checkpoint_ref& where, F f) {
  try {
    f();
  } catch (const tinker::request_error& e) {
    std::string text = e.what();
    if (!where.dir.empty())
      for (size_t at = text.find(where.dir); at != std::string::npos;
           at = text.find(where.dir, at + where.name.size()))
        text.replace(at, where.dir.size(), where.name);
    throw tinker::request_error(e.category(), text);
  }
}

void write_json(const fs::path& path, const nlohmann::json& j, const std::string& context) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out)
    tinker::fail_server(context + ": cannot write " + path.filename().string());
}

/// The adapted parts of a model, as recorded in its checkpoints.
nlohmann::json lora_parts(const tinker::lora_config& l) {
  return {
      {"train_attn", l.train_attn}, {"train_mlp", l.train_mlp}, {"train_unembed", l.train_unembed}};
}

} // namespace

void save_tinker_checkpoint(tinker_groups& groups, const caf::actor& dispatcher, tinker_model& m,
                            const tinker::checkpoint_ref& where, bool with_optimizer,
                            const std::string& base_model) {
  auto context = "save_checkpoint(" + m.id + ", " + where.name + ")";
  hiding_paths(where, [&] {
    // The workers always write the optimizer state; the meta file says what was asked for.
    value_of(groups.client(dispatcher)
                 .call(m.id, worker_ops::save_checkpoint, where.dir, int64_t{0},
                       std::string{checkpoint_role_dir}),
             context);
    write_json(fs::path(where.dir) / checkpoint_meta,
               {{"format", "rlforge-tinker-checkpoint"},
                {"role", tinker::to_string(m.role)},
                {"lora_rank", m.lora.rank},
                {"lora_parts", lora_parts(m.lora)},
                {"with_optimizer", with_optimizer},
                {"base_model", base_model}},
               context);
  });
}

void load_tinker_checkpoint(tinker_groups& groups, const caf::actor& dispatcher, tinker_model& m,
                            const tinker::checkpoint_ref& where, bool with_optimizer) {
  auto context = "load_checkpoint(" + m.id + ", " + where.name + ")";
  hiding_paths(where, [&] {
    std::ifstream in(fs::path(where.dir) / checkpoint_meta);
    if (!in)
      tinker::fail_user(context + ": not a training checkpoint of this server (no " +
                        std::string{checkpoint_meta} + ")");
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("role") || !j.contains("lora_rank") ||
        !j.contains("with_optimizer") || !j["role"].is_string() ||
        !j["lora_rank"].is_number_integer() || !j["with_optimizer"].is_boolean())
      tinker::fail_user(context + ": " + std::string{checkpoint_meta} + " is malformed");
    auto role = j["role"].get<std::string>();
    auto rank = j["lora_rank"].get<int64_t>();
    if (role != tinker::to_string(m.role) || rank != m.lora.rank)
      tinker::fail_user(context + ": the checkpoint is of a " + role + " with LoRA rank " +
                        std::to_string(rank) + ", the model is a " + tinker::to_string(m.role) +
                        " with LoRA rank " + std::to_string(m.lora.rank));
    // Older checkpoints do not record the parts: they adapted attention and MLP only.
    auto parts = j.value(
        "lora_parts",
        nlohmann::json{{"train_attn", true}, {"train_mlp", true}, {"train_unembed", false}});
    if (rank > 0 && parts != lora_parts(m.lora))
      tinker::fail_user(context + ": the checkpoint adapted " + parts.dump() +
                        ", the model adapts " + lora_parts(m.lora).dump());
    if (with_optimizer && !j["with_optimizer"].get<bool>())
      tinker::fail_user(context + ": the checkpoint was saved without optimizer state");
    value_of(groups.client(dispatcher)
                 .call(m.id, worker_ops::load_checkpoint, where.dir, int64_t{0},
                       std::string{checkpoint_role_dir}, with_optimizer),
             context);
  });
}

void export_tinker_sampler_weights(tinker_groups& groups, const caf::actor& dispatcher,
                                   tinker_model& m, const tinker::checkpoint_ref& where) {
  auto context = "save_weights_for_sampler(" + m.id + ", " + where.name + ")";
  if (m.role != tinker::model_role::policy)
    tinker::fail_user(context + ": '" + m.id + "' is a critic; only policies sample");
  hiding_paths(where, [&] {
    check(groups.client(dispatcher).save_hf_model(m.id, where.dir), context + ": exporting");
  });
}

} // namespace rlforge::actors
