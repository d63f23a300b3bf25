"""What the engine's and the batch's whole-run tests share: the prompt, the drafters (one of each
family, on the tiny models), a fixed cost model, and the exact law of the first tokens a sampled
run gives, with the goodness-of-fit test of observed runs against it."""

from __future__ import annotations

import numpy as np
import torch

from specdec.cost_model import CostModel, DraftCost
from specdec.drafters import (DraftModelDrafter, EagleDrafter, EarlyExitDrafter, MedusaDrafter, PromptLookupDrafter,
                              SuffixDrafter)
from specdec.engine import Engine
from specdec.sampling import SamplingParams, logits_to_probs
from random_heads import random_eagle_head, random_medusa_heads, small_eagle3_head
from stat_helpers import gof_pvalue

# A prompt with repeats, so that prompt lookup finds matches from the first round.
PROMPT = [5, 9, 12, 7, 5, 9, 12, 7, 30, 5, 9]


def lookup():
    """Prompt lookup down to one-token matches: on a tiny random model, longer ones are rare."""
    return PromptLookupDrafter(max_ngram=3, min_ngram=1)


def drafters(target, draft_model):
    return {
        "ngram": lookup(),
        "draft": DraftModelDrafter(draft_model, target),
        "early": EarlyExitDrafter(target, exit_layer=1),  # the first of the tiny model's two layers
        "suffix": SuffixDrafter(corpus=[PROMPT[2:] + [8, 3, 8, 36], [12, 7, 5, 9, 44, 2]], min_match=1),
        "eagle": EagleDrafter(target, random_eagle_head(target)),
        "eagle-tree": EagleDrafter(target, random_eagle_head(target), name="eagle-tree", tree_budget=10, top_k=3),
        "eagle3": EagleDrafter(target, small_eagle3_head(target), name="eagle3", tree_budget=10, top_k=3),
        "eagle3-chain": EagleDrafter(target, small_eagle3_head(target), name="eagle3-chain"),
        "medusa": MedusaDrafter(target, random_medusa_heads(target), paths=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
    }


def synthetic_costs(pool: list, draft_cost: float) -> CostModel:
    """A fixed cost model (deterministic choices): T(k) = 1 + 0.2 (k − 1); lookups cost nothing (the
    policy asks them every round and trims what they propose), model drafters `draft_cost` per token."""
    lookups = (PromptLookupDrafter, SuffixDrafter)
    return CostModel({k: 1 + 0.2 * (k - 1) for k in range(1, 18)},  # up to the largest tree's pass
                     {d.name: DraftCost(0.0, 0.0 if isinstance(d, lookups) else draft_cost) for d in pool},
                     calibrate=False)


def auto_engine(target, draft_model, draft_cost: float = 0.02) -> Engine:
    """The adaptive policy over all the drafters above."""
    pool = list(drafters(target, draft_model).values())
    return Engine(target, pool, cost_model=synthetic_costs(pool, draft_cost))



NEW_TOKENS, TOP_K, RUNS = 4, 3, 3000
SAMPLING = SamplingParams(temperature=1.0, top_k=TOP_K)


def exact_first_tokens_law(model) -> dict[tuple[int, ...], float]:
    """P(first NEW_TOKENS tokens = s) = Π p(s_i | prompt, s_<i), enumerated over the top-k support."""
    net = model.net
    law = {(): 1.0}
    for _ in range(NEW_TOKENS):
        grown = {}
        for prefix, prob in law.items():
            logits = net.forward(torch.tensor([PROMPT + list(prefix)]), net.new_cache(64), last_only=True)[0, -1]
            probs = logits_to_probs(logits, SAMPLING)
            for token in probs.nonzero().squeeze(1).tolist():
                grown[prefix + (token,)] = prob * float(probs[token])
        law = grown
    return law




def law_pvalue(counts: dict[tuple[int, ...], int], law: dict[tuple[int, ...], float]) -> float:
    """p-value of observed first-token sequences (`counts`) against the exact `law` (runs outside
    its support form one more cell, expected 0)."""
    keys = list(law)
    observed = np.array([counts.get(k, 0) for k in keys] + [sum(c for k, c in counts.items() if k not in law)])
    return gof_pvalue(observed, np.array([law[k] for k in keys] + [0.0]))
