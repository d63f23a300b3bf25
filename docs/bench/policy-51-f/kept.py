"""How much of a prompt's gain a drafter keeps when the prompt comes last in a bench of 12.

`specdec bench` runs prompts one after the other, so the prompt alone and the prompt last of 12 are
timed in different minutes of the host (policy-51-e: plain ran at 46–51 tokens/s in one, 55–59 in
the other), and three repeats of a 15% gain do not settle the share kept. Here one process holds
three methods on one loaded model and times them interleaved, the same prompt, many repeats:

- plain;
- `alone`: suffix (γ auto) in a fresh engine, as `specdec bench` runs it on this prompt alone;
- `last`: suffix (γ auto) in an engine that first ran the other prompts as `specdec bench` runs them
  (each at the bench's repeats, learning held until a prompt's runs are done, then learned), so its
  corpus and its policy's long-run estimates are those it has last of 12.

Learning is held while the prompt is timed (as the bench does within a prompt), so every repeat of
`alone` drafts from an empty corpus and every repeat of `last` from the eleven answers. The order of
the three turns by one each repeat (runner.run_order); `--reverse` starts from the other end, for the
second process. Prints each repeat's tokens/s, the medians, and gain kept = (last − 1)/(alone − 1)
with each × plain the ratio of medians.

    .venv/bin/python docs/bench/policy-51-f/kept.py --last 92 --repeats 12 [--reverse] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from specdec.bench.methods import SpecdecMethod
from specdec.bench.prompts import PromptCase, load_prompts
from specdec.bench.runner import run_case, run_order, warm_up
from specdec.decode.engine import Engine
from specdec.drafters import build_drafters
from specdec.runtime import load_model
from specdec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, seed=0)


def run_before(method: SpecdecMethod, cases: list[PromptCase], tokenizer, repeats: int, tokens: int) -> None:
    """The prompts before the last, as the bench runs them for one method: repeats with learning held."""
    for number, case in enumerate(cases, 1):
        method.hold_learning()
        for _ in range(repeats):
            run_case(method, case, tokenizer, GREEDY, tokens)
        method.release_learning()
        print(f"  ran prompt {case.id} ({number}/{len(cases)}) before the last", file=sys.stderr, flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", default="../shared/workloads/spec_bench_dev.jsonl")
    p.add_argument("--per-category", type=int, default=None)
    p.add_argument("--last", required=True, help="the id of the prompt timed (it comes last of the set)")
    p.add_argument("--repeats", type=int, default=12)
    p.add_argument("--bench-repeats", type=int, default=3, help="each earlier prompt's runs, as in the bench")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--reverse", action="store_true", help="the methods in the other order (second process)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    cases = load_prompts(args.prompts, args.per_category)
    last = next((c for c in cases if c.id == args.last), None)
    if last is None:
        p.error(f"--last {args.last}: no such prompt among {[c.id for c in cases]}")
    before = [c for c in cases if c.id != args.last]
    target = load_model()
    tokenizer = target.tokenizer
    plain = SpecdecMethod("plain", Engine(target), 1, ignore_eos=True)
    alone, last_of = (SpecdecMethod(name, Engine(target, build_drafters("suffix", target)), "auto", ignore_eos=True)
                      for name in ("alone", f"last of {len(cases)}"))
    methods = [plain, alone, last_of]
    for method in methods[1:]:
        method.engine.costs(method.max_gamma)
    warm_up(methods, tokenizer, GREEDY.temperature)  # as run_bench does first
    run_before(last_of, before, tokenizer, args.bench_repeats, args.max_new_tokens)
    order = list(reversed(methods)) if args.reverse else methods
    runs: dict[str, list[dict]] = {m.name: [] for m in methods}
    for method in methods[1:]:
        method.hold_learning()
    for repeat in range(args.repeats):
        for method in run_order(order, 0, repeat):
            run = run_case(method, last, tokenizer, GREEDY, args.max_new_tokens)
            drafted = sum(s.drafted for s in run.stats)
            accepted = sum(s.accepted for s in run.stats)
            runs[method.name].append({"tokens_per_second": run.new_tokens / run.seconds, "new_tokens": run.new_tokens,
                                      "drafted": drafted, "accepted": accepted, "at": time.time()})
        print(f"  repeat {repeat + 1}/{args.repeats}: " + ", ".join(
            f"{n} {r[-1]['tokens_per_second']:.1f}" for n, r in runs.items()), file=sys.stderr, flush=True)
    median = {n: statistics.median(r["tokens_per_second"] for r in rs) for n, rs in runs.items()}
    times_plain = {n: median[n] / median["plain"] for n in median}
    gain = times_plain["alone"] - 1
    kept = (times_plain[last_of.name] - 1) / gain if gain > 0 else None  # no gain alone: nothing to keep
    summary = {"prompt": args.last, "before": [c.id for c in before], "repeats": args.repeats,
               "order": [m.name for m in order], "median_tokens_per_second": median, "times_plain": times_plain,
               "gain_kept": kept, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    for name in median:
        rounds = {(r["drafted"], r["accepted"]) for r in runs[name]}
        print(f"{name:12s} median {median[name]:6.1f} tokens/s  × plain {times_plain[name]:.3f}  "
              f"drafted/accepted {sorted(rounds)}")
    print(f"gain kept last of {len(cases)}: {kept:.1%}" if kept is not None else "no gain alone: nothing to keep")
    return 0


if __name__ == "__main__":
    sys.exit(main())
