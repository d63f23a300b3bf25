"""Which form each linear layer's weights take: `--weights auto|float32|bfloat16|int8|int4`.

- `auto`: a GGUF file runs its own blocks, every linear in its stored type (`gguf_model.py`; not
  here). A float checkpoint stays float32 (MKL-prepacked where available), as does a GGUF without
  the compiled kernels (no C++ compiler), from its dequantized weights.
- `int4` / `int8`: every linear quantized at load from the float weights (group 32).
- `bfloat16`: weights stored in bfloat16, rows cast to bfloat16 for the product, outputs float32.
- `float32`: the float32 weights (a GGUF's dequantized ones; MKL-prepacked on CPUs that have MKL).

The residual stream, norms, attention, softmax and logits stay float32 in every form.
`apply_weights` returns a `WeightReport` that says what each layer became and how.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
import torch
import torch.nn.functional as F
from torch import nn

from specdec.errors import ConfigError
from specdec.runtime.kernels import kernels_switched_off
from specdec.runtime.packed_linear import pack_linears
from specdec.runtime.quant import QuantizedLinear, quantize_int4, quantize_int8, quantized_kernels_available
from specdec.terminal import plural

WEIGHTS = ("auto", "float32", "bfloat16", "int8", "int4")
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
        return "; ".join(f"{plural(n, 'linear')} {form} ({how})" for (form, how), n in sorted(self.layers.items()))


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


def apply_weights(model: nn.Module, weights: str, from_gguf: bool = False) -> WeightReport:
    """Swap the model's float linear layers for the chosen form, in place; report what was done
    (`from_gguf`: the float weights are a GGUF's, dequantized)."""
    device, dtype = model.device, model.dtype
    check_weights(weights, device, dtype)
    report = WeightReport()
    for parent, attr in _linears(model):
        linear = getattr(parent, attr)
        form = "float32" if weights == "auto" else weights
        how = "dequantized" if from_gguf else "as stored"
        if form in ("int4", "int8"):
            codes = (quantize_int4 if form == "int4" else quantize_int8)(linear.weight)
            setattr(parent, attr, QuantizedLinear(codes, linear.bias))
            how = "quantized at load"
        elif form == "bfloat16":
            setattr(parent, attr, BFloat16Linear(linear.weight, linear.bias))
        if form == "float32" and dtype != torch.float32:
            form = str(dtype).removeprefix("torch.")  # float weights kept in the model's dtype
        report.add(form, how)
    pack_linears(model)  # float32 CPU layers only (packed_linear.py)
    return report


def _linears(model: nn.Module):
    """(parent module, attribute) of every linear layer."""
    for layer in model.layers:
        for path in LAYER_SOURCES:
            block, attr = path.split(".")
            yield getattr(layer, block), attr
    yield model, "lm_head"


def weight_bytes(net) -> int:
    """Bytes of the model's weights (each storage once: tied and packed tensors are not counted twice)."""
    seen, total = set(), 0
    tensors = [*net.parameters(), *net.buffers()]
    for module in net.modules():  # packed weights kept as plain attributes, alone or in a list (a layer's parts)
        for value in vars(module).values():
            tensors += [t for t in (value if isinstance(value, (list, tuple)) else [value]) if isinstance(t, torch.Tensor)]
    for tensor in tensors:
        try:
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
        except NotImplementedError:  # an opaque tensor (a oneDNN-packed weight): its own elements
            key, size = id(tensor), tensor.numel() * tensor.element_size()
        if key not in seen:
            seen.add(key)
            total += size
    return total
