#include "service/wire/json_bodies.hpp"

#include <cmath>

#include "service/wire/codec_support.hpp"

namespace rlforge::service {

using namespace wire_detail;

create_session_request decode_create_session(std::string_view body) {
  const json j = parse_object(body, "create_session");
  fields f(j, "create_session");
  f.check_type({"create_session"});
  create_session_request r;
  const json& tags = f.array("tags", false);
  for (size_t i = 0; i < tags.size(); ++i) {
    if (!tags[i].is_string())
      f.fail("tags",
             "entry " + std::to_string(i) + " must be a string, got " + tags[i].type_name());
    r.tags.push_back(tags[i].get<std::string>());
  }
  r.user_metadata = f.metadata("user_metadata");
  r.sdk_version = f.str("sdk_version", false);
  r.project_id = f.str("project_id", false);
  return r;
}

session_heartbeat_request decode_session_heartbeat(std::string_view body) {
  const json j = parse_object(body, "session_heartbeat");
  fields f(j, "session_heartbeat");
  f.check_type({"session_heartbeat"});
  return {f.str("session_id", true, true)};
}

create_model_request decode_create_model(std::string_view body) {
  const json j = parse_object(body, "create_model");
  fields f(j, "create_model");
  f.check_type({"create_model"});
  create_model_request r;
  r.session_id = f.str("session_id", true, true);
  r.model_seq_id = f.integer("model_seq_id", true, 0, nullptr, 0);
  r.base_model = f.str("base_model", true, true);
  r.user_metadata = f.metadata("user_metadata");
  if (f.get("lora_config")) {
    auto l = f.object("lora_config", true);
    r.lora.rank = l.integer("rank", true, 0, nullptr, 0);
    r.lora.seed = l.integer("seed", false, 0, &r.lora.has_seed);
    r.lora.train_unembed = l.boolean("train_unembed", false, true);
    r.lora.train_mlp = l.boolean("train_mlp", false, true);
    r.lora.train_attn = l.boolean("train_attn", false, true);
  }
  auto role = f.str("model_role", false);
  if (!role.empty()) {
    if (role != "policy" && role != "critic")
      f.fail("model_role", "is \"" + role + "\", expected policy or critic");
    r.role = role == "critic" ? tinker::model_role::critic : tinker::model_role::policy;
  }
  return r;
}

optim_step_request decode_optim_step(std::string_view body) {
  const json j = parse_object(body, "optim_step");
  fields f(j, "optim_step");
  f.check_type({"optim_step"});
  optim_step_request r;
  r.model_id = f.str("model_id", true, true);
  r.seq_id = f.integer("seq_id", true);
  check_seq_id(f, r.seq_id);
  auto a = f.object("adam_params", true);
  auto& p = r.adam;
  auto read = [&](const char* key, double fallback, bool ok(double), const char* domain) {
    const double v = a.number(key, false, fallback);
    if (!std::isfinite(v) || !ok(v))
      a.fail(key, std::string("must be ") + domain + ", got " + number_text(v));
    return v;
  };
  p.learning_rate = read(
      "learning_rate", p.learning_rate, [](double v) { return v >= 0; }, "a finite number >= 0");
  p.beta1 = read(
      "beta1", p.beta1, [](double v) { return v >= 0 && v < 1; }, "in [0, 1)");
  p.beta2 = read(
      "beta2", p.beta2, [](double v) { return v >= 0 && v < 1; }, "in [0, 1)");
  p.eps = read(
      "eps", p.eps, [](double v) { return v > 0; }, "a finite number > 0");
  p.weight_decay = read(
      "weight_decay", p.weight_decay, [](double v) { return v >= 0; }, "a finite number >= 0");
  p.grad_clip_norm = read(
      "grad_clip_norm", p.grad_clip_norm, [](double v) { return v >= 0; },
      "a finite number >= 0 (0 = no clipping)");
  return r;
}

namespace {

void read_ttl(const fields& f, bool& has, int64_t& ttl) {
  ttl = f.integer("ttl_seconds", false, 0, &has);
  if (has && ttl < 1)
    f.fail("ttl_seconds", "must be >= 1, got " + std::to_string(ttl));
}

std::string checkpoint_name(const fields& f) {
  auto path = f.str("path", false);
  if (!path.empty() && !valid_checkpoint_name(path))
    f.fail("path", "\"" + path +
                       "\" is not a checkpoint name: use 1-128 of A-Z a-z 0-9 . _ - and do not "
                       "start with '.'");
  return path;
}

} // namespace

save_weights_request decode_save_weights(std::string_view body) {
  const json j = parse_object(body, "save_weights");
  fields f(j, "save_weights");
  f.check_type({"save_weights"});
  save_weights_request r;
  r.model_id = f.str("model_id", true, true);
  r.seq_id = f.integer("seq_id", true);
  check_seq_id(f, r.seq_id);
  r.path = checkpoint_name(f);
  read_ttl(f, r.has_ttl, r.ttl_seconds);
  r.overwrite = f.boolean("overwrite", false);
  return r;
}

save_weights_for_sampler_request decode_save_weights_for_sampler(std::string_view body) {
  const json j = parse_object(body, "save_weights_for_sampler");
  fields f(j, "save_weights_for_sampler");
  f.check_type({"save_weights_for_sampler"});
  save_weights_for_sampler_request r;
  r.model_id = f.str("model_id", true, true);
  r.seq_id = f.integer("seq_id", true);
  check_seq_id(f, r.seq_id);
  r.path = checkpoint_name(f);
  r.sampling_session_seq_id =
      f.integer("sampling_session_seq_id", false, 0, &r.has_sampling_session_seq_id, 0);
  read_ttl(f, r.has_ttl, r.ttl_seconds);
  return r;
}

load_weights_request decode_load_weights(std::string_view body) {
  const json j = parse_object(body, "load_weights");
  fields f(j, "load_weights");
  f.check_type({"load_weights"});
  load_weights_request r;
  const bool legacy = f.get("model_id") || f.get("seq_id");
  const bool create = f.get("session_id") || f.get("model_seq_id");
  if (legacy && create)
    user_error("load_weights: give either model_id + seq_id or session_id + model_seq_id, not "
               "both");
  if (!legacy && !create)
    user_error("load_weights: 'model_id' + 'seq_id' (or 'session_id' + 'model_seq_id') are "
               "required");
  r.create_via_load = create;
  if (legacy) {
    r.model_id = f.str("model_id", true, true);
    r.seq_id = f.integer("seq_id", true);
    check_seq_id(f, r.seq_id);
  } else {
    r.session_id = f.str("session_id", true, true);
    r.model_seq_id = f.integer("model_seq_id", true, 0, nullptr, 0);
    r.base_model = f.str("base_model", false);
    r.user_metadata = f.metadata("user_metadata");
  }
  r.path = f.str("path", true, true);
  if (!tinker_path(r.path))
    f.fail("path", "must start with tinker://, got \"" + r.path + "\"");
  r.optimizer = f.boolean("optimizer", true);
  r.weights_access_token = f.str("weights_access_token", false);
  return r;
}

create_sampling_session_request decode_create_sampling_session(std::string_view body) {
  const json j = parse_object(body, "create_sampling_session");
  fields f(j, "create_sampling_session");
  f.check_type({"create_sampling_session"});
  create_sampling_session_request r;
  r.session_id = f.str("session_id", true, true);
  r.sampling_session_seq_id = f.integer("sampling_session_seq_id", true, 0, nullptr, 0);
  r.model_path = f.str("model_path", false);
  r.base_model = f.str("base_model", false);
  if (!r.model_path.empty() && !tinker_path(r.model_path))
    f.fail("model_path", "must start with tinker://, got \"" + r.model_path + "\"");
  if (r.model_path.empty() && r.base_model.empty())
    user_error("create_sampling_session: one of 'model_path' or 'base_model' is required");
  return r;
}

retrieve_future_request decode_retrieve_future(std::string_view body) {
  const json j = parse_object(body, "retrieve_future");
  fields f(j, "retrieve_future");
  retrieve_future_request r;
  r.request_id = f.str("request_id", true, true);
  r.allow_metadata_only = f.boolean("allow_metadata_only", false);
  return r;
}

weights_info_request decode_weights_info(std::string_view body) {
  const json j = parse_object(body, "weights_info");
  fields f(j, "weights_info");
  weights_info_request r;
  r.tinker_path = f.str("tinker_path", true, true);
  if (!tinker_path(r.tinker_path))
    f.fail("tinker_path", "must start with tinker://, got \"" + r.tinker_path + "\"");
  return r;
}

model_id_request decode_get_info(std::string_view body) {
  const json j = parse_object(body, "get_info");
  fields f(j, "get_info");
  f.check_type({"get_info"});
  return {f.str("model_id", true, true)};
}

model_id_request decode_unload_model(std::string_view body) {
  const json j = parse_object(body, "unload_model");
  fields f(j, "unload_model");
  f.check_type({"unload_model"});
  return {f.str("model_id", true, true)};
}

} // namespace rlforge::service
