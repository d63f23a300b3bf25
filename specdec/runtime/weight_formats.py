"""Which form each linear layer's weights take: `--weights auto|float32|bfloat16|int8|int4`.

- `auto`: a GGUF keeps its precision — Q4_0/Q4_1 tensors become 4-bit `QuantizedLinear`s, Q8_0
  8-bit ones, both exact (the layer's weights equal gguf's dequantization bit for bit); other
  quantized types (K-quants) are dequantized and requantized to the nearest of the two, float
  tensors stay float. Without the compiled kernels (no C++ compiler) everything stays float32.
  A float checkpoint stays float32 (MKL-prepacked where available).
- `int4` / `int8`: every linear in that form; from the GGUF blocks where the file has exactly that
  form, else quantized from the float weights (group 32).
- `bfloat16`: weights stored in bfloat16, rows cast to bfloat16 for the product, outputs float32.
- `float32`: the dequantized float32 weights (MKL-prepacked on CPUs that have MKL).

Fused layers (q/k/v, gate/up) are exact only when all their parts share one exact GGUF type.
The residual stream, norms, attention, softmax and logits stay float32 in every form.
`apply_weights` returns a `WeightReport` that says what each layer became and how.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import ConfigError
from specdec.runtime.kernels import kernels_switched_off
from specdec.runtime.packed_linear import pack_linears
from specdec.runtime.quant import (
    EXACT_GGUF_TYPES,
    concat_codes,
    gguf_blocks,
    QuantizedLinear,
    quantize_int4,
    quantize_int8,
    quantized_kernels_available,
)

WEIGHTS = ("auto", "float32", "bfloat16", "int8", "int4")
FLOAT_GGUF_TYPES = ("F32", "F16", "BF16")
AS_STORED = "blocks as stored"  # the report's word for codes read from the GGUF's own blocks
# GGUF tensor names of each linear of layer i (fused layers list their parts in order)
LAYER_SOURCES = {
    "attn.qkv": ("attn_q", "attn_k", "attn_v"),
    "attn.o": ("attn_output",),
    "mlp.gate_up": ("ffn_gate", "ffn_up"),
    "mlp.down": ("ffn_down",),
}


@dataclass
class WeightReport:
    """What each linear layer became: counts of (form, how) and the GGUF types seen."""

    layers: Counter = field(default_factory=Counter)

    def add(self, form: str, how: str) -> None:
        self.layers[(form, how)] += 1

    @property
    def forms(self) -> set[str]:
        return {form for form, _ in self.layers}

    def summary(self) -> str:
        return "; ".join(f"{n} linear{'s' if n > 1 else ''} {form} ({how})" for (form, how), n in sorted(self.layers.items()))


class BFloat16Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:  # weight: [out, in]
        super().__init__()
        self.weight = weight.detach().to(torch.bfloat16)
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] float32 -> [..., out] float32
        out = F.linear(x.to(torch.bfloat16), self.weight).float()
        return out if self.bias is None else out + self.bias


def check_weights(weights: str, device: torch.device, dtype: torch.dtype) -> None:
    if weights not in WEIGHTS:
        raise ConfigError(f"unknown weights '{weights}'; choose one of {', '.join(WEIGHTS)}")
    if weights in ("int4", "int8"):
        if device.type != "cpu":
            raise ConfigError(f"--weights {weights} runs on the CPU only; use --weights bfloat16 or float32 on {device.type}")
        if dtype != torch.float32:
            raise ConfigError(f"--weights {weights} computes in float32; drop --dtype or use --weights bfloat16")
        if not quantized_kernels_available():
            if kernels_switched_off():
                raise ConfigError(f"--weights {weights} needs specdec's compiled CPU kernels, which are switched off "
                                  "(--no-compile or SPECDEC_KERNELS=off); drop that, or use --weights float32")
            raise ConfigError(f"--weights {weights} needs specdec's compiled CPU kernels, which could not be built "
                              "here (see the warning above); install g++ and ninja, or use --weights float32")


def apply_weights(model: nn.Module, weights: str, gguf_path: Path | None) -> WeightReport:
    """Swap the model's linear layers for the chosen form, in place; report what was done."""
    device, dtype = model.device, model.dtype
    check_weights(weights, device, dtype)
    quantized_ok = device.type == "cpu" and dtype == torch.float32 and quantized_kernels_available()
    source = _gguf_source(gguf_path) if gguf_path is not None else None
    report = WeightReport()
    for parent, attr, sources in _linears(model):
        linear = getattr(parent, attr)
        parts = [source.tensors.get(s) for s in sources] if source else []
        types = {p.tensor_type.name for p in parts if p is not None}
        form, how = _choose(weights, types if len(parts) and all(p is not None for p in parts) else set(), quantized_ok)
        if form in ("int4", "int8"):
            if how.endswith(AS_STORED):
                codes = concat_codes([source.codes(p) for p in parts])
            else:
                codes = (quantize_int4 if form == "int4" else quantize_int8)(linear.weight)
            setattr(parent, attr, QuantizedLinear(codes, linear.bias))
        elif form == "bfloat16":
            setattr(parent, attr, BFloat16Linear(linear.weight, linear.bias))
        if form == "float32" and dtype != torch.float32:
            form = str(dtype).removeprefix("torch.")  # float weights kept in the model's dtype
        report.add(form, how)
    pack_linears(model)  # float32 CPU layers only (packed_linear.py)
    return report


