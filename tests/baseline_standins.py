"""Stand-ins for baselines run in a process of their own (specdec.bench.child's factories): they
repeat the prompt's last token, and can kill their own process at a chosen call, as llama.cpp's
faulting AMX path did (SIGILL) on an Intel host."""

from __future__ import annotations

import os
import signal

from specdec.bench.methods import Output


class StandIn:
    kind = "transformers"

    def __init__(self, name: str, die_at_call: int) -> None:
        self.name, self.die_at_call, self.calls = name, die_at_call, 0

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling) -> Output:
        self.calls += 1
        if self.calls == self.die_at_call:
            os.kill(os.getpid(), signal.SIGILL)
        return Output(prompt_ids[-1:] * max_new_tokens)


def stand_ins(die_at_call: int = 0, **ignored) -> list[StandIn]:
    """Two methods in one process; the first kills it at its `die_at_call`-th call (0: never)."""
    return [StandIn("hf-generate", die_at_call), StandIn("hf-lookup", 0)]


def dying_at_first_call(**ignored) -> list[StandIn]:
    """As the bench's transformers factory: the process dies at the first call (the warm-up)."""
    return stand_ins(die_at_call=1)


def failing_to_start(**ignored) -> list[StandIn]:
    raise RuntimeError("no such model file")
