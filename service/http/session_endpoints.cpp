// Sessions and client configuration: healthz, client/config, client/dynamic_config,
// create_session, session_heartbeat, telemetry, get_server_capabilities, sessions, sessions/{id}.
#include <limits>

#include "service/http/server_state.hpp"
#include "service/wire/json_bodies.hpp"

namespace rlforge::service::http {

namespace {

void client_config(httplib::Response& res) {
  reply_json(res, json{{"use_pyqwest_transport", false},
                       {"pjwt_auth_enabled", false},
                       {"credential_default_source", "api_key"},
                       {"proto_compress_fwdbwd", false},
                       {"parallel_fwdbwd_chunks", true},
                       {"fwdbwd_max_chunk_len", 1024},
                       {"fwdbwd_max_chunk_bytes_count", 5000000},
                       {"fwdbwd_dispatch_bytes_semaphore_size", 50000000},
                       {"sample_dispatch_bytes_semaphore_size", 10 << 20},
                       {"inflight_response_bytes_semaphore_size", 50 << 20},
                       {"sample_no_retries", false},
                       {"sample_enable_stuck_detection", true},
                       {"sample_max_concurrent_requests", 2000},
                       {"billing_exception_max_pause_duration_sec", 3600},
                       {"create_model_via_load_weights", false}});
}

void create_session(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto r = decode_create_session(req.body);
  json tags = r.tags;
  auto id = s.store.create_session(tags.dump(), metadata_json(r.user_metadata).dump());
  s.log->info("event=create_session session_id={}", id);
  reply_json(res, json{{"session_id", id}, {"type", "create_session"}});
}

void session_heartbeat(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto r = decode_session_heartbeat(req.body);
  s.store.heartbeat(r.session_id);
  reply_json(res, json{{"type", "session_heartbeat"}});
}

void capabilities(server_state& s, httplib::Response& res) {
  reply_json(res,
             json{{"supported_models",
                   json::array({json{{"model_name", s.backend.base_model_name()},
                                     {"max_context_length", s.backend.max_context_length()}}})}});
}

void list_sessions(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto limit = query_int(req, "limit", 20, 10000);
  auto offset = query_int(req, "offset", 0, std::numeric_limits<int32_t>::max());
  auto all = s.store.list_sessions();
  json ids = json::array();
  for (size_t i = static_cast<size_t>(offset);
       i < all.size() && ids.size() < static_cast<size_t>(limit); ++i)
    ids.push_back(all[i].session_id);
  reply_json(res,
             json{{"sessions", ids},
                  {"cursor", {{"offset", offset}, {"limit", limit}, {"total_count", all.size()}}}});
}

void get_session(server_state& s, const httplib::Request& req, const std::string& id,
                 httplib::Response& res) {
  if (req.has_param("access_scope")) {
    auto scope = req.get_param_value("access_scope");
    if (scope != "owned" && scope != "accessible")
      throw http_error(http_status::bad_request, "access_scope is '" + scope + "', expected owned or accessible");
  }
  if (!s.store.get_session(id))
    throw http_error(http_status::not_found, "unknown session '" + id + "'");
  json runs = json::array();
  for (auto& m : s.store.list_models(id))
    runs.push_back(m.model_id);
  json samplers = json::array();
  for (auto& x : s.store.list_sampling_sessions(id))
    samplers.push_back(x.id);
  reply_json(res, json{{"training_run_ids", runs}, {"sampler_ids", samplers}});
}

} // namespace

void add_session_endpoints(server_state& s, routes& r) {
  r.get("healthz", [](auto&, auto& res) { reply_json(res, json{{"status", "ok"}}); });
  r.post("client/config", [](auto&, auto& res) { client_config(res); });
  r.post("client/dynamic_config", [](auto&, auto& res) {
    reply_json(res, json{{"refresh_interval_sec", 300}});
  });
  r.post("create_session", [&s](auto& req, auto& res) { create_session(s, req, res); });
  r.post("session_heartbeat", [&s](auto& req, auto& res) { session_heartbeat(s, req, res); });
  r.post("telemetry", [](auto&, auto& res) { reply_json(res, json{{"status", "accepted"}}); });
  r.get("get_server_capabilities", [&s](auto&, auto& res) { capabilities(s, res); });
  r.get("sessions", [&s](auto& req, auto& res) { list_sessions(s, req, res); });
  r.get("sessions/([^/]+)",
        [&s](auto& req, auto& res) { get_session(s, req, req.matches[1], res); });
}

} // namespace rlforge::service::http
