"""A scripted environment process for tests/env: speaks the protocol correctly or breaks it in
one chosen way. Usage: misbehave.py MODE (see the branches below)."""

import json
import os
import sys
import time

mode = sys.argv[1]
out = sys.stdout


def send(obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()


def raw(data):
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


if mode == "no_handshake":
    time.sleep(1000)
if mode == "crash_before_handshake":
    sys.stderr.write("cannot load the task file\n")
    sys.exit(1)
if mode == "bad_handshake":
    out.write("hello there\n")
    out.flush()
    time.sleep(1000)
if mode == "wrong_version":
    send({"protocol": "rlforge.env", "version": 2})
    time.sleep(1000)

send({"protocol": "rlforge.env", "version": 1})
turn = 0
for line in sys.stdin:
    req = json.loads(line)
    rid, method = req["id"], req["method"]
    if method == "close":
        send({"id": rid, "result": {}})
        break
    if method == "reset":
        turn = 0
        if mode == "echo_setup":
            info = {"cwd": os.getcwd(), "var": os.environ.get("RLFORGE_TEST_VAR"),
                    "home": os.environ.get("HOME"), "argv": sys.argv[1:]}
            send({"id": rid, "result": {"observation": "setup", "info": info}})
            continue
        if mode == "garbage_on_reset":
            out.write("this is not json\n")
            out.flush()
            continue
        if mode == "not_object":
            out.write("[1, 2, 3]\n")
            out.flush()
            continue
        send({"id": rid, "result": {"observation": "start", "info": {}}})
        continue
    # step
    turn += 1
    if mode == "wrong_id":
        send({"id": rid + 1, "result": {"observation": "x", "reward": 0, "done": False}})
    elif mode == "missing_fields":
        send({"id": rid, "result": {"observation": "x", "reward": 0}})
    elif mode == "wrong_types":
        send({"id": rid, "result": {"observation": "x", "reward": "high", "done": False}})
    elif mode == "huge_line":
        send({"id": rid, "result": {"observation": "x" * (2 * 1024 * 1024), "reward": 0,
                                    "done": False}})
    elif mode == "invalid_utf8":
        raw(b'{"id": %d, "result": {"observation": "\xff\xfe", "reward": 0, "done": false}}\n' % rid)
    elif mode == "exit_mid_episode":
        sys.stderr.write("Traceback: something broke\nfatal: boom\n")
        sys.stderr.flush()
        sys.exit(3)
    elif mode == "hang_on_step":
        sys.stderr.write("thinking forever\n")
        sys.stderr.flush()
        time.sleep(1000)
    elif mode == "env_error":
        send({"id": rid, "error": {"message": "action not understood", "type": "ValueError"}})
    elif mode == "stderr_flood":
        sys.stderr.write("log line\n" * 200000)
        sys.stderr.flush()
        send({"id": rid, "result": {"observation": "ok", "reward": 1, "done": True}})
    else:
        send({"id": rid, "result": {"observation": "ok %d" % turn, "reward": 0.5,
                                    "done": turn >= 2}})
