"""Self-speculation: the target drafts with its own first L layers, final norm and LM head.

No second model is held in memory, and no cache of its own is kept: the drafter runs on the
target's cache. For every committed token the target's verification pass has already written the
keys and values of all layers, and the first L of them are exactly what the shallow draft network
computes (same weights, same inputs) — so the draft reuses them instead of recomputing them. While
drafting it writes layers < L of the cache at slots past the committed length and then restores
the length; the verification pass that follows overwrites those slots for all layers before any
read. The engine checks that the length comes back unchanged.

Exactness does not depend on the draft's quality: verification is the usual lossless rule. The
quality does: the early layers of a model not trained for early exit predict the next token less
often than a trained drafter, so L is a trade-off between acceptance and draft cost.
"""

from __future__ import annotations

import torch

from specdec.drafters.base import Draft, Drafter, draft_chain
from specdec.drafters.spec import DrafterSpec
from specdec.errors import ConfigError
from specdec.runtime.llama import LlamaModel
from specdec.runtime.loading import LanguageModel
from specdec.sampling import SamplingParams


class EarlyExitDrafter(Drafter):
    def __init__(self, target: LanguageModel, exit_layer: int) -> None:
        if not isinstance(target.net, LlamaModel):
            raise ConfigError("early-exit drafting needs the lean runtime (--runtime lean)")
        layers = target.net.config.num_layers
        if not 1 <= exit_layer < layers:
            raise ConfigError(f"the exit layer must be in [1, {layers - 1}] for this {layers}-layer model, got {exit_layer}")
        self.net = target.net
        self.exit_layer = exit_layer
        self.name = f"early:{exit_layer}"
        self.cache = None

    def begin(self, prompt_ids: list[int], max_len: int, target_cache=None) -> None:
        if target_cache is None:
            raise ConfigError("early-exit drafting shares the target's cache; the engine must pass it")
        self.cache = target_cache

    def propose(
        self, tokens: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        if max_tokens <= 0:
            return Draft([], None)
        committed = self.cache.length  # every committed token but the last
        device = self.net.device

        def next_logits(ids: list[int]) -> torch.Tensor:  # [V]
            block = torch.tensor([ids], device=device)  # [1, len(ids)]
            return self.net.forward(block, self.cache, last_only=True, exit_layer=self.exit_layer)[0, -1]

        try:  # feed the last committed token: the only one the cache does not hold
            return draft_chain(next_logits, tokens[committed:], max_tokens, params, generator)
        finally:
            self.cache.truncate(committed)


def build(spec: DrafterSpec, target: LanguageModel, **load) -> EarlyExitDrafter:
    """`early:L`: the target's first L layers."""
    return EarlyExitDrafter(target, int(spec.arg))
