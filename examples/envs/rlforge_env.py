"""The environment side of rlforge's JSON-lines protocol (docs/ENVIRONMENTS.md), standard library
only. Subclass Environment, write reset and step, and call serve():

    from rlforge_env import Environment, serve

    class Echo(Environment):
        def reset(self, seed, task):
            return "Say something.", {}
        def step(self, action):
            return "You said: " + action, 1.0, True, {}

    if __name__ == "__main__":
        serve(Echo())

serve() writes the handshake, then answers each request line on stdin with one reply line on
stdout. An exception raised by reset or step becomes an "error" reply (the episode fails, the
process stays up). Use stderr for logs: stdout carries only protocol lines.
"""

import json
import sys
import traceback

PROTOCOL = "rlforge.env"
VERSION = 1


class Environment:
    """One environment instance; the driver runs one episode at a time on it."""

    def reset(self, seed, task):
        """Start an episode. seed: int or None; task: dict. Return (observation, info)."""
        raise NotImplementedError

    def step(self, action):
        """Apply the model's action text. Return (observation, reward, done, info)."""
        raise NotImplementedError

    def close(self):
        """Release resources before the process exits."""


def _reply(out, message):
    out.write(json.dumps(message, ensure_ascii=False) + "\n")
    out.flush()


def _check_reset(value):
    observation, info = value
    if not isinstance(observation, str):
        raise TypeError("reset must return (observation: str, info: dict)")
    return {"observation": observation, "info": dict(info or {})}


def _check_step(value):
    observation, reward, done, info = value
    if not isinstance(observation, str) or not isinstance(done, bool):
        raise TypeError("step must return (observation: str, reward: float, done: bool, info: dict)")
    return {"observation": observation, "reward": float(reward), "done": done,
            "info": dict(info or {})}


def serve(env, stdin=None, stdout=None):
    """Run the protocol loop for `env` until a close request or the end of stdin."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    _reply(stdout, {"protocol": PROTOCOL, "version": VERSION, "name": type(env).__name__})
    for line in stdin:
        request = json.loads(line)
        rid, method, params = request["id"], request["method"], request.get("params") or {}
        try:
            if method == "reset":
                result = _check_reset(env.reset(params.get("seed"), params.get("task") or {}))
            elif method == "step":
                result = _check_step(env.step(params["action"]))
            elif method == "close":
                env.close()
                _reply(stdout, {"id": rid, "result": {}})
                return
            else:
                raise ValueError("unknown method " + repr(method))
        except Exception as e:  # the environment's own error: report it, keep serving
            traceback.print_exc(file=sys.stderr)
            _reply(stdout, {"id": rid, "error": {"message": str(e), "type": type(e).__name__}})
            continue
        _reply(stdout, {"id": rid, "result": result})
    env.close()
