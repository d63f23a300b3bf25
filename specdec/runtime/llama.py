"""A lean Llama-family transformer: Llama 2/3, SmolLM2, Qwen2 (q/k/v bias), Qwen3 (q/k norms), Mistral,
Phi-3/4 and Gemma 3 (q/k norms, a norm on each branch's output, GELU, sliding-window local layers with
their own RoPE base, embeddings scaled by √hidden).

Design:
- `ModelConfig` fills everything; grouped-query attention; tied or separate LM head.
- q, k, v are one fused projection and gate, up another (fused at load time, once).
- RoPE in the Hugging Face "rotate half" layout, with llama3 and linear scaling.
- A pass runs over segments, one per sequence (`Segment`): each has its own `StaticKVCache` and
  writes its tokens at slots `[length, length + T_b)` of it. The linear layers run over the rows of
  all segments at once (the weights are read once per pass, whatever the number of sequences);
  attention runs segment by segment. RoPE positions are given separately (a token tree puts siblings
  at the same position), and so is the attention pattern among a segment's new tokens
  (`tree_mask`); all of a segment's cached tokens are visible to all its new ones. `forward` is the
  pass over one sequence.
- Logits come back in float32 whatever the weights' dtype, so that sampling is the same everywhere.
- On a float32 CPU every pass runs the norms, SiLU·up and attention through the batch-invariant
  kernels (`runtime/kernels`): with the linear layers' weight-only quantized kernels
  (`runtime/quant.py`), which are batch-invariant too, a row gives the same logits bit for bit
  whatever else is in the pass: a row of a k-token chain or tree, a one-token step, a prompt in one
  pass or in chunks, and any sequence beside others in a batch. Without the kernels (no compiler,
  another device or dtype) PyTorch's SDPA and linears run the same steps, equal up to rounding.
- The cache holds float16 where the kernels run the attention (`kv_cache="auto"`, the default; they
  widen it exactly, so a row still gets the same bits alone and beside others): half the bytes to
  hold and to read per pass. `kv_cache="float32"` keeps float32; elsewhere it is the model's dtype.
- RoPE's cos and sin come from a table that grows by doubling and never recomputes a position (two
  tables where local layers turn by another base).
- A sliding window (Gemma 3's local layers) hides the keys W or more positions back; the cache keeps
  every position, so rollbacks and trees work as for a global layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import ConfigError, ModelLoadError
from specdec.runtime.config import ModelConfig
from specdec.runtime.kernels import invariant_kernels
from specdec.runtime.kv_cache import StaticKVCache
from specdec.runtime.quant import QuantizedLinear

NO_TREE_MASK = torch.empty(0, dtype=torch.bool)
LAYER_WEIGHTS = 14  # tensors per layer in `decoder_layers`' weight list (kWeightsPerLayer in layer.cpp)
QKV_SLOTS, GATE_UP_SLOTS = 3, 2  # slots of a fused linear's parts there (kQkvSlots, kGateUpSlots)
KV_CACHE_CHOICES = ("auto", "float16", "float32")  # what the cache holds (see `LlamaModel.cache_dtype`)


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


def rope_inverse_frequencies(config: ModelConfig, local: bool = False) -> torch.Tensor:
    """Inverse frequencies [R/2] for RoPE over the R = config.rope_dim dimensions it turns, with
    llama3, linear or LongRoPE (its short factors) scaling applied; `local`: Gemma 3's windowed
    layers' own base, unscaled."""
    dim = config.rope_dim
    # on the CPU even inside a meta-device context (a meta arange would import torch._dynamo)
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim
    if local:
        return (1.0 / (config.rope_local_theta ** exponents)).float()
    inv_freq = 1.0 / (config.rope_theta ** exponents)
    divisors = config.longrope["short_factor"] if config.longrope else config.rope_freq_factors
    if divisors is not None:  # as llama.cpp applies a GGUF's rope_freqs (or LongRoPE's short factors)
        factors = torch.tensor(divisors, dtype=torch.float64, device="cpu")
        if factors.shape != inv_freq.shape:
            raise ModelLoadError(f"the RoPE factors hold {factors.numel()} values; the heads need {inv_freq.numel()}")
        inv_freq = inv_freq / factors
    scaling = config.rope_scaling
    if not scaling or config.longrope:
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


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: x [..., D] at the angles cos, sin [..., R] (broadcast to x) -> [..., D]. The first R of
    the D dimensions turn; the others (R < D: Phi-4-mini's partial RoPE) pass unchanged."""
    turned = cos.shape[-1]
    if turned == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head = x[..., :turned]
    return torch.cat((head * cos + rotate_half(head) * sin, x[..., turned:]), dim=-1)


@dataclass
class Segment:
    """One sequence's share of a pass: its cache and how many new tokens it has."""

    cache: StaticKVCache  # batch 1; the new tokens go to slots [cache.length, cache.length + tokens)
    tokens: int  # T_b
    positions: torch.Tensor | None = None  # [T_b] RoPE positions; default: cache.length + arange(T_b)
    tree_mask: torch.Tensor | None = None  # [T_b, T_b] bool, True = new token i sees new token j; None: causal


@dataclass
class SegmentAttention:
    """How one segment's new tokens attend, worked out once per pass for all layers."""

    start: int  # its first row in the pass
    tokens: int
    cache: StaticKVCache
    past: int  # cached tokens before the pass
    tree_mask: torch.Tensor  # the kernels': [T_b, T_b] bool, or empty for causal
    sdpa_mask: torch.Tensor | None  # SDPA's: [1, 1, T_b, past + T_b] bool, or None (causal or one token)
    causal: bool  # SDPA: an empty cache and a causal block (its fast path)
    positions: torch.Tensor  # [T_b] the new tokens' positions (for SDPA's sliding-window masks)
    tree: torch.Tensor | None  # [T_b, T_b] the tree mask as given, or None (causal)
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)  # window -> SDPA's mask, made once a pass

    @classmethod
    def of(cls, segment: Segment, start: int, positions: torch.Tensor, kernels) -> SegmentAttention:
        past, seq, tree = segment.cache.length, segment.tokens, segment.tree_mask
        if kernels is not None:
            return cls(start, seq, segment.cache, past, NO_TREE_MASK if tree is None else tree.to(torch.bool), None, False,
                       positions, tree)
        causal = past == 0 and seq > 1 and tree is None
        mask = None if causal else cache_attention_mask(past, seq, tree, segment.cache.keys.device)
        return cls(start, seq, segment.cache, past, NO_TREE_MASK, mask, causal, positions, tree)

    def windowed_sdpa_mask(self, window: int) -> torch.Tensor:
        """SDPA's mask [1, 1, T_b, past + T_b] for a layer that sees the last `window` positions only
        (the kernels' rule: cached slot s lies at position s); made once a pass for all layers of that window."""
        if window not in self.windowed:
            device = self.cache.keys.device
            mask = cache_attention_mask(self.past, self.tokens, self.tree, device)
            if mask is None:
                mask = torch.ones(1, 1, self.tokens, self.past + self.tokens, dtype=torch.bool, device=device)
            keys = torch.cat((torch.arange(self.past, device=device), self.positions.to(device)))  # [past + T_b]
            self.windowed[window] = mask & (self.positions.to(device)[:, None] - keys[None] < window)
        return self.windowed[window]


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, input_size: int | None = None) -> None:
        """`input_size`: the width of what q, k and v are computed from (default hidden_size; an
        EAGLE-3 head's layer reads [embedding ; feature], twice that)."""
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        q_dim = config.num_heads * config.head_dim
        kv_dim = config.num_kv_heads * config.head_dim
        self.qkv = nn.Linear(input_size or config.hidden_size, q_dim + 2 * kv_dim, bias=config.attention_bias)
        self.o = nn.Linear(q_dim, config.hidden_size, bias=False)
        self.split = (q_dim, kv_dim, kv_dim)
        # Qwen3: each head's q and k RMS-normed over head_dim before RoPE
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def normed(self, q: torch.Tensor, k: torch.Tensor, kernels=None) -> tuple[torch.Tensor, torch.Tensor]:
        """q [..., H, D] and k [..., Hkv, D] through the q/k norms, where the model has them (Qwen3)."""
        if self.q_norm is None:
            return q, k
        return self.q_norm(q, kernels), self.k_norm(k, kernels)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, input_size]
        cos: torch.Tensor,  # [B, 1, T, R]: R = the dimensions RoPE turns (rotate)
        sin: torch.Tensor,  # [B, 1, T, R]
        cache,  # a cache with `write(layer, k, v)` (an EAGLE head's own, or its training cache)
        layer: int,
        mask: torch.Tensor | None,  # [B or 1, 1, T, S] bool, True = may attend; None = all S, or causal
        causal: bool = False,  # an empty cache: plain causal attention (SDPA's fast path)
    ) -> torch.Tensor:  # [B, T, hidden]
        """Rows in lock step over one cache, with any mask (an EAGLE head, drafting or training)."""
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        q, k = self.normed(q.view(batch, seq, self.num_heads, self.head_dim), k.view(batch, seq, self.num_kv_heads, self.head_dim))
        q = q.transpose(1, 2)  # [B, H, T, D]
        k = k.transpose(1, 2)  # [B, Hkv, T, D]
        v = v.view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        keys, values = cache.write(layer, rotate(k, cos, sin), v)  # [B, Hkv, S, D]
        out = F.scaled_dot_product_attention(rotate(q, cos, sin), keys, values, attn_mask=mask, is_causal=causal,
                                             enable_gqa=self.num_kv_heads != self.num_heads)  # [B, H, T, D]
        return self.o(out.transpose(1, 2).reshape(batch, seq, -1))

    def forward_segments(
        self,
        x: torch.Tensor,  # [N, hidden]: the rows of every segment
        cos: torch.Tensor,  # [N, 1, R]
        sin: torch.Tensor,  # [N, 1, R]
        segments: list[SegmentAttention],
        layer: int,
        kernels=None,  # the batch-invariant kernels, or None (SDPA)
        window: int = 0,  # a sliding window's positions (Gemma 3's local layers), or 0: all
    ) -> torch.Tensor:  # [N, hidden]
        rows = x.shape[0]
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        q, k = self.normed(q.view(rows, self.num_heads, self.head_dim), k.view(rows, self.num_kv_heads, self.head_dim),
                           kernels)
        q = rotate(q, cos, sin)  # [N, H, D]
        k = rotate(k, cos, sin)  # [N, Hkv, D]
        v = v.view(rows, self.num_kv_heads, self.head_dim)  # [N, Hkv, D]
        mixed = []
        for seg in segments:
            rows_of = slice(seg.start, seg.start + seg.tokens)
            qs, ks, vs = (t[rows_of].transpose(0, 1)[None] for t in (q, k, v))  # [1, heads, T_b, D]
            keys, values = seg.cache.write(layer, ks, vs)  # [1, Hkv, past + T_b, D]
            if kernels is not None:
                out = kernels.attention(qs, seg.cache.keys[layer], seg.cache.values[layer], seg.past, seg.tree_mask,
                                        window)
            else:
                mask, causal = (seg.windowed_sdpa_mask(window), False) if window else (seg.sdpa_mask, seg.causal)
                out = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask, is_causal=causal,
                                                     enable_gqa=self.num_kv_heads != self.num_heads)
            mixed.append(out[0].transpose(0, 1).reshape(seg.tokens, -1))  # [T_b, H D]
        return self.o(mixed[0] if len(mixed) == 1 else torch.cat(mixed))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gelu = config.hidden_act == "gelu_tanh"  # Gemma's gate; else SiLU

    def forward(self, x: torch.Tensor, kernels=None) -> torch.Tensor:  # x: [..., hidden]
        gate_up = self.gate_up(x)  # [..., 2 * intermediate]
        if kernels is not None:
            return self.down(kernels.gelu_tanh_mul(gate_up) if self.gelu else kernels.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)  # each [..., intermediate]
        return self.down((F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        # Gemma: each branch's output normed before it joins the stream
        self.post_attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if config.post_norms else None
        self.post_mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if config.post_norms else None
        self.window = config.layer_windows[layer] if config.layer_windows else 0  # Gemma 3's local layers

    def post_normed(self, branch: torch.Tensor, norm: RMSNorm | None, kernels=None) -> torch.Tensor:
        return branch if norm is None else norm(branch, kernels)

    def forward(self, x, cos, sin, cache, layer: int, mask, causal: bool = False):
        """x: [B, T, hidden] -> [B, T, hidden], rows in lock step over one cache (`Attention.forward`;
        an EAGLE head's layer: no window)."""
        x = x + self.post_normed(self.attn(self.attn_norm(x), cos, sin, cache, layer, mask, causal), self.post_attn_norm)
        return x + self.post_normed(self.mlp(self.mlp_norm(x)), self.post_mlp_norm)

    def forward_segments(self, x, cos, sin, segments: list[SegmentAttention], layer: int, kernels=None):
        """x: [N, hidden] -> [N, hidden]; `kernels`: the batch-invariant kernels, or None. cos, sin: the
        angles of this layer's RoPE (a local layer's own)."""
        attended = self.attn.forward_segments(self.attn_norm(x, kernels), cos, sin, segments, layer, kernels, self.window)
        x = x + self.post_normed(attended, self.post_attn_norm, kernels)
        return x + self.post_normed(self.mlp(self.mlp_norm(x, kernels), kernels), self.post_mlp_norm, kernels)


class LlamaModel(nn.Module):
    """The network. Call it through `forward`; the engine owns the cache it is given."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inverse_frequencies(config), persistent=False)
        self.local_rope = bool(config.layer_windows) and any(config.layer_windows)  # Gemma 3: a second table
        if self.local_rope:
            self.register_buffer("inv_freq_local", rope_inverse_frequencies(config, local=True), persistent=False)
        self.rope_tables: dict[bool, torch.Tensor] = {}  # local? -> [P, 2, R]: cos and sin of positions [0, P)
        self._fused_weights: list[torch.Tensor] | None = None  # built on first use (after the weights are set)
        self.kv_cache = "auto"  # one of KV_CACHE_CHOICES; set through `set_kv_cache`

    @classmethod
    def on_meta(cls, config: ModelConfig) -> "LlamaModel":
        """The network with meta tensors, to be filled by assignment, built without running the layers'
        initialisers (on meta tensors they go through torch's reference kernels, whose first use imports
        torch._dynamo: about 2 s of every process's first load)."""
        names = ("normal_", "uniform_", "kaiming_uniform_", "zeros_", "ones_")
        saved = {name: getattr(nn.init, name) for name in names}
        try:
            for name in names:
                setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
            with torch.device("meta"):
                return cls(config)
        finally:
            for name, init in saved.items():
                setattr(nn.init, name, init)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_context(self) -> int:
        return self.config.max_context

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

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

    def set_kv_cache(self, choice: str) -> None:
        """What new caches hold: auto (float16 where the kernels run, else the model's dtype), float16 or
        float32 (both only where the kernels run: the CPU in float32)."""
        if choice not in KV_CACHE_CHOICES:
            raise ConfigError(f"--kv-cache must be one of {', '.join(KV_CACHE_CHOICES)}, got {choice!r}")
        if choice != "auto" and self._invariant_kernels() is None:
            raise ConfigError(f"--kv-cache {choice} needs specdec's CPU kernels (the lean runtime on the CPU in float32, "
                              "kernels built); drop it to keep the model's dtype")
        self.kv_cache = choice

    def cache_dtype(self) -> torch.dtype:
        """What a new cache holds: float16 where the kernels run the attention, unless float32 was asked for;
        elsewhere the model's dtype (PyTorch's SDPA takes one dtype)."""
        if self._invariant_kernels() is None:
            return self.dtype
        return torch.float32 if self.kv_cache == "float32" else torch.float16

    def new_cache(self, max_len: int) -> StaticKVCache:
        c = self.config
        return StaticKVCache(c.num_layers, c.num_kv_heads, c.head_dim, max_len, device=self.device,
                             dtype=self.cache_dtype())

    def _rope(self, positions: torch.Tensor, local: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [N] -> cos, sin [N, R] (R = config.rope_dim) in the model's dtype, read from the table
        (`local`: the local layers' own)."""
        needed = int(positions.max()) + 1
        table = self.rope_tables.get(local)
        if table is None or table.shape[0] < needed:
            start = 0 if table is None else table.shape[0]
            size = max(256, start * 2, 1 << (needed - 1).bit_length())
            inv_freq = self.inv_freq_local if local else self.inv_freq
            angles = torch.arange(start, size, device=self.device).float()[:, None] * inv_freq  # [P', R/2]
            angles = torch.cat((angles, angles), dim=-1)  # [P', R]
            new = torch.stack((angles.cos(), angles.sin()), dim=1)  # [P', 2, R]
            if self.config.rope_attention_factor != 1.0:  # LongRoPE scales both, as transformers and llama.cpp do
                new = new * self.config.rope_attention_factor
            new = new.to(self.dtype)
            table = new if table is None else torch.cat((table, new))
            self.rope_tables[local] = table
        rows = table[positions]  # [N, 2, R]
        return rows[:, 0], rows[:, 1]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [1, T]
        cache: StaticKVCache,
        positions: torch.Tensor | None = None,  # [1, T]; default: cache.length + arange(T)
        tree_mask: torch.Tensor | None = None,  # [T, T] bool, True = new token i sees new token j
        last_only: bool = False,
        exit_layer: int | None = None,  # run only the first `exit_layer` layers, then norm and head
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """A pass over one sequence. logits, float32: [1, T, V], or [1, 1, V] when last_only; with
        return_hidden also the final-norm hidden states the LM head reads, [1, T, hidden] (all T)."""
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"forward takes one sequence, ids [1, T]; got {tuple(input_ids.shape)} (several: forward_segments)")
        seq = input_ids.shape[1]
        segment = Segment(cache, seq, None if positions is None else positions[0], tree_mask)
        rows = torch.tensor([seq - 1], device=input_ids.device) if last_only else None
        out = self.forward_segments(input_ids[0], [segment], logit_rows=rows, exit_layer=exit_layer,
                                    return_hidden=return_hidden)
        return (out[0][None], out[1][None]) if return_hidden else out[None]

    @torch.inference_mode()
    def forward_segments(
        self,
        input_ids: torch.Tensor,  # [N]: the new tokens of every segment, segment after segment
        segments: list[Segment],
        logit_rows: torch.Tensor | None = None,  # [M] rows whose logits are wanted; None: all N
        exit_layer: int | None = None,
        return_hidden: bool = False,
        aux_layers: tuple[int, ...] = (),
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, dict[int, torch.Tensor]]:
        """A pass over several sequences at once. logits, float32: [M, V] (M = N without logit_rows);
        with return_hidden also the final-norm hidden states, [N, hidden]; with aux_layers (layer
        indices; implies return_hidden) also {layer: the residual stream entering that layer, [N, hidden]}
        (what EAGLE-3 heads read; vLLM and SGLang capture the same states). Each segment's cache
        advances by its tokens."""
        if sum(seg.tokens for seg in segments) != input_ids.shape[0] or any(seg.tokens < 1 for seg in segments):
            raise ValueError(f"the segments' tokens {[seg.tokens for seg in segments]} do not cover the {input_ids.shape[0]} ids")
        for seg in segments:
            seg.cache.reserve(seg.tokens)
        device = input_ids.device
        positions = torch.cat([seg.positions.to(device) if seg.positions is not None else
                               torch.arange(seg.cache.length, seg.cache.length + seg.tokens, device=device)
                               for seg in segments])  # [N]
        cos, sin = self._rope(positions)  # [N, R] each
        cos_local, sin_local = self._rope(positions, local=True) if self.local_rope else (cos, sin)
        kernels = self._invariant_kernels()
        starts = [0]
        for seg in segments:
            starts.append(starts[-1] + seg.tokens)
        attending = [SegmentAttention.of(seg, start, positions[start:start + seg.tokens], kernels)
                     for seg, start in zip(segments, starts)]
        x = self.embed(input_ids)  # [N, hidden]
        if self.config.embed_scale != 1.0:  # Gemma: × √hidden (a float32 constant)
            x = x * self.config.embed_scale
        depth = len(self.layers) if exit_layer is None else min(exit_layer, len(self.layers))
        if any(not 0 <= layer < depth for layer in aux_layers):
            raise ValueError(f"aux_layers {aux_layers} must lie in 0..{depth - 1}")
        aux: dict[int, torch.Tensor] = {}  # layer → the stream entering it, [N, hidden]
        captured = sorted(set(aux_layers))
        fused = self._fused_layer_weights() if kernels is not None else None
        if fused is not None:  # every layer in one call, the same arithmetic as the loop below
            c = self.config
            x, *streams = kernels.decoder_layers(x, fused, depth, cos, sin, [a.cache.keys for a in attending],
                                                 [a.cache.values for a in attending], [a.past for a in attending],
                                                 [a.tokens for a in attending], [a.tree_mask for a in attending],
                                                 c.rms_norm_eps, c.num_heads, c.num_kv_heads, captured, cos_local,
                                                 sin_local, c.layer_windows or [], c.hidden_act == "gelu_tanh")
            aux = dict(zip(captured, streams))
        else:
            angles = {False: (cos[:, None], sin[:, None]), True: (cos_local[:, None], sin_local[:, None])}  # [N, 1, R]
            for i in range(depth):  # (slicing the ModuleList would build a new one per pass)
                if i in aux_layers:
                    aux[i] = x
                layer = self.layers[i]
                x = layer.forward_segments(x, *angles[layer.window > 0], attending, i, kernels)
        for seg in segments:
            seg.cache.advance(seg.tokens)
        if aux_layers:
            return_hidden = True
        if logit_rows is not None and not return_hidden:
            x = x[logit_rows]
        hidden = self.norm(x, kernels)  # [N, hidden] (or [M, hidden])
        logits = self.lm_head(hidden[logit_rows] if logit_rows is not None and return_hidden else hidden).float()
        if aux_layers:
            return logits, hidden, aux
        return (logits, hidden) if return_hidden else logits

    def _fused_layer_weights(self) -> list[torch.Tensor] | None:
        """The layers' weights as `decoder_layers` takes them (LAYER_WEIGHTS per layer), when every linear is
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
                attn = layer.attn
                qk_norms = ([attn.q_norm.weight.detach(), attn.k_norm.weight.detach()] if attn.q_norm is not None
                            else [torch.empty(0), torch.empty(0)])  # Qwen3's and Gemma's, or none
                post_norms = ([layer.post_attn_norm.weight.detach(), layer.post_mlp_norm.weight.detach()]
                              if layer.post_attn_norm is not None else [torch.empty(0), torch.empty(0)])  # Gemma's
                weights += [layer.attn_norm.weight.detach(), *attn.qkv.slots(QKV_SLOTS), bias, attn.o.packed,
                            layer.mlp_norm.weight.detach(), *layer.mlp.gate_up.slots(GATE_UP_SLOTS), layer.mlp.down.packed,
                            *qk_norms, *post_norms]
            self._fused_weights = weights
        return self._fused_weights or None

    def _invariant_kernels(self):
        """The batch-invariant kernels for this pass, or None (PyTorch's operators)."""
        if self.device.type != "cpu" or self.dtype != torch.float32:
            return None
        return invariant_kernels()


def cache_attention_mask(past: int, seq: int, tree_mask: torch.Tensor | None, device) -> torch.Tensor | None:
    """[1, 1, T, past + T] bool: every new token sees the cache, and the new tokens per `tree_mask`
    (causal by default). None when a single token is added (it sees everything)."""
    if tree_mask is None:
        if seq == 1:
            return None
        tree_mask = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    prefix = torch.ones(seq, past, dtype=torch.bool, device=device)
    return torch.cat((prefix, tree_mask.to(device)), dim=1)[None, None]
