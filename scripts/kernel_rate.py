"""How a quantized layer's time grows with the rows it scores: the kernel's side of T(k)/T(1).

    python scripts/kernel_rate.py                       # Q4_1 and Q4_K, layers 4096 -> 14336, M = 1..16
    python scripts/kernel_rate.py --types Q4_1 --rows 1,2,4,8,16 --repeats 30
    python scripts/kernel_rate.py --against OLD.so       # this build against an earlier one, paired

Random blocks of each type (gguf_synthetic.random_blocks) packed as a GGUF layer is, several layers
of [out, in] so that their bytes (about 150 MB) stream from memory as a model's do; each call runs the
layers one after the other. Per M: the median seconds of a call, weight bytes per second, integer
multiply-accumulates per second (M · out · in · layers / time), the time over M = 1's, and beside
it the bound of a kernel that reads its weights no faster than at M = 1 and computes at the rate
it reaches at the largest M: max(1, M · MACs / that rate / T(1)). Where the measured ratio sits near
that bound, the rows' compute, not the weights' bytes, sets the time.

With --against (another build's .so, e.g. one under ~/.cache/specdec/kernels/ from earlier
sources), both builds score the same packed layers in one process, taking turns within every repeat
(the order alternating), so the host's drift falls on both alike: per M, each build's median and the
median of the paired ratios this / other.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from specdec.runtime.gguf_synthetic import random_blocks
from specdec.runtime.quant import QuantizedLinear, pack_gguf_tensors


def layers_of(type_name: str, out_features: int, in_features: int, count: int) -> list[QuantizedLinear]:
    rng = np.random.default_rng(0)
    layers = []
    for _ in range(count):
        raw = torch.from_numpy(random_blocks(type_name, out_features, in_features, rng))  # [out, bytes per row]
        layers.append(QuantizedLinear.from_packed([pack_gguf_tensors([raw], [type_name], [None])], [type_name]))
    return layers


def call_seconds(layers: list[QuantizedLinear], x: torch.Tensor) -> float:
    start = time.perf_counter()
    for layer in layers:
        layer(x)
    return time.perf_counter() - start


def seconds_per_call(layers: list[QuantizedLinear], rows: int, in_features: int, repeats: int) -> float:
    x = torch.randn(rows, in_features)  # [M, in]
    call_seconds(layers, x)  # warm: page in, first-call allocations
    return statistics.median(call_seconds(layers, x) for _ in range(repeats))


def paired_seconds(layers: list[QuantizedLinear], others: list[QuantizedLinear], rows: int, in_features: int,
                   repeats: int) -> tuple[list[float], list[float]]:
    """Both builds on the same rows, taking turns in every repeat (who goes first alternates)."""
    x = torch.randn(rows, in_features)  # [M, in]
    call_seconds(layers, x), call_seconds(others, x)
    mine, theirs = [], []
    for repeat in range(repeats):
        if repeat % 2:
            theirs.append(call_seconds(others, x))
            mine.append(call_seconds(layers, x))
        else:
            mine.append(call_seconds(layers, x))
            theirs.append(call_seconds(others, x))
    return mine, theirs


def load_build(library: Path):
    """An earlier build of the kernels (a .so the project compiled), imported under its own name."""
    if not library.is_file():
        raise SystemExit(f"--against: no such file {library}; give the .so of a build under ~/.cache/specdec/kernels/")
    spec = importlib.util.spec_from_file_location(library.stem, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_kernel(layers: list[QuantizedLinear], module) -> list[QuantizedLinear]:
    """The same layers (the same packed weights, not copied) multiplied by another build's kernel."""
    others = []
    for layer in layers:
        other = QuantizedLinear.from_packed(layer.parts, layer.layouts)
        other.multiply = module.quant_linear
        others.append(other)
    return others


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default="Q4_1,Q4_K")
    p.add_argument("--rows", default="1,2,3,4,6,8,12,16")
    p.add_argument("--out-features", type=int, default=14336)
    p.add_argument("--in-features", type=int, default=4096)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--against", type=Path, help="another build's .so, timed in turn with this one")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    other_build = load_build(args.against) if args.against else None
    print(f"{torch.get_num_threads()} threads; {args.layers} layers of [{args.out_features}, {args.in_features}]")
    for type_name in args.types.split(","):
        layers = layers_of(type_name, args.out_features, args.in_features, args.layers)
        weight_bytes = sum(part.numel() for layer in layers for part in layer.parts)
        macs = args.out_features * args.in_features * args.layers
        print(f"\n{type_name}: {weight_bytes / 1e6:.0f} MB of weights")
        if other_build is not None:
            others = with_kernel(layers, other_build)
            print(f"{'M':>3} {'this ms':>8} {'other ms':>8} {'this/other':>10} {'this GMAC/s':>11}")
            for m in rows:
                mine, theirs = paired_seconds(layers, others, m, args.in_features, args.repeats)
                ratio = statistics.median(a / b for a, b in zip(mine, theirs))
                print(f"{m:>3} {statistics.median(mine) * 1e3:8.2f} {statistics.median(theirs) * 1e3:8.2f} "
                      f"{ratio:10.3f} {m * macs / statistics.median(mine) / 1e9:11.1f}")
            continue
        seconds = {m: seconds_per_call(layers, m, args.in_features, args.repeats) for m in rows}
        compute = max(rows) * macs / seconds[max(rows)]  # MAC/s at the largest M
        print(f"{'M':>3} {'ms':>8} {'GB/s':>6} {'GMAC/s':>7} {'T(M)/T(1)':>9} {'compute-bound':>13}")
        for m in rows:
            bound = max(1.0, m * macs / compute / seconds[1])
            print(f"{m:>3} {seconds[m] * 1e3:8.2f} {weight_bytes / seconds[m] / 1e9:6.1f} "
                  f"{m * macs / seconds[m] / 1e9:7.1f} {seconds[m] / seconds[1]:9.2f} {bound:13.2f}")


if __name__ == "__main__":
    main()