def _choose(weights: str, gguf_types: set[str], quantized_ok: bool) -> tuple[str, str]:
    """(form, how) for one layer, given the GGUF types of its parts (empty: no GGUF source)."""
    single = next(iter(gguf_types)) if len(gguf_types) == 1 else None
    exact_form = EXACT_GGUF_TYPES.get(single)
    if weights in ("float32", "bfloat16"):
        return weights, "dequantized" if gguf_types else "as stored"
    if weights in ("int4", "int8"):
        if exact_form == weights:
            return weights, f"{single} {AS_STORED}"
        return weights, "quantized at load"
    # auto
    if not gguf_types or not quantized_ok or all(t in FLOAT_GGUF_TYPES for t in gguf_types):
        return "float32", "as stored" if not gguf_types else "dequantized"
    if exact_form is not None:
        return exact_form, f"{single} {AS_STORED}"
    bits = max(_bits(t) for t in gguf_types)
    return ("int4" if bits <= 5 else "int8"), f"requantized from {'+'.join(sorted(gguf_types))}"


def _bits(type_name: str) -> int:
    digits = "".join(ch for ch in type_name.split("_")[0] if ch.isdigit())
    return int(digits) if digits else 16


def _linears(model: nn.Module):
    """(parent module, attribute, GGUF source names) of every linear layer."""
    for i, layer in enumerate(model.layers):
        for path, sources in LAYER_SOURCES.items():
            block, attr = path.split(".")
            yield getattr(layer, block), attr, tuple(f"blk.{i}.{s}.weight" for s in sources)
    head_source = "token_embd.weight" if model.config.tie_word_embeddings else "output.weight"
    yield model, "lm_head", (head_source,)


@dataclass
class GgufSource:
    """A GGUF file's tensors by name, and what un-permuting its Q and K rows needs."""

    tensors: dict
    arch: str
    heads: int
    kv_heads: int

    def codes(self, tensor):
        """Codes of one tensor, rows in the Hugging Face layout (Q and K un-permuted)."""
        from specdec.runtime.gguf_convert import unpermute_qk

        cols, rows = (int(n) for n in tensor.shape)  # GGUF lists the fastest dimension first
        codes = gguf_blocks(tensor.tensor_type.name, tensor.data, rows, cols)
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        if self.arch == "llama" and kind in ("attn_q", "attn_k"):
            order = unpermute_qk(np.arange(rows), self.heads if kind == "attn_q" else self.kv_heads)
            codes = codes.rows(order)
        return codes


def _gguf_source(gguf_path: Path) -> GgufSource:
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = reader.fields["general.architecture"].contents()
    heads = reader.fields[f"{arch}.attention.head_count"].contents()
    kv_field = reader.fields.get(f"{arch}.attention.head_count_kv")
    return GgufSource({t.name: t for t in reader.tensors}, arch, heads, kv_field.contents() if kv_field else heads)
