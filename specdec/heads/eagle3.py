"""The EAGLE-3 head: one decoder layer that drafts from three of the target's layers.

The target's feature of token t is g_t = fc([a_t ; m_t ; z_t]): the residual streams entering a low,
a middle and a high layer (by default 2, L/2 and L − 3, what vLLM and SGLang capture), fused by one
linear layer (3 H → H, no bias). The head's layer reads the pair (g_t, x_{t+1}): q, k and v come from
[input_layernorm(embedding of x_{t+1}) ; hidden_norm(g_t)] (2 H wide), the residual is g_t itself;
then post_attention_layernorm and an MLP shaped like the target's. Its output h (before the final
norm) is the feature fed back with the next drafted token; lm_head(norm(h)) gives logits over a
reduced draft vocabulary of Vd tokens (its own LM head, not the target's). The target's embedding
is shared, never stored.

The weights are named as SpecForge saves them and as vLLM, SGLang and llama.cpp load them (`fc`,
`midlayer.*`, `norm`, `lm_head`, `d2t`, `t2d`), with q/k/v and gate/up fused as this runtime runs
them: the export splits them without loss. d2t [Vd] int64 holds offsets (target id = draft id +
d2t[draft id]); t2d [V] bool marks the target ids in the draft vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from specdec.heads.eagle import EagleConfig, head_rope
from specdec.runtime.config import ModelConfig
from specdec.runtime.llama import GATE_UP_SLOTS, MLP, QKV_SLOTS, Attention, RMSNorm, rope_inverse_frequencies
from specdec.runtime.quant import QuantizedLinear


@dataclass
class Eagle3Config(EagleConfig):
    """EagleConfig's shape of the layer, plus what an EAGLE-3 head reads."""

    aux_layers: list[int] = field(default_factory=list)  # the target layers whose input it reads, low to high
    target_hidden_size: int = 0  # the target's hidden size (the fc reads 3 × it); 0: hidden_size

    def __post_init__(self) -> None:
        self.aux_layers = list(self.aux_layers)
        if not self.target_hidden_size:
            self.target_hidden_size = self.hidden_size
        if len(self.aux_layers) < 2:  # (the head tells fused inputs from its own h by their width)
            raise ValueError(f"an EAGLE-3 head reads at least two target layers, got {self.aux_layers}")

    @classmethod
    def for_target(cls, target: ModelConfig, draft_vocab: int, aux_layers: tuple[int, ...]) -> Eagle3Config:
        return cls(target.hidden_size, target.intermediate_size, target.num_heads, target.num_kv_heads,
                   target.head_dim, target.rms_norm_eps, target.rope_theta, target.vocab_size,
                   min(draft_vocab, target.vocab_size), list(aux_layers), target.hidden_size)


def default_aux_layers(num_layers: int) -> list[int]:
    """The inputs of layers 2, L/2 and L − 3: what vLLM, SGLang and llama.cpp's converter capture by
    default (kept inside the model's layers, without repeats, for models under 6 layers)."""
    return sorted({min(2, num_layers - 1), num_layers // 2, max(0, num_layers - 3)})


class Eagle3Layer(nn.Module):
    """The head's decoder layer (SpecForge's `midlayer`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, input_size=2 * config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, hidden, embeds, cos, sin, cache, mask, causal: bool = False) -> torch.Tensor:
        """hidden, embeds: [B, T, H] -> [B, T, H] (before the final norm)."""
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)  # [B, T, 2H]
        x = hidden + self.self_attn(x, cos, sin, cache, 0, mask, causal)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.config = config
        layer_config = config.layer_config()
        self.fc = nn.Linear(len(config.aux_layers) * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(layer_config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab, dtype=torch.long), persistent=True)  # [Vd]
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool), persistent=True)  # [V]
        self.register_buffer("inv_freq", rope_inverse_frequencies(layer_config), persistent=False)

    def set_vocabulary(self, vocab_ids: torch.Tensor) -> None:
        """vocab_ids [Vd]: the target ids of the draft vocabulary, ascending."""
        if vocab_ids.shape != self.d2t.shape or not bool((vocab_ids[1:] > vocab_ids[:-1]).all()):
            raise ValueError(f"the draft vocabulary must be {self.d2t.shape[0]} distinct ascending target ids")
        self.d2t.copy_(vocab_ids - torch.arange(len(vocab_ids)))
        self.t2d.zero_()
        self.t2d[vocab_ids] = True

    @property
    def vocab_ids(self) -> torch.Tensor:  # [Vd] target ids, ascending
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, D]."""
        return head_rope(self.inv_freq, positions, self.norm.weight.dtype)

    def forward(
        self,
        features: torch.Tensor,  # [B, T, 3 Ht]: the target's aux states (fused here), or [B, T, H]: the head's own h
        next_embeds: torch.Tensor,  # [B, T, H]: the target's embedding of x_{t+1}
        positions: torch.Tensor,  # [B, T]: t
        cache,  # StaticKVCache with one layer (drafting) or train.unroll.GrowingCache (training)
        mask: torch.Tensor | None = None,  # [B or 1, 1, T, S] bool; None with causal
        causal: bool = False,
    ) -> torch.Tensor:  # [B, T, H]: h, before the final norm (fed back when drafting further)
        if features.shape[-1] != self.config.hidden_size:
            features = self.fc(features)
        cos, sin = self.rope(positions)
        return self.midlayer(features, next_embeds, cos, sin, cache, mask, causal)

    def logits(self, h: torch.Tensor, kernels=None) -> torch.Tensor:  # [..., H] -> [..., Vd]
        return self.lm_head(self.norm(h, kernels))

    def kernel_weights(self) -> list[torch.Tensor] | None:
        """The layer's weights as the `eagle3_layer` kernel takes them (see layer.cpp), when its
        linears are quantized (`quantize_linears`, beside a quantized target); else None."""
        layer = self.midlayer
        linears = (layer.self_attn.qkv, layer.self_attn.o, layer.mlp.gate_up, layer.mlp.down)
        if not all(isinstance(linear, QuantizedLinear) for linear in linears) or any(
                linear.bias is not None for linear in linears[1:]):
            return None
        bias = linears[0].bias if linears[0].bias is not None else torch.empty(0)
        return [layer.input_layernorm.weight.detach(), layer.hidden_norm.weight.detach(), *linears[0].slots(QKV_SLOTS),
                bias, linears[1].packed, layer.post_attention_layernorm.weight.detach(), *linears[2].slots(GATE_UP_SLOTS),
                linears[3].packed]
