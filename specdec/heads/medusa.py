"""Medusa heads: K small heads on the target's last feature, head k guessing the token k + 1 ahead.

Head k reads the target's feature f_t (its final-norm hidden state at token t, which its own LM head
turns into x_{t+1}) and proposes x_{t+k+1}: one residual block h + SiLU(W_k h + b_k), then the
target's LM head rows of a reduced draft vocabulary (as for EAGLE: the most frequent answer tokens;
nothing of the LM head is stored with the heads). W_k starts at zero, so an untrained head k
proposes what the target would say next, a sensible start (Medusa-1's initialisation). The
candidates of all heads together form a static token tree (`tree.from_paths`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class MedusaConfig:
    hidden_size: int
    vocab_size: int  # the target's
    num_heads: int  # K: tokens guessed beyond the target's own next one
    draft_vocab: int

    def to_dict(self) -> dict:
        return asdict(self)


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaConfig) -> None:
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(nn.Linear(config.hidden_size, config.hidden_size) for _ in range(config.num_heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.register_buffer("vocab_ids", torch.arange(config.draft_vocab), persistent=True)  # [Vd] target ids

    def forward(self, features: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [K, ..., hidden]
        return torch.stack([features + F.silu(block(features)) for block in self.blocks])
