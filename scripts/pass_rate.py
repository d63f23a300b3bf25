"""A whole target pass over k tokens, this build of the kernels against another, paired in one process.

    python scripts/pass_rate.py --model TWIN.gguf --against OLD.so               # k = 1, 2, 4, 8
    python scripts/pass_rate.py --model TWIN.gguf --against OLD.so --sizes 1,4 --repeats 20

`specdec costs` times passes too, but one build per process: on a shared host two processes minutes
apart can differ by a third (seen here), more than most kernel changes. This loads the model once and
times each pass size with both builds in turn within every repeat (who goes first alternates), the
same packed weights and the same cache, after `--context` cached tokens; per size it prints each
build's median and the median of the paired ratios this / other. The other build is an earlier .so
under ~/.cache/specdec/kernels/ (the kernel sources' digest names its folder); both must read the
same packed layout.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from specdec.runtime import load_model
from specdec.runtime.kernels import invariant_kernels
from specdec.runtime.quant import QuantizedLinear
from kernel_rate import load_build  # scripts/ is on the path when run as a script


class Builds:
    """Switches one loaded model between two kernel builds: the fused pass and every quantized layer."""

    def __init__(self, net, other) -> None:
        self.net = net
        self.modules = {"this": invariant_kernels(), "other": other}
        self.layers = [m for m in net.modules() if isinstance(m, QuantizedLinear)]

    def use(self, which: str) -> None:
        module = self.modules[which]
        self.net._invariant_kernels = lambda: module  # the instance's, ahead of the class's method
        for layer in self.layers:
            layer.multiply = module.quant_linear


def paired_passes(net, builds: Builds, context: int, sizes: list[int], repeats: int,
                  other_first: bool) -> dict[int, dict[str, list[float]]]:
    """Per size, each build's seconds per pass, the builds taking turns (who goes first alternates by
    repeat and size; `other_first` flips the whole pattern, for a second process)."""
    cache = net.new_cache(context + max(sizes))
    ids = torch.randint(0, net.vocab_size, (1, context + max(sizes)), generator=torch.Generator().manual_seed(0))
    builds.use("this")
    net.forward(ids[:, :context], cache)
    times = {size: {"this": [], "other": []} for size in sizes}
    for repeat in range(repeats + 1):  # the first sweep warms up
        for size in sizes:
            order = ("this", "other") if (repeat + size + other_first) % 2 else ("other", "this")
            for which in order:
                builds.use(which)
                start = time.perf_counter()
                net.forward(ids[:, context:context + size], cache)
                elapsed = time.perf_counter() - start
                cache.truncate(context)
                if repeat:
                    times[size][which].append(elapsed)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a .gguf file or a built-in name")
    p.add_argument("--against", type=Path, required=True, help="another build's .so, timed in turn with this one")
    p.add_argument("--sizes", default="1,2,4,8", help="tokens per pass, comma-separated")
    p.add_argument("--context", type=int, default=256, help="cached tokens before each pass")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--other-first", action="store_true", help="flip which build goes first in every turn")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    model = load_model(args.model)
    net = model.net
    builds = Builds(net, load_build(args.against))
    times = paired_passes(net, builds, args.context, sizes, args.repeats, args.other_first)
    print(f"{torch.get_num_threads()} threads; {args.model}; {args.context} cached tokens; {args.repeats} paired repeats"
          f"{'; the other build first' if args.other_first else ''}")
    print(f"{'k':>3} {'this ms':>9} {'other ms':>9} {'this/other':>11}  T(k)/T(1) this, other")
    one = {which: statistics.median(times[sizes[0]][which]) for which in ("this", "other")}
    for size in sizes:
        mine, theirs = times[size]["this"], times[size]["other"]
        ratio = statistics.median(a / b for a, b in zip(mine, theirs))
        print(f"{size:>3} {statistics.median(mine) * 1e3:>9.2f} {statistics.median(theirs) * 1e3:>9.2f} {ratio:>11.3f}"
              f"  {statistics.median(mine) / one['this']:.2f}, {statistics.median(theirs) / one['other']:.2f}")


if __name__ == "__main__":
    main()
