"""EAGLE drafting: the head (`heads/eagle.py`) proposes from the target's own features.

State per request: the target's features of every committed token but the last (the engine hands
them over after the prefill and after each verification pass: `accept_features`), and the head's
one-layer KV cache over the pairs (f_t, x_{t+1}) already fed. A proposal feeds the pairs not yet
fed (the last committed token's pair among them), then drafts one token at a time, feeding the
head its own predicted feature with each drafted token, and finally rolls its cache back to the
committed pairs. The target is only read (embedding and LM head rows), never changed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.drafters.base import Draft, draft_chain
from specdec.errors import ConfigError
from specdec.heads.eagle import EagleConfig, EagleHead, lm_head_weight
from specdec.heads.files import load_head
from specdec.runtime.kv_cache import StaticKVCache
from specdec.runtime.llama import LlamaModel
from specdec.sampling import SamplingParams


def load_eagle_head(folder: Path, target) -> EagleHead:
    meta, weights = load_head(folder, "eagle", target)
    head = EagleHead(EagleConfig(**meta["config"]))
    head.load_state_dict(weights)
    return head.to(device=target.net.device, dtype=target.net.dtype).eval()


class EagleDrafter:
    wants_features = True  # the engine passes the target's final hidden states of committed tokens

    def __init__(self, target, head: EagleHead, name: str = "eagle") -> None:
        if not isinstance(target.net, LlamaModel):
            raise ConfigError("EAGLE drafting reads the target's features: it needs the lean runtime (--runtime lean)")
        self.net = target.net
        self.head = head
        self.name = name
        self.head_rows = lm_head_weight(self.net)[head.vocab_ids].clone()  # [Vd, hidden]
        self.cache: StaticKVCache | None = None
        self.features: torch.Tensor | None = None  # [max_len, hidden]: f_t of committed tokens
        self.known = 0  # features known for tokens [0, known)

    def begin(self, prompt_ids: list[int], max_len: int, target_cache=None) -> None:
        c = self.head.config
        self.cache = StaticKVCache(1, c.num_kv_heads, c.head_dim, max_len + 1, device=self.net.device, dtype=self.net.dtype)
        self.features = torch.zeros(max_len, c.hidden_size, device=self.net.device, dtype=self.net.dtype)
        self.known = 0

    def accept_features(self, hidden: torch.Tensor) -> None:  # hidden: [n, hidden] of the next n committed tokens
        n = hidden.shape[0]
        self.features[self.known:self.known + n] = hidden
        self.known += n

    @torch.inference_mode()
    def _step(self, features: torch.Tensor, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed pairs (features [n, hidden], ids [n]) at the next positions of the head's cache;
        returns the last predicted feature [hidden] and the draft logits over the full vocabulary [V]."""
        device = self.net.device
        past, n = self.cache.length, len(ids)
        self.cache.reserve(n)
        positions = torch.arange(past, past + n, device=device)[None]  # [1, n]
        embeds = self.net.embed(torch.tensor([ids], device=device))  # [1, n, hidden]
        causal = past == 0 and n > 1
        mask = None if causal else LlamaModel._attention_mask(past, n, None, device)
        predicted = self.head(features[None], embeds, positions, self.cache, mask, causal)[0, -1]  # [hidden]
        self.cache.advance(n)
        logits = torch.full((self.net.vocab_size,), float("-inf"), device=device)  # [V]
        logits[self.head.vocab_ids] = (self.head_rows @ predicted).float()
        return predicted, logits

    def propose(self, tokens: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        if max_tokens <= 0:
            return Draft([], None)
        if self.known != len(tokens) - 1:
            raise RuntimeError(f"{self.name} has features for {self.known} tokens, expected {len(tokens) - 1} "
                               "(every committed token but the last): the engine must call accept_features")
        start = min(self.cache.length, self.known - 1)  # pairs (f_t, x_{t+1}) for t >= start are not fed yet
        self.cache.truncate(start)
        state = {"feature": None}

        def next_logits(ids: list[int]) -> torch.Tensor:
            if state["feature"] is None:  # the committed pairs: the target's own features
                features = self.features[start:self.known]  # [n, hidden]
            else:  # a drafted token: the head's own prediction of the feature before it
                features = state["feature"][None]  # [1, hidden]
            state["feature"], logits = self._step(features, ids)
            return logits

        try:
            return draft_chain(next_logits, tokens[start + 1:], max_tokens, params, generator)
        finally:
            self.cache.truncate(self.known)
