"""A separate, smaller draft model that shares the target's tokenizer.

It keeps a KV cache of its own, in step with the committed tokens: before each proposal it rolls its
cache back to the longest prefix it shares with the context (drafts the target rejected are dropped)
and feeds what is new. Then it drafts autoregressively, sampling with the same transform as the
target (greedy when the target is greedy) and returning q for speculative sampling.
"""

from __future__ import annotations

import torch

from specdec.drafters.base import Draft, Drafter, draft_chain
from specdec.drafters.spec import DrafterSpec
from specdec.errors import ConfigError
from specdec.runtime.loading import LanguageModel, load_model
from specdec.sampling import SamplingParams


class DraftModelDrafter(Drafter):
    def __init__(self, draft: LanguageModel, target: LanguageModel) -> None:
        check_same_vocabulary(draft, target)
        self.model = draft
        self.name = f"draft:{draft.name}"
        self.cache = None
        self.cached_ids: list[int] = []  # the ids whose keys/values are in self.cache, in order

    def weights_digest(self) -> str:
        return self.model.digest()  # its config, weight files, form and kernels

    def begin(self, prompt_ids: list[int], max_len: int, target_cache=None) -> None:
        if max_len > self.model.max_context:
            raise ConfigError(
                f"the draft model's context ({self.model.max_context}) is shorter than this request "
                f"needs ({max_len}); lower max_new_tokens or use another draft model"
            )
        self.cache = self.model.net.new_cache(max_len)
        self.cached_ids = []

    def propose(
        self, tokens: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        if max_tokens <= 0:
            return Draft([], None)
        net = self.model.net
        device = net.device
        common = self._common_prefix(tokens)  # rolled back to it; the last token is always fed (its logits)
        self.cache.truncate(common)
        self.cached_ids = self.cached_ids[:common]

        def next_logits(ids: list[int]) -> torch.Tensor:  # [V]
            self.cached_ids += ids
            return net.forward(torch.tensor([ids], device=device), self.cache, last_only=True)[0, -1]

        return draft_chain(next_logits, tokens[common:], max_tokens, params, generator)

    def _common_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens` but the last the cache holds already (the drafts the target rejected
        are not among them)."""
        common, limit = 0, min(len(self.cached_ids), len(tokens) - 1)
        while common < limit and self.cached_ids[common] == tokens[common]:
            common += 1
        return common

    def catch_up_tokens(self, tokens: list[int]) -> int:
        return len(tokens) - 1 - self._common_prefix(tokens)


def check_same_vocabulary(draft: LanguageModel, target: LanguageModel) -> None:
    """Refuse a draft model whose tokens do not mean the same as the target's."""
    if draft.vocab_size != target.vocab_size:
        raise ConfigError(
            f"the draft model has {draft.vocab_size} output tokens and the target {target.vocab_size}; "
            "a draft model must share the target's tokenizer and vocabulary"
        )
    if draft.tokenizer.vocab() != target.tokenizer.vocab():
        raise ConfigError(
            "the draft model's tokenizer differs from the target's (same size, different tokens); "
            "a draft model must share the target's tokenizer"
        )


def build(spec: DrafterSpec, target: LanguageModel, **load) -> DraftModelDrafter:
    """`draft:MODEL`: the model loaded as the target was (`load`: device, dtype, runtime)."""
    return DraftModelDrafter(load_model(spec.arg, **load), target)
