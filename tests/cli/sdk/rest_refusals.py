"""Issue 23, Tinker API parity: the RestClient methods rlforge serve does not support fail at
once (no retries) with an error naming the method and why, never a 404; the supported ones
around them keep working."""

import time

import tinker

from sdk_check import check, result, shifted


def refused(c, label, call):
    start = time.monotonic()
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
    took = time.monotonic() - start
    c.note(label + "_seconds", round(took, 3))
    c.expect(took < 5, "%s took %.1f s: retried?" % (label, took))


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
    # The checkpoint is still there and listed.
    listed = result(rest.list_checkpoints(tc.model_id)).checkpoints
    c.expect(any(ck.tinker_path == path for ck in listed),
             "the checkpoint %s is not listed after the refusals" % path)


check("rest_refusals").run(body)
