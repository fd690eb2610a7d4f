// Sampling: create_sampling_session, samplers/{id}, asample.
#include "service/http/server_state.hpp"
#include "service/wire/json_bodies.hpp"
#include "service/wire/sample_codec.hpp"

namespace rlforge::service::http {

namespace {

checkpoint_record require_sampler_checkpoint(server_state& s, const std::string& tinker_path) {
  auto c = s.require_checkpoint(tinker_path);
  require_sampler_kind(c);
  return c;
}

void create_sampling_session(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto r = decode_create_sampling_session(req.body);
  if (!r.session_id.empty() && !s.store.get_session(r.session_id))
    throw http_error(http_status::not_found, "unknown session '" + r.session_id + "'");
  sampling_session_record x;
  x.session_id = r.session_id;
  x.sampling_session_seq_id = r.sampling_session_seq_id;
  if (!r.model_path.empty()) {
    auto c = require_sampler_checkpoint(s, r.model_path);
    auto m = s.store.get_model(c.model_id);
    x.model_id = c.model_id;
    x.base_model = m ? m->base_model : s.backend.base_model_name();
    x.model_path = r.model_path;
    x.weights_dir = c.dir;
  } else {
    if (r.base_model != s.backend.base_model_name())
      throw http_error(http_status::bad_request, "base_model '" + r.base_model +
                                "' is not served here; this server "
                                "serves '" +
                                s.backend.base_model_name() + "'");
    x.base_model = r.base_model;
  }
  auto id = s.store.create_sampling_session(x);
  reply_json(res, json{{"sampling_session_id", id}, {"type", "create_sampling_session"}});
}

void get_sampler(server_state& s, const std::string& id, httplib::Response& res) {
  auto x = s.store.get_sampling_session(id);
  if (!x)
    throw http_error(http_status::not_found, "unknown sampling session '" + id + "'");
  json j{{"sampler_id", x->id}, {"base_model", x->base_model}};
  if (!x->model_path.empty())
    j["model_path"] = x->model_path;
  reply_json(res, j);
}

/// The weights a sample request names: its sampling session's (a snapshot of a model's weights,
/// a saved sampler checkpoint or the base model), an older SDK's model_path, or the base model.
tinker::sampler_ref sampler_of(server_state& s, const sample_body& body) {
  tinker::sampler_ref ref;
  const auto& key = body.request.sampling_session_id;
  if (!key.empty()) {
    auto x = s.store.get_sampling_session(key);
    if (!x)
      throw http_error(http_status::not_found, "unknown sampling session '" + key + "'");
    if (!x->model_path.empty()) {
      ref.type = tinker::sampler_ref::kind::checkpoint;
      ref.dir = x->weights_dir;
      ref.name = x->model_path;
    } else if (!x->model_id.empty()) {
      ref.type = tinker::sampler_ref::kind::snapshot;
      ref.model_id = x->model_id;
      ref.version = x->weights_version;
      ref.name = "sampling session " + key;
    } else {
      ref.name = "sampling session " + key + " (base model)";
    }
    return ref;
  }
  if (!body.model_path.empty()) {
    auto c = require_sampler_checkpoint(s, body.model_path);
    ref.type = tinker::sampler_ref::kind::checkpoint;
    ref.dir = c.dir;
    ref.name = body.model_path;
    return ref;
  }
  if (body.base_model != s.backend.base_model_name())
    throw http_error(http_status::bad_request, "base_model '" + body.base_model +
                              "' is not served here; this server "
                              "serves '" +
                              s.backend.base_model_name() + "'");
  ref.name = "base model " + body.base_model;
  return ref;
}

void asample(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto body = decode_sample(req.body, s.limits);
  auto& r = body.request;
  if (r.num_samples > s.opts.max_num_samples)
    throw http_error(http_status::bad_request, "num_samples " + std::to_string(r.num_samples) +
                              " exceeds this "
                              "server's limit of " +
                              std::to_string(s.opts.max_num_samples) +
                              " per request (rlforge serve --max-num-samples); split it into "
                              "several requests");
  r.sampler = sampler_of(s, body);
  const auto key = r.sampling_session_id;
  std::lock_guard<std::mutex> guard(s.submit_mutex);
  if (s.sched->pending_samples() >= s.opts.scheduler.max_pending_samples) {
    res.set_header("Retry-After", "1");
    throw http_error(http_status::too_many_requests, "sampling queue full (" + std::to_string(s.sched->pending_samples()) +
                              " requests waiting); retry later");
  }
  // Only addressed sessions have a (session, seq_id) identity; other samples dedupe by key.
  auto [id, created] = s.record("sample", key, key.empty() ? -1 : r.seq_id, req, "asample");
  if (created) {
    bool queued = s.sched->try_submit_sample(
        std::move(r),
        s.finish_with<tinker::sample_response>(id, encode_sample_response_proto, proto_type));
    if (!queued) {
      s.fail(id, failure{tinker::error_category::server, "sampling queue full"});
      res.set_header("Retry-After", "1");
      throw http_error(http_status::too_many_requests, "sampling queue full; retry later");
    }
  }
  reply_json(res, s.submitted(id));
}

} // namespace

void add_sampling_endpoints(server_state& s, routes& r) {
  r.post("create_sampling_session",
         [&s](auto& req, auto& res) { create_sampling_session(s, req, res); });
  r.get("samplers/([^/]+)", [&s](auto& req, auto& res) { get_sampler(s, req.matches[1], res); });
  r.post("asample", [&s](auto& req, auto& res) { asample(s, req, res); });
}

} // namespace rlforge::service::http
