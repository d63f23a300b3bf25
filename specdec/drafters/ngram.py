"""Prompt lookup: propose what followed the latest earlier occurrence of the last n tokens.

For n from `max_ngram` down to `min_ngram`, find the most recent earlier position where the last n
tokens of the context (prompt and generated text) occurred, and propose the up to `max_tokens`
tokens that followed it there. A point-mass proposal (q = None). Costs no model call.

Defaults (n from 4 down to 2): a one-token match proposes too often on a CPU, where a verification
pass over several tokens costs 1.4–2.3× a one-token pass (docs/bench/pass-cost-output.txt). In one
exploratory run on 13 Spec-Bench prompts (one per category, 128 tokens, greedy, a single repeat),
min_ngram = 2 gave a mean speed-up over plain decoding of 1.25× at γ = 4, min_ngram = 1 gave 1.15×.
"""

from __future__ import annotations

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.errors import ConfigError
from specdec.sampling import SamplingParams


class PromptLookupDrafter(Drafter):
    looks_up = True

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ConfigError(f"n-gram sizes must satisfy 1 <= min ({min_ngram}) <= max ({max_ngram})")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = "ngram" if (min_ngram, max_ngram) == (2, 4) else f"ngram:{min_ngram}-{max_ngram}"

    def begin(self, prompt_ids: list[int], max_len: int, target_cache=None) -> None:
        pass  # stateless: each proposal searches the whole context

    def propose(
        self, tokens: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        proposal, n = lookup(tokens, max_tokens, self.max_ngram, self.min_ngram)
        return Draft(proposal, match_length=n)


def lookup(tokens: list[int], max_tokens: int, max_ngram: int, min_ngram: int) -> tuple[list[int], int]:
    """(continuation of the most recent earlier match of the longest matching suffix n-gram, n)."""
    if max_tokens <= 0:
        return [], 0
    context = torch.tensor(tokens)  # [N]
    length = context.numel()
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = context[: length - 1].unfold(0, n, 1)  # [N-n, n]: every n-gram that has a successor
        hits = (windows == context[length - n :]).all(dim=1).nonzero().squeeze(1)  # [M] start positions
        if hits.numel():
            start = int(hits[-1]) + n
            return tokens[start : start + max_tokens], n
    return [], 0
