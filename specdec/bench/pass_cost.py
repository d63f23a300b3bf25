"""How long one target pass takes as a function of the number of tokens it scores.

    python -m specdec.bench.pass_cost [--model M] [--context 300] [--max-tokens 8] [--repeats 15]

Prefills `--context` tokens, then times passes over 1..max-tokens new tokens (each rolled back
afterwards), and prints the median milliseconds and the ratio to a one-token pass. This is the
cost curve that speculative decoding's arithmetic depends on: the seed formula assumes a pass over
γ+1 tokens costs the same as over one, which holds on a GPU and not on a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys

from specdec.cost_model import measure_pass_costs
from specdec.errors import SpecdecError


def main(argv: list[str] | None = None) -> int:
    from specdec.runtime import load_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    try:
        model = load_model(args.model, device=args.device, dtype=args.dtype)
    except SpecdecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    costs = measure_pass_costs(model.net, args.context, list(range(1, args.max_tokens + 1)), args.repeats)
    one = costs[1]
    for size, seconds in costs.items():
        print(f"{size} tokens: {seconds * 1000:7.1f} ms  ({seconds / one:.2f}× a one-token pass)")
    print(json.dumps({"context": args.context, "ms": {k: round(v * 1000, 2) for k, v in costs.items()},
                      "ratio": {k: round(v / one, 3) for k, v in costs.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
