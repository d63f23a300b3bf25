"""Baselines (transformers, llama.cpp: other people's code) each run in a process of their own, so
that a crash there (llama.cpp's AMX path faulting with SIGILL on some Intel hosts, an out-of-memory
kill) ends that baseline, not the bench: the runner leaves its rows out and the report names the
failure in one line (`BaselineFailed`).

`BaselineProcess(factory, kwargs, threads)` starts `python -m specdec.bench.child`, which builds the
methods with `factory(**kwargs)` (an import path "module:function" returning objects with `name`,
`kind` and `generate`, as `bench/methods.py`'s) and then serves one request at a time, one JSON line
each way over its standard input and output:

    parent → child   {"factory": "specdec.bench.methods:llama_cpp_baseline", "kwargs": {...}, "threads": 2}
    child → parent   {"ready": [[name, kind], ...]}                         or {"error": "..."}
    parent → child   {"method": name, "prompt_ids": [...], "max_new_tokens": n, "sampling": {...}}
    child → parent   {"token_ids": [...], "seconds": s, "peak_memory_bytes": b}   or {"error": "..."}

The child times its own `generate` (the pipe is not the baseline's cost) and measures its own peak
memory (`PeakMemory` there: the baseline's model alone, not ours). Its standard output carries only
the protocol: what the libraries print goes to its standard error, whose last lines a failure quotes.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from specdec.errors import BaselineFailed

STDERR_LINES = 3  # of the child's standard error, quoted when it fails


class BaselineProcess:
    """The parent's side: one child process and the methods it hosts (`methods`)."""

    def __init__(self, factory: str, kwargs: dict, threads: int) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # the child's standard error
        self.process = subprocess.Popen([sys.executable, "-m", "specdec.bench.child"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1)
        self.ended: str | None = None  # how the process ended, once it has
        try:
            reply = self.call({"factory": factory, "kwargs": kwargs, "threads": threads}, "starting")
        except BaselineFailed:
            self.close()
            raise
        self.methods = [BaselineMethod(name, kind, self) for name, kind in reply["ready"]]

    def call(self, message: dict, doing: str) -> dict:
        """Send one request and read its reply; BaselineFailed if the process has ended or the request failed."""
        if self.ended is not None:
            raise BaselineFailed(f"its process had ended ({self.ended})")
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except OSError:  # the pipe broke: the child is gone
            line = ""
        if not line:
            self.ended = self._how_it_ended()
            raise BaselineFailed(f"its process ended while {doing}: {self.ended}")
        reply = json.loads(line)
        if "error" in reply:
            raise BaselineFailed(f"failed while {doing}: {reply['error']}")
        return reply

    def _how_it_ended(self) -> str:
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # closed its output but did not exit
            self.process.kill()
            code = self.process.wait()
        if code >= 0:
            how = f"exit status {code}"
        else:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:  # a signal Python has no name for
                how = f"killed by signal {-code}"
        self.log.seek(0)
        said = [line.strip() for line in self.log.read().splitlines() if line.strip()][-STDERR_LINES:]
        return how + (f"; its last words: {' | '.join(said)}" if said else "")

    def close(self) -> None:
        """End the child (it exits when its input closes) and drop its log; safe to call twice."""
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self.log.close()


@dataclasses.dataclass
class BaselineMethod:
    """A method run in a `BaselineProcess`: the runner calls it as any other."""

    name: str
    kind: str
    process: BaselineProcess

    def generate(self, prompt_ids: list[int], max_new_tokens: int, sampling):
        from specdec.bench.methods import Output

        reply = self.process.call({"method": self.name, "prompt_ids": prompt_ids, "max_new_tokens": max_new_tokens,
                                   "sampling": dataclasses.asdict(sampling)}, f"generating ({len(prompt_ids)} prompt tokens)")
        return Output(reply["token_ids"], seconds=reply["seconds"], peak_memory_bytes=reply["peak_memory_bytes"])

    def close(self) -> None:
        self.process.close()


def answer_requests(requests, replies) -> None:
    """The child's side: build the methods from the first line, then answer each request line."""
    import torch

    from specdec.bench.memory import PeakMemory
    from specdec.sampling import SamplingParams

    def reply(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    start = json.loads(requests.readline())
    torch.set_num_threads(start["threads"])
    module, _, function = start["factory"].partition(":")
    try:
        methods = {m.name: m for m in getattr(importlib.import_module(module), function)(**start["kwargs"])}
    except Exception as err:  # their code: reported, not raised
        reply({"error": f"{type(err).__name__}: {err}"})
        return
    reply({"ready": [[m.name, m.kind] for m in methods.values()]})
    memory = PeakMemory(torch.device("cpu"))
    while line := requests.readline():
        request = json.loads(line)
        memory.reset()
        try:
            began = time.perf_counter()
            output = methods[request["method"]].generate(request["prompt_ids"], request["max_new_tokens"],
                                                         SamplingParams(**request["sampling"]))
            seconds = time.perf_counter() - began
        except Exception as err:  # their code: reported, and the next request may still be served
            reply({"error": f"{type(err).__name__}: {err}"})
            continue
        reply({"token_ids": output.token_ids, "seconds": seconds, "peak_memory_bytes": memory.peak()})


def main() -> None:
    # the protocol gets the real standard output; the libraries' prints (C code included) go to standard error
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    answer_requests(sys.stdin, replies)


if __name__ == "__main__":
    main()
