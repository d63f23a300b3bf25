"""The protocol every drafter follows.

A drafter proposes up to `max_tokens` tokens to follow `tokens` (the prompt and everything committed
so far). It returns a `Draft`: the token ids and, for drafters that sample, q — the distribution each
token was drawn from, after the same temperature / top-k / top-p transform as the target. Drafters
that look tokens up (n-gram, suffix) return q = None: a point-mass proposal.

Drafters never change the target model, and leave its cache's length as they found it. A drafter
with a model of its own owns that model's cache and keeps it in step with `tokens` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.sampling import SamplingParams


@dataclass
class Draft:
    tokens: list[int]  # [k] proposed ids, k <= max_tokens (k = 0: nothing to propose this round)
    q: torch.Tensor | None = None  # [k, V] float32 draft probabilities; None = point mass

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(Protocol):
    name: str

    def begin(self, prompt_ids: list[int], max_len: int, target_cache=None) -> None:
        """Start a new request. `max_len` bounds the length of `tokens` in later calls.

        `target_cache` is the target's cache for this request. Only a drafter built from the target
        itself (early exit) uses it, and it must leave its length as it found it."""

    def propose(
        self, tokens: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        """Propose up to `max_tokens` ids to follow `tokens`."""
