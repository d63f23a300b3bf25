"""A lean Llama-family transformer: Llama 2/3, SmolLM2, Qwen2 (q/k/v bias) and Mistral.

Design:
- `ModelConfig` fills everything; grouped-query attention; tied or separate LM head.
- q, k, v are one fused projection and gate, up another (fused at load time, once).
- RoPE in the Hugging Face "rotate half" layout, with llama3 and linear scaling.
- Every pass writes its tokens into a `StaticKVCache` at slots `[length, length + T)`. RoPE
  positions are given separately (a token tree puts siblings at the same position), and so is the
  attention pattern among the new tokens (`tree_mask`); all cached tokens are visible to all new ones.
- Logits come back in float32 whatever the weights' dtype, so that sampling is the same everywhere.
- On a float32 CPU, passes of up to `INVARIANT_MAX_TOKENS` tokens run the norms, SiLU·up and
  attention through the batch-invariant kernels (`runtime/kernels`): with the linear layers'
  weight-only quantized kernels (`runtime/quant.py`), which are batch-invariant too, row i of a
  pass over k tokens, chain or tree, gives the same logits bit for bit as a one-token pass at the
  same position. Longer passes (prompts) and left-padded batches use PyTorch's SDPA.
- RoPE's cos and sin come from a table that grows by doubling and never recomputes a position.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specdec.runtime.config import ModelConfig
from specdec.runtime.kernels import invariant_kernels
from specdec.runtime.kv_cache import StaticKVCache
from specdec.runtime.quant import QuantizedLinear

# Passes up to this many tokens (verification of chains and trees, one-token decoding) use the
# batch-invariant kernels; longer ones are prompts, shared alike by plain and speculative decoding.
INVARIANT_MAX_TOKENS = 64
NO_TREE_MASK = torch.empty(0, dtype=torch.bool)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, kernels=None) -> torch.Tensor:  # x: [..., D]
        if kernels is not None:
            return kernels.rms_norm(x, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [D/2] for RoPE, with llama3 or linear scaling applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling
    if not scaling:
        return inv_freq.float()
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return (inv_freq / factor).float()
    # llama3: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled).float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:  # x: [..., D]
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        q_dim = config.num_heads * config.head_dim
        kv_dim = config.num_kv_heads * config.head_dim
        self.qkv = nn.Linear(config.hidden_size, q_dim + 2 * kv_dim, bias=config.attention_bias)
        self.o = nn.Linear(q_dim, config.hidden_size, bias=False)
        self.split = (q_dim, kv_dim, kv_dim)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, hidden]
        cos: torch.Tensor,  # [B, 1, T, D]
        sin: torch.Tensor,  # [B, 1, T, D]
        cache: StaticKVCache,
        layer: int,
        mask: torch.Tensor | None,  # [B, 1, T, S] bool, True = may attend; None = all S, or causal
        causal: bool = False,  # a prefill of an empty cache: plain causal attention (fast kernel)
        kernels=None,  # the batch-invariant kernels (then `mask` is unused and `tree_mask` rules)
        tree_mask: torch.Tensor = NO_TREE_MASK,  # [T, T] bool, or empty for causal
    ) -> torch.Tensor:  # [B, T, hidden]
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        q = q.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = k.view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        v = v.view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        keys, values = cache.write(layer, k, v)  # [B, Hkv, S, D], S = length + T
        if kernels is not None:
            past = keys.shape[2] - seq
            out = kernels.attention(q, cache.keys[layer], cache.values[layer], past, tree_mask)  # [B, H, T, D]
        else:
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, is_causal=causal, enable_gqa=self.num_kv_heads != self.num_heads
            )  # [B, H, T, D]
        return self.o(out.transpose(1, 2).reshape(batch, seq, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, kernels=None) -> torch.Tensor:  # x: [B, T, hidden]
        gate_up = self.gate_up(x)  # [B, T, 2 * intermediate]
        if kernels is not None:
            return self.down(kernels.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)  # each [B, T, intermediate]
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, cache, layer, mask, causal, kernels=None, tree_mask=NO_TREE_MASK):
        """x: [B, T, hidden] -> [B, T, hidden]; `kernels`: the batch-invariant kernels, or None."""
        x = x + self.attn(self.attn_norm(x, kernels), cos, sin, cache, layer, mask, causal, kernels, tree_mask)
        return x + self.mlp(self.mlp_norm(x, kernels), kernels)


class LlamaModel(nn.Module):
    """The network. Call it through `forward`; the engine owns the cache it is given."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)
        self.rope_table: torch.Tensor | None = None  # [P, 2, D]: cos and sin of positions [0, P)
        self._fused_weights: list[torch.Tensor] | None = None  # built on first use (after the weights are set)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_context(self) -> int:
        return self.config.max_context

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    @torch.inference_mode()
    def lm_head_weight(self) -> torch.Tensor:
        """The LM head matrix [V, hidden] (a prepacked or quantized head keeps no dense copy: a
        quantized one is dequantized exactly, a prepacked float one multiplies the identity)."""
        if isinstance(self.lm_head, nn.Linear):
            return self.lm_head.weight.detach()
        if isinstance(self.lm_head, QuantizedLinear):
            return self.lm_head.dequantized_weight()
        eye = torch.eye(self.config.hidden_size, device=self.device, dtype=self.dtype)
        return self.lm_head(eye).T.contiguous()  # [V, hidden]

    def new_cache(self, max_len: int, batch_size: int = 1) -> StaticKVCache:
        c = self.config
        return StaticKVCache(
            c.num_layers, c.num_kv_heads, c.head_dim, max_len,
            batch_size=batch_size, device=self.device, dtype=self.dtype,
        )

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, D] in the model's dtype, read from the table."""
        needed = int(positions.max()) + 1
        table = self.rope_table
        if table is None or table.shape[0] < needed:
            start = 0 if table is None else table.shape[0]
            size = max(256, start * 2, 1 << (needed - 1).bit_length())
            angles = torch.arange(start, size, device=self.device).float()[:, None] * self.inv_freq  # [P', D/2]
            angles = torch.cat((angles, angles), dim=-1)  # [P', D]
            new = torch.stack((angles.cos(), angles.sin()), dim=1).to(self.dtype)  # [P', 2, D]
            table = new if table is None else torch.cat((table, new))
            self.rope_table = table
        rows = table[positions]  # [B, T, 2, D]
        return rows[:, None, :, 0], rows[:, None, :, 1]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        cache: StaticKVCache,
        positions: torch.Tensor | None = None,  # [B, T]; default: cache.length + arange(T)
        tree_mask: torch.Tensor | None = None,  # [T, T] bool, True = new token i sees new token j
        last_only: bool = False,
        exit_layer: int | None = None,  # run only the first `exit_layer` layers, then norm and head
        slot_mask: torch.Tensor | None = None,  # [B, length + T] bool: the slots each row may see (left padding)
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """logits, float32: [B, T, V], or [B, 1, V] when last_only; with return_hidden also the
        final-norm hidden states the LM head reads, [B, T, hidden] (all T, also when last_only)."""
        batch, seq = input_ids.shape
        cache.reserve(seq)
        past = cache.length
        if positions is None:
            positions = torch.arange(past, past + seq, device=input_ids.device).expand(batch, seq)
        cos, sin = self._rope(positions)
        kernels = self._invariant_kernels(seq, slot_mask)
        causal = past == 0 and seq > 1 and tree_mask is None and slot_mask is None
        if kernels is not None:
            mask = None
            tree_mask = NO_TREE_MASK if tree_mask is None else tree_mask.to(torch.bool)
        else:
            mask = None if causal else cache_attention_mask(past, seq, tree_mask, input_ids.device)
            tree_mask = NO_TREE_MASK
        if slot_mask is not None:
            mask = self._with_slot_mask(mask, slot_mask, past, seq)
        x = self.embed(input_ids)  # [B, T, hidden]
        depth = len(self.layers) if exit_layer is None else min(exit_layer, len(self.layers))
        fused = self._fused_layer_weights() if kernels is not None else None
        if fused is not None:  # all layers in one call, the same arithmetic as the loop below
            c = self.config
            x = kernels.decoder_layers(x, fused, depth, cos[:, 0], sin[:, 0], cache.keys,
                                       cache.values, past, tree_mask, c.rms_norm_eps, c.num_heads, c.num_kv_heads)
        else:
            for i in range(depth):  # (slicing the ModuleList would build a new one per pass)
                x = self.layers[i](x, cos, sin, cache, i, mask, causal, kernels, tree_mask)
        cache.advance(seq)
        if last_only and not return_hidden:
            x = x[:, -1:]
        hidden = self.norm(x, kernels)  # [B, T, hidden]
        logits = self.lm_head(hidden[:, -1:] if last_only else hidden).float()
        return (logits, hidden) if return_hidden else logits

    def _fused_layer_weights(self) -> list[torch.Tensor] | None:
        """The layers' weights as `decoder_layers` takes them (7 per layer), when every linear is
        quantized (the default on a GGUF); else None, and the layers run one by one."""
        if self._fused_weights is None:
            weights: list[torch.Tensor] = []
            for layer in self.layers:
                linears = (layer.attn.qkv, layer.attn.o, layer.mlp.gate_up, layer.mlp.down)
                if not all(isinstance(lin, QuantizedLinear) for lin in linears) or any(
                        lin.bias is not None for lin in linears[1:]):
                    self._fused_weights = []
                    return None
                bias = layer.attn.qkv.bias if layer.attn.qkv.bias is not None else torch.empty(0)
                weights += [layer.attn_norm.weight.detach(), layer.attn.qkv.packed, bias, layer.attn.o.packed,
                            layer.mlp_norm.weight.detach(), layer.mlp.gate_up.packed, layer.mlp.down.packed]
            self._fused_weights = weights
        return self._fused_weights or None

    def _invariant_kernels(self, seq: int, slot_mask: torch.Tensor | None):
        """The batch-invariant kernels for this pass, or None (PyTorch's operators)."""
        if seq > INVARIANT_MAX_TOKENS or slot_mask is not None:
            return None
        if self.device.type != "cpu" or self.dtype != torch.float32:
            return None
        return invariant_kernels()

    @staticmethod
    def _with_slot_mask(mask: torch.Tensor | None, slot_mask: torch.Tensor, past: int, seq: int) -> torch.Tensor:
        """[B, 1, T, past + T]: `mask` (causal when None) and, per row, only the slots `slot_mask` allows.
        A padding token still sees itself, so that no query row is empty (an empty row would make
        NaN keys and values that poison the real tokens' attention through 0 · NaN)."""
        device = slot_mask.device
        if mask is None:
            mask = torch.ones(seq, past + seq, dtype=torch.bool, device=device).tril(past)[None, None]
        itself = torch.zeros(seq, past + seq, dtype=torch.bool, device=device)
        itself[torch.arange(seq), past + torch.arange(seq)] = True
        return mask & slot_mask[:, None, None, : past + seq] | itself


def cache_attention_mask(past: int, seq: int, tree_mask: torch.Tensor | None, device) -> torch.Tensor | None:
    """[1, 1, T, past + T] bool: every new token sees the cache, and the new tokens per `tree_mask`
    (causal by default). None when a single token is added (it sees everything)."""
    if tree_mask is None:
        if seq == 1:
            return None
        tree_mask = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    prefix = torch.ones(seq, past, dtype=torch.bool, device=device)
    return torch.cat((prefix, tree_mask.to(device)), dim=1)[None, None]
