"""Issue 23, Tinker API parity: the RestClient methods rlforge serve does not support fail at
once (the SDK does not retry them: the server counts exactly one request each) with an error
naming the method and why, never a 404; the supported ones around them keep working."""

import os
import urllib.request

import tinker

from sdk_check import check, result, shifted


def requests_counted(c, endpoint):
    """rlforge_http_requests_total{endpoint, status="400"} from the server's /metrics."""
    req = urllib.request.Request(c.args.url.rstrip("/") + "/metrics",
                                 headers={"Authorization": "Bearer " + os.environ["TINKER_API_KEY"]})
    key = 'rlforge_http_requests_total{endpoint="%s",status="400"} ' % endpoint
    for line in urllib.request.urlopen(req, timeout=30).read().decode().splitlines():
        if line.startswith(key):
            return float(line[len(key):])
    return 0.0


def refused(c, label, call):
    try:
        call().result(timeout=60)
        c.expect(False, "%s was accepted" % label)
        return
    except tinker.APIStatusError as e:
        c.expect(e.status_code == 400, "%s: HTTP %d, not 400: %s" % (label, e.status_code, e))
        c.expect("%s is not supported by rlforge serve" % label in str(e),
                 "%s refused without naming it: %s" % (label, e))
    except Exception as e:
        c.expect(False, "%s raised %s: %s" % (label, type(e).__name__, e))


def body(c):
    service = c.service()
    rest = service.create_rest_client()
    tc = c.lora(service, seed=3)
    result(tc.forward_backward([shifted([1, 2, 3, 4], [1.0, 1.0, 1.0])], "cross_entropy"))
    path = result(tc.save_state("w1")).path
    refused(c, "publish_checkpoint_from_tinker_path",
            lambda: rest.publish_checkpoint_from_tinker_path(path))
    refused(c, "unpublish_checkpoint_from_tinker_path",
            lambda: rest.unpublish_checkpoint_from_tinker_path(path))
    refused(c, "get_audit_log", lambda: rest.get_audit_log())
    session = result(rest.list_sessions()).sessions[0]
    refused(c, "assign_session_project", lambda: rest.assign_session_project(session, "p"))
    refused(c, "get_billing_usage",
            lambda: rest.get_billing_usage("2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"))
    # One request per call reached the server: none was retried.
    for endpoint, calls in [("training_runs/{}/checkpoints/{}/publish", 2), ("audit", 1),
                            ("sessions/{}/project", 1), ("billing/usage/events", 1)]:
        got = requests_counted(c, endpoint)
        c.note("requests_" + endpoint, got)
        c.expect(got == calls, "%s: the server counted %g refused requests for %d calls "
                 "(retried?)" % (endpoint, got, calls))
    # The checkpoint is still there and listed.
    listed = result(rest.list_checkpoints(tc.model_id)).checkpoints
    c.expect(any(ck.tinker_path == path for ck in listed),
             "the checkpoint %s is not listed after the refusals" % path)


check("rest_refusals").run(body)
