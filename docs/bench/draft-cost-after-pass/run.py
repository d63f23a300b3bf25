"""Does a target pass between two proposals make a drafter's proposal dearer? (issue 52)

The cost table timed proposals back to back until format 5; real rounds run a target pass between
two proposals. This times the shipped EAGLE-3 head's chain proposing 3 tokens on the default model,
back to back and each right after a one-token target pass, and a target pass over 3 tokens, back to
back and each right after a proposal: medians of 27 timed calls (3 warm-ups left out), two sweeps.

    .venv/bin/python docs/bench/draft-cost-after-pass/run.py > docs/bench/draft-cost-after-pass/output.txt
"""

import platform
import statistics
import time

import torch

from specdec.drafters.base import Features
from specdec.drafters.build import build_drafters
from specdec.runtime.llama import Segment
from specdec.runtime.loading import load_model
from specdec.sampling import SamplingParams

CONTEXT, CALLS, WARM_UPS = 256, 30, 3

target = load_model()
net = target.net
[chain] = build_drafters("eagle3-chain", target)
ids = torch.randint(0, net.vocab_size, (1, CONTEXT + 8), generator=torch.Generator().manual_seed(0))  # [1, L]
tokens = ids[0, :CONTEXT].tolist()
cache = net.new_cache(CONTEXT + 8)
net.forward(ids[:, :CONTEXT], cache)
chain.begin(tokens, CONTEXT + 8, net.new_cache(CONTEXT + 8))
head_cache = net.new_cache(CONTEXT + 8)  # the features of every token but the last, as the engine gives them
out = net.forward_segments(ids[0, :CONTEXT - 1], [Segment(head_cache, CONTEXT - 1)], return_hidden=True,
                           aux_layers=chain.feature_layers)
chain.accept_features(Features(out[1], out[2] if chain.feature_layers else {}).for_drafter(chain))
greedy = SamplingParams()
generator = greedy.generator(net.device)


def target_pass(size: int) -> None:
    net.forward(ids[:, CONTEXT:CONTEXT + size], cache)[0, -1, 0].item()
    cache.truncate(CONTEXT)


def propose() -> None:
    chain.propose(tokens, 3, greedy, generator)


def median_ms(timed, before=None) -> float:
    times = []
    for _ in range(CALLS):
        if before is not None:
            before()
        start = time.perf_counter()
        timed()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[WARM_UPS:])


print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
      f"{torch.get_num_threads()} threads, capability {torch.backends.cpu.get_cpu_capability()}")
for sweep in (1, 2):
    print(f"sweep {sweep}: proposal of 3 tokens back to back {median_ms(propose):.2f} ms, "
          f"after a one-token target pass {median_ms(propose, lambda: target_pass(1)):.2f} ms; "
          f"target pass over 3 tokens back to back {median_ms(lambda: target_pass(3)):.2f} ms, "
          f"after a proposal {median_ms(lambda: target_pass(3), propose):.2f} ms")
