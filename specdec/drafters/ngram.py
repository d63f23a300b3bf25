"""Prompt lookup: propose what followed the latest earlier occurrence of the last n tokens.

For n from `max_ngram` down to `min_ngram`, find the most recent earlier position where the last n
tokens of the context (prompt and generated text) occurred, and propose the up to `max_tokens`
tokens that followed it there. A point-mass proposal (q = None). Costs no model call, and almost no
time: an index (`NgramIndex`) keeps the latest start of every n-gram, and grows by the tokens each
round commits, so a proposal is a few dictionary lookups whatever the context's length.

Defaults (n from 4 down to 2): a one-token match proposes too often on a CPU, where a verification
pass over several tokens costs 1.4–2.3× a one-token pass (docs/bench/pass-cost-output.txt). In one
exploratory run on 13 Spec-Bench prompts (one per category, 128 tokens, greedy, a single repeat),
min_ngram = 2 gave a mean speed-up over plain decoding of 1.25× at γ = 4, min_ngram = 1 gave 1.15×.
"""

from __future__ import annotations

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.spec import DrafterSpec
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
        self.index = NgramIndex(self.max_ngram, self.min_ngram)  # this request's own
        self.index.follow(prompt_ids, 0)  # the prompt indexed now, so that a round's ask indexes only new tokens

    def propose(
        self, tokens: list[int], max_tokens: int, params: SamplingParams, generator
    ) -> Draft:
        proposal, n = self.index.follow(tokens, max_tokens)
        return Draft(proposal, match_length=n)


class NgramIndex:
    """For each n in [min_ngram, max_ngram], the latest start of every n-gram of a context that has a
    token after it; it follows a context that grows at its end, and starts over on any other."""

    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.sizes = range(max_ngram, min_ngram - 1, -1)  # longest first
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self.tokens: list[int] = []

    def follow(self, tokens: list[int], max_tokens: int) -> tuple[list[int], int]:
        """(what followed the most recent earlier occurrence of the longest matching last n-gram of
        `tokens`, n); ([], 0) when none of the sizes occurred before."""
        self._sync(tokens)
        length = len(tokens)
        if max_tokens <= 0:
            return [], 0
        for n in self.sizes:
            if n <= length - 1:
                start = self.latest[n].get(tuple(tokens[length - n:]))
                if start is not None:
                    return tokens[start + n: start + n + max_tokens], n
        return [], 0

    def _sync(self, tokens: list[int]) -> None:
        known = len(self.tokens)
        if len(tokens) < known or tokens[:known] != self.tokens:  # not the indexed context grown: start over
            self.latest = {n: {} for n in self.sizes}
            self.tokens, known = [], 0
        self.tokens.extend(tokens[known:])
        for after in range(max(known, 1), len(tokens)):  # n-grams that end just before token `after`
            for n in self.sizes:
                if after >= n:
                    self.latest[n][tuple(tokens[after - n: after])] = after - n


def lookup(tokens: list[int], max_tokens: int, max_ngram: int, min_ngram: int) -> tuple[list[int], int]:
    """(continuation of the most recent earlier match of the longest matching suffix n-gram, n), from
    a fresh index of `tokens`."""
    return NgramIndex(max_ngram, min_ngram).follow(tokens, max_tokens)


def build(spec: DrafterSpec, target, **load) -> PromptLookupDrafter:
    """`ngram[:N]` (`drafters/spec.py`): n-grams of 2 to N tokens (N = 1: single tokens too)."""
    if not spec.arg:
        return PromptLookupDrafter()
    n = int(spec.arg)
    return PromptLookupDrafter(max_ngram=n, min_ngram=min(2, n))
