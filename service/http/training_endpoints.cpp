// Models and training: create_model, get_info, unload_model, forward_backward, forward,
// optim_step.
#include "service/http/server_state.hpp"
#include "service/wire/forward_backward_codec.hpp"
#include "service/wire/json_bodies.hpp"

namespace rlforge::service::http {

namespace {

void create_model(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto r = decode_create_model(req.body);
  if (!s.store.get_session(r.session_id))
    throw http_error(http_status::not_found, "unknown session '" + r.session_id + "'");
  if (r.base_model != s.backend.base_model_name())
    throw http_error(http_status::bad_request, "base_model '" + r.base_model +
                              "' is not served here; this server "
                              "serves '" +
                              s.backend.base_model_name() + "'");
  auto model_id = future_store::model_id_for(r.session_id, r.model_seq_id);
  std::lock_guard<std::mutex> guard(s.submit_mutex);
  auto [id, created] = s.record("create_model", model_id, 0, req, "create_model");
  if (created) {
    s.schedule_or_fail(id, [&] {
      s.sched->open_model(model_id, 1);
      s.sched->submit_unordered(
          model_id,
          [&s, r, model_id] {
            try {
              s.backend.create_model(model_id, r.lora, r.role);
            } catch (...) {
              // No model: requests queued behind the creation fail as unknown-model ones would.
              s.sched->close_model(model_id);
              throw;
            }
            model_record m;
            m.model_id = model_id;
            m.session_id = r.session_id;
            m.model_seq_id = r.model_seq_id;
            m.base_model = r.base_model;
            m.lora_config_json = lora_json(r.lora).dump();
            m.role = tinker::to_string(r.role);
            m.user_metadata_json = metadata_json(r.user_metadata).dump();
            s.store.insert_model(m);
            s.log->info("event=create_model model_id={} lora_rank={}", model_id, r.lora.rank);
            return json{{"model_id", model_id}, {"type", "create_model"}}.dump();
          },
          s.finish_json(id));
    });
  }
  reply_json(res, s.submitted(id, model_id));
}

void get_info(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto r = decode_get_info(req.body);
  auto m = s.store.get_model(r.model_id);
  if (!m || m->deleted)
    throw http_error(http_status::not_found, "unknown model '" + r.model_id + "'");
  auto lora = json::parse(m->lora_config_json);
  int64_t rank = lora.value("rank", int64_t{0});
  // The SDK's get_tokenizer() hands tokenizer_id to AutoTokenizer.from_pretrained; without a
  // tokenizer the member is left out (the SDK then falls back to the model name).
  json model_data{{"model_name", m->base_model}};
  if (auto tokenizer = s.backend.tokenizer_id())
    model_data["tokenizer_id"] = *tokenizer;
  reply_json(res, json{{"model_id", m->model_id},
                       {"model_data", model_data},
                       {"is_lora", rank > 0},
                       {"lora_rank", rank},
                       {"model_name", m->base_model},
                       {"type", "get_info"}});
}

void unload_model(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto r = decode_unload_model(req.body);
  s.require_model(r.model_id);
  std::lock_guard<std::mutex> guard(s.submit_mutex);
  auto [id, created] = s.record("unload_model", r.model_id, -1, req, "unload_model");
  if (created) {
    auto model_id = r.model_id;
    s.schedule_or_fail(id, [&] {
      s.sched->submit_unordered(
          model_id,
          [&s, model_id] {
            s.backend.delete_model(model_id);
            s.store.mark_model_deleted(model_id);
            s.sched->close_model(model_id);
            s.log->info("event=unload_model model_id={}", model_id);
            return json{{"model_id", model_id}, {"type", "unload_model"}}.dump();
          },
          s.finish_json(id));
    });
  }
  reply_json(res, s.submitted(id, r.model_id));
}

void forward_backward(server_state& s, const httplib::Request& req, httplib::Response& res,
                      const std::string& endpoint) {
  seq_guard g(s, req);
  auto r = decode_forward_backward(req.body, req.get_header_value("Content-Type"),
                                   req.get_header_value("Content-Encoding"), s.limits);
  g.set(r.model_id, r.seq_id);
  if (endpoint == "forward")
    r.forward_only = true;
  s.require_model(r.model_id);
  std::lock_guard<std::mutex> guard(s.submit_mutex);
  auto [id, created] = s.record(r.forward_only ? "forward" : "forward_backward", r.model_id,
                                r.seq_id, req, endpoint);
  g.armed = false;
  auto model_id = r.model_id;
  if (created) {
    s.schedule_or_fail(id, [&] {
      s.sched->submit_forward_backward(std::move(r),
                                       s.finish_with<tinker::forward_backward_output>(
                                           id, encode_forward_backward_output_proto, proto_type));
    });
  }
  reply_json(res, s.submitted(id, model_id));
}

void optim_step(server_state& s, const httplib::Request& req, httplib::Response& res) {
  seq_guard g(s, req);
  auto r = decode_optim_step(req.body);
  s.require_model(r.model_id);
  std::lock_guard<std::mutex> guard(s.submit_mutex);
  auto [id, created] = s.record("optim_step", r.model_id, r.seq_id, req, "optim_step");
  g.armed = false;
  if (created) {
    s.schedule_or_fail(id, [&] {
      s.sched->submit_ordered(
          r.model_id, r.seq_id,
          [&s, r] {
            auto metrics = s.backend.optim_step(r.model_id, r.adam);
            for (auto& [name, value] : metrics)
              validate_metric_name(name);
            return json{{"metrics", metrics}, {"type", "optim_step"}}.dump();
          },
          s.finish_json(id));
    });
  }
  reply_json(res, s.submitted(id, r.model_id));
}

} // namespace

void add_training_endpoints(server_state& s, routes& r) {
  r.post("create_model", [&s](auto& req, auto& res) { create_model(s, req, res); });
  r.post("get_info", [&s](auto& req, auto& res) { get_info(s, req, res); });
  r.post("unload_model", [&s](auto& req, auto& res) { unload_model(s, req, res); });
  r.post("forward_backward",
         [&s](auto& req, auto& res) { forward_backward(s, req, res, "forward_backward"); });
  r.post("forward", [&s](auto& req, auto& res) { forward_backward(s, req, res, "forward"); });
  r.post("optim_step", [&s](auto& req, auto& res) { optim_step(s, req, res); });
}

} // namespace rlforge::service::http
