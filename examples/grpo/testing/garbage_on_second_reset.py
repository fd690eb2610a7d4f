#!/usr/bin/env python3
"""A broken environment for the GRPO job's --env test: the guessing game of
examples/envs/guess_number.py, except that each process answers its second reset with a line that
is not JSON and exits. The driver fails those episodes (a protocol error), replaces the processes,
and the job goes on.

    garbage_on_second_reset.py ENVS_DIR      # ENVS_DIR: examples/envs
"""

import os
import sys

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "envs"))
from guess_number import GuessNumber  # noqa: E402
from rlforge_env import serve  # noqa: E402


class GarbageOnSecondReset(GuessNumber):
    resets = 0

    def reset(self, seed, task):
        self.resets += 1
        if self.resets == 2:
            sys.stdout.write("this is not json\n")
            sys.stdout.flush()
            sys.exit(3)
        return super().reset(seed, task)


if __name__ == "__main__":
    serve(GarbageOnSecondReset())
