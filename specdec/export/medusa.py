"""Medusa heads in vLLM's MedusaModel layout.

vLLM's ResidualBlock is x + SiLU(W x + b) (one layer: num_hidden_layers 1, medusa_fc_bias true),
then each head's own LM head over the truncated vocabulary and token_map, which scatters its logits
back to the target's ids. Our heads have no LM head of their own: they use the target's rows of
their draft vocabulary, so the export writes those rows (one copy per head) and needs the target.
"""

from __future__ import annotations

import re

import torch

from specdec.errors import ConfigError, SpecdecError
from specdec.heads.medusa import MedusaConfig

BLOCK = re.compile(r"blocks\.(\d+)\.(weight|bias)")


def head_config(config: dict) -> MedusaConfig:
    try:
        return MedusaConfig(**config)
    except TypeError as e:
        raise ConfigError(f"head.json's config is not a Medusa config: {e}") from e


def check_vocabulary(vocab_ids: torch.Tensor, vocab_size: int) -> None:
    """vocab_ids [Vd]: distinct ascending target ids."""
    if vocab_ids.dtype != torch.int64 or not bool((vocab_ids[1:] > vocab_ids[:-1]).all()):
        raise SpecdecError("the heads' vocab_ids are not strictly ascending int64 target ids")
    if len(vocab_ids) and (int(vocab_ids[0]) < 0 or int(vocab_ids[-1]) >= vocab_size):
        raise SpecdecError(f"the heads' vocab_ids leave [0, {vocab_size})")


def engine_tensors(state: dict[str, torch.Tensor], config: MedusaConfig, lm_head: torch.Tensor,
                   dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our state dict + the target's LM head [V, H] -> vLLM's names; refuse any tensor without a counterpart."""
    out = {}
    for name, tensor in state.items():
        block = BLOCK.fullmatch(name)
        if block and int(block[1]) < config.num_heads:
            out[f"blocks.{block[1]}.layers.0.{block[2]}"] = tensor  # W [H, H], b [H]
        elif name == "vocab_ids":
            check_vocabulary(tensor, config.vocab_size)
            rows = lm_head[tensor]  # [Vd, H]: the target's LM head rows the heads draft with
            out.update({f"lm_heads.{k}.weight": rows.clone() for k in range(config.num_heads)})
            out["token_map"] = tensor
        else:
            raise SpecdecError(f"the heads' tensor {name} {tuple(tensor.shape)} has no counterpart in vLLM's "
                               "MedusaModel; it cannot be exported without changing what the heads compute")
    return {name: t.to(dtype) if t.is_floating_point() else t for name, t in out.items()}


def config_json(config: MedusaConfig, dtype: str) -> dict:
    return {"architectures": ["MedusaModel"], "model_type": "medusa", "num_heads": config.num_heads,
            "num_hidden_layers": 1, "hidden_size": config.hidden_size, "vocab_size": config.vocab_size,
            "truncated_vocab_size": config.draft_vocab, "medusa_fc_bias": True, "torch_dtype": dtype}
