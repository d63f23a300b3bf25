"""Suffix drafting on prompt 92, alone and last of 12, as `specdec bench` orders the runs (greedy, 3
repeats, 128 new tokens a turn, learning held until a prompt's repeats are done): the tokens drafted
and accepted on prompt 92, split by the text the verified proposal matched in (request or corpus).

    .venv/bin/python docs/bench/policy-51-sources/replay.py

Greedy rounds depend on the tokens and the cost table only, so the counts repeat in any process that
reads the same table; no timing is taken.
"""

import collections

from specdec.bench.methods import SpecdecMethod
from specdec.bench.prompts import PromptCase, load_prompts
from specdec.bench.runner import run_case
from specdec.control.policy import AdaptivePolicy
from specdec.decode.engine import Engine
from specdec.drafters import build_drafters
from specdec.runtime import load_model
from specdec.sampling import SamplingParams

PROMPTS = "docs/bench/policy-51-partial/last-of-12/{}/prompts.jsonl"
by_source = collections.defaultdict(lambda: [0, 0, 0])  # source → [rounds, drafted, accepted]
observe = AdaptivePolicy.observe


def counting_observe(self, plan, drafted, accepted, *args, **kwargs):
    if plan.drafter is not None and drafted:
        tally = by_source[kwargs.get("source", "request")]
        tally[0] += 1
        tally[1] += drafted
        tally[2] += accepted
    return observe(self, plan, drafted, accepted, *args, **kwargs)


AdaptivePolicy.observe = counting_observe
target = load_model("smollm2-135m")
for which in ("alone", "last"):
    cases = load_prompts(PROMPTS.format(which))
    method = SpecdecMethod("suffix", Engine(target, build_drafters("suffix", target)), "auto", ignore_eos=True)
    run_case(method, PromptCase("warm-up", "warm-up", ("Hello",)), target.tokenizer, SamplingParams(temperature=0), 8)
    for case in cases:
        method.hold_learning()
        by_source.clear()
        drafted = accepted = 0
        for repeat in range(3):
            run = run_case(method, case, target.tokenizer, SamplingParams(temperature=0, seed=repeat), 128)
            drafted += sum(s.drafted for s in run.stats)
            accepted += sum(s.accepted for s in run.stats)
        method.release_learning()
        if case is cases[-1]:
            print(f"{which}: prompt {case.id} drafted {drafted}, accepted {accepted};",
                  "; ".join(f"{source}: {r} rounds, {d} drafted, {a} accepted" for source, (r, d, a) in by_source.items()))
