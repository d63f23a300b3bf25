"""Any transformers `AutoModelForCausalLM` behind the lean runtime's interface (chains only).

For models the lean runtime does not cover, and as the oracle in tests. The cache is transformers'
`DynamicCache`; rolling back a chain crops it. Token trees need the lean runtime's `compact`.
Weights load from safetensors only, and remote code is never run.
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import torch

from specdec.errors import ConfigError, ModelLoadError
from specdec.runtime.kv_cache import CacheLength


class TransformersCache(CacheLength):
    def __init__(self, max_len: int) -> None:
        from transformers import DynamicCache

        super().__init__(max_len)
        self.inner = DynamicCache()

    def truncate(self, length: int) -> None:
        self.check_truncate(length)
        if length < self.length:
            self.inner.crop(length - self.length)  # a negative count removes that many (all versions)
        self.length = length

    def copy_from(self, other: "TransformersCache") -> None:
        """Hold what `other` holds."""
        self.inner = copy.deepcopy(other.inner)
        self.length = other.length

    def compact(self, keep: torch.Tensor) -> None:
        raise ConfigError("token trees need the lean runtime (--runtime lean); transformers models run chains only")


class TransformersCausalLM:
    def __init__(self, folder: Path, device: str, dtype: torch.dtype) -> None:
        from transformers import AutoModelForCausalLM

        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                str(folder), dtype=dtype, use_safetensors=True, trust_remote_code=False
            ).to(device)
        except (OSError, ValueError) as err:
            raise ModelLoadError(f"transformers cannot load {folder}: {err}") from None
        self.model.eval()
        # transformers 5 renamed the cache argument from `past_key_values` to `cache`.
        accepted = inspect.signature(self.model.forward).parameters
        self.cache_argument = "cache" if "cache" in accepted else "past_key_values"
        config = self.model.config
        self.vocab_size = self.model.get_output_embeddings().weight.shape[0]
        self.max_context = getattr(config, "max_position_embeddings", None) or 2048

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def new_cache(self, max_len: int) -> TransformersCache:
        return TransformersCache(max_len)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [1, T]
        cache: TransformersCache,
        positions: torch.Tensor | None = None,  # [1, T]
        tree_mask: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:  # [1, T, V] float32 ([1, 1, V] when last_only)
        if tree_mask is not None:
            raise ConfigError("token trees need the lean runtime (--runtime lean)")
        seq = input_ids.shape[1]
        cache.reserve(seq)
        if positions is None:
            positions = torch.arange(cache.length, cache.length + seq, device=input_ids.device)[None]
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            **{self.cache_argument: cache.inner},
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        cache.length += seq
        return out.logits.float()

    def forward_segments(self, input_ids: torch.Tensor, segments: list, logit_rows: torch.Tensor | None = None,
                         return_hidden: bool = False, aux_layers: tuple[int, ...] = ()) -> torch.Tensor:
        """The runtime's pass over segments, for one segment (one sequence): logits [M, V]."""
        if len(segments) != 1:
            raise ConfigError("batched decoding (several requests in one pass) needs the lean runtime (--runtime lean)")
        if return_hidden or aux_layers:
            raise ConfigError("drafters that read the target's features (EAGLE, Medusa) need the lean runtime (--runtime lean)")
        segment = segments[0]
        positions = None if segment.positions is None else segment.positions[None]
        logits = self.forward(input_ids[None], segment.cache, positions, segment.tree_mask)[0]  # [T, V]
        return logits if logit_rows is None else logits[logit_rows]

