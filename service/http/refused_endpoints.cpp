// The Tinker SDK 0.25 REST methods `rlforge serve` refuses, each answered 400 with why and what
// to use instead (never a 404): audit logs, publishing checkpoints, projects, session trace
// exports, billing usage. A 4xx, because the SDK retries every 5xx for up to five minutes
// whatever the response says; `x-should-retry: false` tells other clients the same.
#include <string>

#include "service/http/server_state.hpp"

namespace rlforge::service::http {

namespace {

handler refuse(std::string method, std::string why) {
  return [method = std::move(method), why = std::move(why)](const httplib::Request&,
                                                           httplib::Response& res) {
    res.set_header("x-should-retry", "false");
    reply_error(res, 400, method + " is not supported by rlforge serve: " + why);
  };
}

} // namespace

void add_refused_endpoints(server_state&, routes& r) {
  r.get("audit", refuse("get_audit_log", "it keeps no audit log; its log (--log-level info) "
                                         "records every checkpoint saved and deleted"));
  const std::string checkpoint = "training_runs/([^/]+)/checkpoints/([^/]+/[^/]+)/publish";
  const std::string no_public =
      "there are no public checkpoints; every checkpoint is readable with the server's API key "
      "(get_checkpoint_archive_url downloads one)";
  r.post(checkpoint, refuse("publish_checkpoint_from_tinker_path", no_public));
  r.del(checkpoint, refuse("unpublish_checkpoint_from_tinker_path", no_public));
  r.put("sessions/([^/]+)/project",
        refuse("assign_session_project", "it has no projects; every session and training run "
                                         "belongs to the server's one API key"));
  r.get("sessions/([^/]+)/trace_export",
        refuse("export_session_trace", "it records no traces; GET /metrics has its counters"));
  r.get("billing/usage/events",
        refuse("get_billing_usage", "it is self-hosted and bills nothing; GET /metrics counts "
                                    "the tokens generated and trained"));
}

} // namespace rlforge::service::http
