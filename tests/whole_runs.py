"""What the engine's and the batch's whole-run tests share: the prompt, the drafters (one of each kind
in `specdec.drafters.spec`, on the tiny models), a fixed cost model, and the exact law of the first
tokens a sampled run gives (top-k 3 over 4 tokens, or top-p 0.8 over 3), with the goodness-of-fit
test of observed runs against it."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from specdec.control.cost_model import CostModel, DraftCost
from specdec.drafters.spec import kind_names
from specdec.drafters import (DraftModelDrafter, EagleDrafter, EarlyExitDrafter, MedusaDrafter, PromptLookupDrafter,
                              SuffixDrafter)
from specdec.decode.engine import Engine
from specdec.sampling import SamplingParams, logits_to_probs
from random_heads import random_eagle_head, random_medusa_heads, small_eagle3_head
from stat_helpers import gof_pvalue
from tolerances import law_normalisation_error

# A prompt with repeats, so that prompt lookup finds matches from the first round.
PROMPT = [5, 9, 12, 7, 5, 9, 12, 7, 30, 5, 9]


def lookup():
    """Prompt lookup down to one-token matches: on a tiny random model, longer ones are rare."""
    return PromptLookupDrafter(max_ngram=3, min_ngram=1)


# Every kind `--drafter` takes but `none` (no drafter) and `auto` (the adaptive policy over a pool:
# `auto_engine`): each has a test drafter below, so a new kind cannot be left out of the tests.
SPECULATIVE_KINDS = [kind for kind in kind_names() if kind not in ("none", "auto")]


def drafters(target, draft_model) -> dict:
    """A test drafter of each of SPECULATIVE_KINDS (the kinds' own arguments made concrete: the tiny
    draft model, seeded random heads, a small corpus), in that order."""
    pool = {
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
    assert set(pool) == set(SPECULATIVE_KINDS), (f"the drafter kinds {sorted(set(SPECULATIVE_KINDS) - set(pool))} have no "
                                                 f"test drafter, {sorted(set(pool) - set(SPECULATIVE_KINDS))} are no kind")
    return {kind: pool[kind] for kind in SPECULATIVE_KINDS}


def synthetic_costs(pool: list, draft_cost: float, verify_growth: float = 0.2) -> CostModel:
    """A fixed cost model (deterministic choices): T(k) = 1 + verify_growth (k − 1); lookups cost
    nothing (the policy asks them every round and trims what they propose), model drafters
    `draft_cost` per token."""
    lookups = (PromptLookupDrafter, SuffixDrafter)
    return CostModel({k: 1 + verify_growth * (k - 1) for k in range(1, 18)},  # up to the largest tree's pass
                     {d.name: DraftCost(0.0, 0.0 if isinstance(d, lookups) else draft_cost) for d in pool},
                     calibrate=False)


def auto_engine(target, draft_model, draft_cost: float = 0.02, verify_growth: float = 0.2) -> Engine:
    """The adaptive policy over all the drafters above."""
    pool = list(drafters(target, draft_model).values())
    return Engine(target, pool, cost_model=synthetic_costs(pool, draft_cost, verify_growth))



RUNS = 3000


@dataclasses.dataclass(frozen=True)
class LawSetting:
    """What a whole-run law test samples: the first `new_tokens` tokens of a run with `sampling`."""

    sampling: SamplingParams
    new_tokens: int

    def seeded(self, seed: int) -> SamplingParams:
        return dataclasses.replace(self.sampling, seed=seed)


# top-k 3 over 4 tokens: 3^4 = 81 sequences (see test_engine's docstring for the cells and the power)
NEW_TOKENS, TOP_K = 4, 3
TOP_K_LAW = LawSetting(SamplingParams(temperature=1.0, top_k=TOP_K), NEW_TOKENS)
# top-p 0.8 over 3 tokens: the nucleus holds 12 tokens at the first step, 2,350 sequences in all (175
# passes to enumerate); at 3,000 runs 110 cells expect at least 5 counts and the rest (40% of the mass)
# are pooled into one: 111 cells, 110 degrees of freedom
TOP_P_LAW = LawSetting(SamplingParams(temperature=1.0, top_p=0.8), 3)


def exact_first_tokens_law(model, setting: LawSetting = TOP_K_LAW) -> dict[tuple[int, ...], float]:
    """P(first new_tokens tokens = s) = Π p(s_i | prompt, s_<i), enumerated over the sampling's support."""
    net = model.net
    law = {(): 1.0}
    for _ in range(setting.new_tokens):
        grown = {}
        for prefix, prob in law.items():
            logits = net.forward(torch.tensor([PROMPT + list(prefix)]), net.new_cache(64), last_only=True)[0, -1]
            probs = logits_to_probs(logits, setting.sampling)
            for token in probs.nonzero().squeeze(1).tolist():
                grown[prefix + (token,)] = prob * float(probs[token])
        law = grown
    return law




def law_pvalue(counts: dict[tuple[int, ...], int], law: dict[tuple[int, ...], float]) -> float:
    """p-value of observed first-token sequences (`counts`) against the exact `law` (runs outside
    its support form one more cell, expected 0)."""
    keys = list(law)
    observed = np.array([counts.get(k, 0) for k in keys] + [sum(c for k, c in counts.items() if k not in law)])
    return gof_pvalue(observed, np.array([law[k] for k in keys] + [0.0]), normalised_within=law_normalisation_error(law))
