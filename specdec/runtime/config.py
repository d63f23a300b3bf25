"""Configuration of a Llama-family model (Llama 2/3, SmolLM2, Qwen2, Qwen3, Mistral, Phi-3/Phi-4).

One dataclass, filled from a Hugging Face `config.json` or from GGUF metadata. Everything the
lean runtime needs to build the network is here; nothing else is read from the source files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",  # Llama's layers with q/k/v and gate/up stored fused (the runtime fuses them anyway)
}


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
    rope_scaling: dict[str, Any] | None = None
    rope_freq_factors: list[float] | None = None  # GGUF's rope_freqs (Llama 3.1/3.2): divisors of the frequencies
    attention_bias: bool = False  # Qwen2: bias on q, k, v projections
    qk_norm: bool = False  # Qwen3: an RMS norm over each head's q and k (head_dim wide) before RoPE
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # Mistral, Phi-3: attention limited to this many positions
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
    def max_context(self) -> int:
        """Longest sequence the runtime will run (prompt plus generated tokens)."""
        if self.sliding_window:
            # Beyond the window Mistral attends to a band, which this runtime does not implement;
            # within it, full causal attention is exact.
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

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
            family = model_type if model_type in SUPPORTED_ARCHITECTURES.values() else None
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
            _refuse_partial_rotary(hf)
            return cls(
                vocab_size=hf["vocab_size"],
                hidden_size=hidden,
                intermediate_size=hf["intermediate_size"],
                num_layers=hf["num_hidden_layers"],
                num_heads=num_heads,
                num_kv_heads=hf.get("num_key_value_heads") or num_heads,
                head_dim=hf.get("head_dim") or hidden // num_heads,
                max_position_embeddings=hf.get("max_position_embeddings", 2048),
                rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
                rope_theta=_rope_theta(hf),
                rope_scaling=_rope_scaling(hf),
                rope_freq_factors=hf.get("rope_freq_factors"),
                attention_bias=family == "qwen2" or bool(hf.get("attention_bias", False)),
                qk_norm=family == "qwen3",
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
                sliding_window=hf.get("sliding_window") if use_window else None,
                family=family,
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=eos_ids,
            )
        except KeyError as missing:
            raise ModelLoadError(f"config.json lacks the field {missing}") from None


def _refuse_partial_rotary(hf: dict[str, Any]) -> None:
    """RoPE over part of each head (Phi-4-mini: 0.75) is not implemented: one line naming it."""
    factor = hf.get("partial_rotary_factor") or (hf.get("rope_parameters") or {}).get("partial_rotary_factor") or 1.0
    if factor != 1.0:
        raise ModelLoadError(f"this model applies RoPE to a part of each head (partial_rotary_factor {factor}), which "
                             "the lean runtime does not implement; load it with --runtime transformers instead")


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
    if kind not in ("llama3", "linear"):
        raise ModelLoadError(
            f"RoPE scaling '{kind}' is not supported by the lean runtime (supported: llama3, linear); "
            "load the model with --runtime transformers instead"
        )
    return {**scaling, "rope_type": kind}
