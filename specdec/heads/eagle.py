"""The EAGLE head: a one-layer autoregressive drafter at the feature level.

The target's feature f_t is its final-norm hidden state at token t (what its LM head reads). The
head reads the pair (f_t, embedding of x_{t+1}), fuses them with one linear layer, runs one
decoder layer (attention over the earlier pairs through its own KV cache, and an MLP, shaped like
one of the target's layers), and predicts f_{t+1}; the target's LM head applied to the prediction
gives the draft distribution of x_{t+2}. Drafting further feeds the head its own predicted
feature with the token it drafted.

It shares the target's embedding and LM head (neither is stored with the head). On a small model
the LM head dominates a draft step (49152 × 576 multiply-adds for SmolLM2-135M, a fifth of the
model's weights), so the head drafts over a reduced vocabulary: the `draft_vocab` most frequent
answer tokens of its training data (EAGLE-3 and FR-Spec do the same). Its rows of the LM head are
gathered once at load. A token outside it is never drafted; verification is unchanged, so this
costs acceptance, never exactness.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from specdec.runtime.config import ModelConfig
from specdec.runtime.llama import DecoderLayer, rope_inverse_frequencies


@dataclass
class EagleConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int  # the target's
    draft_vocab: int  # tokens the head may propose (the most frequent in its training data)

    @classmethod
    def for_target(cls, target: ModelConfig, draft_vocab: int) -> EagleConfig:
        return cls(target.hidden_size, target.intermediate_size, target.num_heads, target.num_kv_heads,
                   target.head_dim, target.rms_norm_eps, target.rope_theta, target.vocab_size,
                   min(draft_vocab, target.vocab_size))

    def layer_config(self) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
                           num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, max_position_embeddings=1 << 20,
                           rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta)

    def to_dict(self) -> dict:
        return asdict(self)


class EagleHead(nn.Module):
    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.config = config
        layer_config = config.layer_config()
        self.fuse = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layer = DecoderLayer(layer_config)
        self.register_buffer("vocab_ids", torch.arange(config.draft_vocab), persistent=True)  # [Vd] target ids
        self.register_buffer("inv_freq", rope_inverse_frequencies(layer_config), persistent=False)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, D]."""
        return head_rope(self.inv_freq, positions, self.layer.attn_norm.weight.dtype)

    def forward(
        self,
        features: torch.Tensor,  # [B, T, hidden]: f_t (the target's, or the head's own predictions)
        next_embeds: torch.Tensor,  # [B, T, hidden]: the target's embedding of x_{t+1}
        positions: torch.Tensor,  # [B, T]: t
        cache,  # StaticKVCache with one layer (drafting) or train.unroll.GrowingCache (training)
        mask: torch.Tensor | None = None,  # [B or 1, 1, T, S] bool; None with causal
        causal: bool = False,
    ) -> torch.Tensor:  # [B, T, hidden]: predicted f_{t+1}
        x = self.fuse(torch.cat((features, next_embeds), dim=-1))  # [B, T, hidden]
        cos, sin = self.rope(positions)
        return self.layer(x, cos, sin, cache, 0, mask, causal)


def head_rope(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A head's RoPE: inv_freq [D/2], positions [B, T] -> cos, sin [B, 1, T, D] in `dtype` (the dtype
    of a float parameter: the linears may be quantized)."""
    angles = positions[..., None].float() * inv_freq  # [B, T, D/2]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]
