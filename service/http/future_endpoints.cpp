// Futures: retrieve_future long-polls a future until it is final or the hold expires.
#include "service/http/server_state.hpp"
#include "service/wire/forward_backward_codec.hpp"
#include "service/wire/json_bodies.hpp"
#include "service/wire/sample_codec.hpp"

namespace rlforge::service::http {

namespace {

void retrieve_future(server_state& s, const httplib::Request& req, httplib::Response& res) {
  auto r = decode_retrieve_future(req.body);
  auto deadline = std::chrono::steady_clock::now() + s.opts.long_poll_hold;
  for (;;) {
    uint64_t seen;
    {
      std::lock_guard<std::mutex> guard(s.poll_mutex);
      seen = s.generation;
    }
    auto f = s.store.get(r.request_id);
    if (!f)
      throw http_error(http_status::not_found, "unknown request_id '" + r.request_id + "'");
    if (f->state == future_state::failed) {
      reply_json(res, json{{"error", f->error}, {"category", f->category}});
      return;
    }
    if (f->state == future_state::complete) {
      std::string body = f->result;
      std::string type = f->result_content_type;
      if (type == proto_type && !accepts_proto(req)) {
        if (f->request_type == "sample")
          body = encode_sample_response_json(decode_sample_response_proto(body));
        else
          body = encode_forward_backward_output_json(decode_forward_backward_output_proto(body));
        type = json_type;
      }
      if (r.allow_metadata_only) {
        reply_json(res,
                   json{{"status", "complete_metadata"}, {"response_payload_size", body.size()}});
        return;
      }
      res.status = 200;
      res.set_content(body, type.c_str());
      return;
    }
    std::unique_lock<std::mutex> lock(s.poll_mutex);
    bool woke =
        s.poll_cv.wait_until(lock, deadline, [&] { return s.generation != seen || s.stopping; });
    if (!woke || s.stopping) {
      reply_json(
          res,
          json{{"type", "try_again"}, {"request_id", r.request_id}, {"queue_state", "active"}});
      return;
    }
  }
}

} // namespace

void add_future_endpoints(server_state& s, routes& r) {
  r.post("retrieve_future", [&s](auto& req, auto& res) { retrieve_future(s, req, res); });
}

} // namespace rlforge::service::http
