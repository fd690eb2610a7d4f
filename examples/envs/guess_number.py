#!/usr/bin/env python3
"""A multi-turn guessing game with a text reward, for rlforge's out-of-process environments.

The environment thinks of a number in [1, 100] (task["secret"], or derived from the seed); the
model answers in text, the environment reads the last integer of the answer and replies
"Higher than N." / "Lower than N." / "Correct! ...". Reward 1.0 on the turn the number is named,
0 otherwise; the episode ends on success or after task["max_turns"] guesses (default 5).

task["tool_latency_ms"] = [lo, hi] makes each step take lo..hi milliseconds of wall time
(uniform, drawn from the seed and the turn), as a tool call or a sandbox would: the async modes
of the GRPO job keep the engines busy with other episodes meanwhile. The replies do not change.

The same game (same texts, same secrets) is implemented in C++ by env/number_guess.hpp.

    python3 guess_number.py      # then speak the protocol on stdin/stdout
"""

import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rlforge_env import Environment, serve  # noqa: E402

MASK = (1 << 64) - 1


def secret_for_seed(seed):
    """splitmix64(seed) mod 100 + 1 (as number_guess::secret_for_seed)."""
    z = (seed + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    z = z ^ (z >> 31)
    return z % 100 + 1


def last_integer(text):
    matches = re.findall(r"-?[0-9]+", text, flags=re.ASCII)
    if not matches:
        return None
    value = matches[-1]
    negative = value.startswith("-")
    digits = value.lstrip("-")
    number = 0
    for ch in digits:
        if number < 1000000000000:
            number = number * 10 + int(ch)
    return -number if negative else number


class GuessNumber(Environment):
    def reset(self, seed, task):
        if "secret" in task:
            secret = task["secret"]
            if not isinstance(secret, int) or isinstance(secret, bool) or not 1 <= secret <= 100:
                raise ValueError("task.secret must be an integer in [1, 100]")
            self.secret = secret
        else:
            self.secret = secret_for_seed(seed if seed is not None else 0)
        max_turns = task.get("max_turns", 5)
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise ValueError("task.max_turns must be a positive integer")
        self.max_turns = max_turns
        latency = task.get("tool_latency_ms", [0, 0])
        if (not isinstance(latency, list) or len(latency) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in latency)
                or not 0 <= latency[0] <= latency[1] <= 60000):
            raise ValueError("task.tool_latency_ms must be [lo, hi] with 0 <= lo <= hi <= 60000")
        self.latency = latency
        self.seed = seed if seed is not None else 0
        self.turn = 0
        return ("I am thinking of a number between 1 and 100. You have %d guesses. "
                "Answer with a number." % max_turns, {"max_turns": max_turns})

    def step(self, action):
        self.turn += 1
        lo, hi = self.latency
        if hi > 0:
            time.sleep(random.Random(self.seed * 1000 + self.turn).randint(lo, hi) / 1000.0)
        guess = last_integer(action)
        reward, done = 0.0, False
        if guess is None:
            observation = "I could not find a number in your answer."
        elif guess == self.secret:
            observation = "Correct! The number was %d." % self.secret
            reward, done = 1.0, True
        else:
            observation = "%s than %d." % ("Higher" if guess < self.secret else "Lower", guess)
        if not done and self.turn >= self.max_turns:
            observation += " Out of guesses: the number was %d." % self.secret
            done = True
        return observation, reward, done, {"turn": self.turn, "guess": guess}


if __name__ == "__main__":
    serve(GuessNumber())
