"""Configuration of a Llama-family model (Llama 2/3, SmolLM2, Qwen2, Qwen3, Mistral, Phi-3/Phi-4, Gemma 3).

One dataclass, filled from a Hugging Face `config.json` or from GGUF metadata. Everything the
lean runtime needs to build the network is here; nothing else is read from the source files.
"""

from __future__ import annotations

import math
import struct
from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",  # Llama's layers with q/k/v and gate/up stored fused (the runtime fuses them anyway)
    "Gemma3ForCausalLM": "gemma3",  # q/k norms, a norm after each branch, GELU, local (windowed) and global layers
}
GEMMA3_MODEL_TYPES = ("gemma3_text", "gemma3")


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # llama3, linear or longrope (its short factors: see max_context)
    rotary_dim: int | None = None  # RoPE turns the first this many of each head's dimensions (Phi-4-mini: 96 of 128)
    rope_freq_factors: list[float] | None = None  # GGUF's rope_freqs (Llama 3.1/3.2): divisors of the frequencies
    attention_bias: bool = False  # Qwen2: bias on q, k, v projections
    qk_norm: bool = False  # Qwen3: an RMS norm over each head's q and k (head_dim wide) before RoPE
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # Mistral, Phi-3: attention limited to this many positions
    # Gemma 3: each layer's sliding window (0: a global layer), run as such (not a bound on the context);
    # the windowed layers' RoPE base; a norm on each branch's output; GELU's tanh form; embeddings × √hidden
    layer_windows: list[int] | None = None
    rope_local_theta: float | None = None
    post_norms: bool = False
    hidden_act: str = "silu"  # or "gelu_tanh"
    embed_scale: float = 1.0
    family: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )

    @property
    def rope_dim(self) -> int:
        """How many of each head's dimensions RoPE turns (the rest pass unchanged)."""
        return self.rotary_dim or self.head_dim

    @property
    def max_context(self) -> int:
        """Longest sequence the runtime will run (prompt plus generated tokens)."""
        limit = self.max_position_embeddings
        if self.sliding_window and not self.layer_windows:
            # Beyond the window Mistral attends to a band, which this runtime does not implement;
            # within it, full causal attention is exact.
            limit = min(limit, self.sliding_window)
        if self.longrope:
            # LongRoPE's short factors hold up to the pretraining context; past it transformers switches
            # every position to the long ones (and llama.cpp picks them when its context is longer), which
            # would leave the cached keys turned by the other set: the runtime runs the short span only.
            limit = min(limit, int(self.longrope["original_max_position_embeddings"]))
        return limit

    @property
    def longrope(self) -> dict[str, Any] | None:
        """The LongRoPE scaling (short_factor, original_max_position_embeddings, attention_factor), or
        None where the RoPE is another."""
        return self.rope_scaling if self.rope_scaling and self.rope_scaling["rope_type"] == "longrope" else None

    @property
    def rope_attention_factor(self) -> float:
        """What LongRoPE multiplies RoPE's cos and sin by (1.0 for every other RoPE)."""
        return float(self.longrope["attention_factor"]) if self.longrope else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Build from the contents of a Hugging Face `config.json`."""
        archs = hf.get("architectures") or []
        family = None
        for arch in archs:
            family = SUPPORTED_ARCHITECTURES.get(arch, family)
        if family is None:
            model_type = hf.get("model_type")
            family = "gemma3" if model_type in GEMMA3_MODEL_TYPES else model_type
            family = family if family in SUPPORTED_ARCHITECTURES.values() else None
        if family is None:
            raise ModelLoadError(
                f"architecture {archs or hf.get('model_type')} is not supported by the lean runtime "
                f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}); load it with "
                "--runtime transformers instead"
            )
        try:
            num_heads = hf["num_attention_heads"]
            hidden = hf["hidden_size"]
            eos = hf.get("eos_token_id")
            eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
            use_window = hf.get("use_sliding_window", family in ("mistral", "phi3"))
            head_dim = hf.get("head_dim") or hidden // num_heads
            config = cls(
                vocab_size=hf["vocab_size"],
                hidden_size=hidden,
                intermediate_size=hf["intermediate_size"],
                num_layers=hf["num_hidden_layers"],
                num_heads=num_heads,
                num_kv_heads=hf.get("num_key_value_heads") or num_heads,
                head_dim=head_dim,
                max_position_embeddings=hf.get("max_position_embeddings", 2048),
                rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(hf),
                rope_scaling=_rope_scaling(hf),
                rotary_dim=_rotary_dim(hf, head_dim),
                rope_freq_factors=hf.get("rope_freq_factors"),
                attention_bias=family == "qwen2" or bool(hf.get("attention_bias", False)),
                qk_norm=family == "qwen3",
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                sliding_window=hf.get("sliding_window") if use_window else None,
                family=family,
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
            return config.gemma3(hf) if family == "gemma3" else config
        except KeyError as missing:
            raise ModelLoadError(f"config.json lacks the field {missing}") from None

    def gemma3(self, hf: dict[str, Any]) -> "ModelConfig":
        """This config (read as Llama's) with Gemma 3's layer pattern and parts from its config.json."""
        params = hf.get("rope_parameters") or {}
        full, local = params.get("full_attention") or {}, params.get("sliding_attention") or {}
        if hf.get("final_logit_softcapping") or hf.get("attn_logit_softcapping") or hf.get("use_bidirectional_attention"):
            raise ModelLoadError("this Gemma config caps its logits or attends both ways (Gemma 2's kind), which "
                                 "specdec's runtime does not run; load it with --runtime transformers")
        scalar = hf.get("query_pre_attn_scalar", self.head_dim)
        if scalar != self.head_dim:
            raise ModelLoadError(f"this Gemma 3 scales its queries by 1/sqrt({scalar}), not by its head size "
                                 f"{self.head_dim} (the 27B model); load it with --runtime transformers")
        window = int(hf.get("sliding_window") or 0)
        pattern = int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern") or 6)
        types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                          for i in range(self.num_layers)]
        self.layer_windows = [window if kind == "sliding_attention" else 0 for kind in types]
        self.rope_theta = float(full.get("rope_theta") or hf.get("rope_theta") or 1_000_000.0)
        self.rope_local_theta = float(local.get("rope_theta") or hf.get("rope_local_base_freq") or 10_000.0)
        self.rope_scaling = _rope_scaling({"rope_scaling": full}) if full.get("rope_type", "default") != "default" else (
            _rope_scaling(hf))
        self.post_norms = True
        self.hidden_act = "gelu_tanh"
        self.embed_scale = _float32(self.hidden_size ** 0.5)
        self.qk_norm = True
        self.sliding_window = None
        return self


def _float32(value: float) -> float:
    """`value` rounded to float32 (transformers and llama.cpp hold Gemma's √hidden so)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def _rotary_dim(hf: dict[str, Any], head_dim: int) -> int | None:
    """The dimensions of each head that RoPE turns, where a config turns fewer than all (Phi-4-mini:
    partial_rotary_factor 0.75); None for all."""
    factor = hf.get("partial_rotary_factor") or (hf.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0
    if factor == 1.0:
        return None
    rotary = int(head_dim * factor)
    if not 0 < rotary <= head_dim or rotary % 2:
        raise ModelLoadError(f"partial_rotary_factor {factor} turns {rotary} of each head's {head_dim} dimensions; "
                             "RoPE needs an even number between 2 and the head's size")
    return rotary


def _rope_theta(hf: dict[str, Any]) -> float:
    params = hf.get("rope_parameters") or {}
    return float(hf.get("rope_theta") or params.get("rope_theta") or 10000.0)


def _rope_scaling(hf: dict[str, Any]) -> dict[str, Any] | None:
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    if kind == "su":  # Phi-3's first name for LongRoPE
        kind = "longrope"
    if kind not in ("llama3", "linear", "longrope"):
        raise ModelLoadError(
            f"RoPE scaling '{kind}' is not supported by the lean runtime (supported: llama3, linear, longrope); "
            "load the model with --runtime transformers instead"
        )
    if kind == "longrope":
        return _longrope(hf, scaling)
    return {**scaling, "rope_type": kind}


def _longrope(hf: dict[str, Any], scaling: dict[str, Any]) -> dict[str, Any]:
    """LongRoPE (Phi-3-128k, Phi-3.5, Phi-4-mini) as the runtime runs it: the short factors (each
    frequency divided by one), the pretraining context they hold for, and the attention factor that
    multiplies cos and sin (given, or transformers' default from the context's growth)."""
    original = scaling.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings")
    if not original or "short_factor" not in scaling:
        raise ModelLoadError("the LongRoPE scaling lacks original_max_position_embeddings or short_factor")
    attention = scaling.get("attention_factor")
    if attention is None:
        growth = scaling.get("factor") or hf.get("max_position_embeddings", original) / original
        attention = 1.0 if growth <= 1.0 else math.sqrt(1 + math.log(growth) / math.log(original))
    return {"rope_type": "longrope", "short_factor": [float(f) for f in scaling["short_factor"]],
            "original_max_position_embeddings": int(original), "attention_factor": float(attention)}
