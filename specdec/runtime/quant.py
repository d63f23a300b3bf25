"""Weight-only quantized linear layers, run as they are stored, with 8-bit activations.

Weights are kept packed (`QuantizedLinear.packed`) in one of the kernels' layouts: codes per block
of 32 inputs with scales and offsets, w = s·u + c (a GGUF type's own, `FORMATS`; or from float
weights, `Int4Codes`, w = s·q + c with q in 0..15 as Q4_1, and `Int8Codes`, w = d·q as Q8_0).
`QuantizedLinear` multiplies them with the
compiled kernel `quant_linear` (`runtime/kernels/quant_gemm.cpp`), which quantizes each input row
to 8 bits as llama.cpp does for the weights' type (`activation_group`: Q8_K's one scale per 256
inputs for K-quants, Q8_0's float16 scale per 32 for the others), takes exact integer dot products
per block (AVX-512 VNNI, or AVX2) and combines them in float32 in a fixed order. So:
- a weight tile is unpacked once per call and used by every row: a pass over k rows streams the
  weights once (measured in `scripts/pass_costs.py`);
- every row is computed by one recipe whatever the row count: batch-invariant, bit for bit, and
  the AVX-512 and AVX2 builds agree bit for bit;
- the only rounding besides float32 is the rows' 8-bit quantization (error ≤ 1/254 of the largest
  entry of the inputs sharing a scale, plus Q8_0's float16 rounding of that scale); the residual
  stream, norms, attention, softmax and logits stay float32.

`quantize_int4` / `quantize_int8` make codes from float weights (a float checkpoint loaded with
`weights="int4"` or `"int8"`). A GGUF's own blocks of every common type (Q4_0 … Q8_0, the K-quants)
are packed by the compiled `pack_gguf` into a layout per type (`FORMATS`; the layouts are described
in `kernels/quant_gemm.cpp`), exactly: K-quants' sub-block scales are small integers times a
float16, exact in float32, and the kernel computes s = d·sc in float32 as it goes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from specdec.errors import ConfigError
from specdec.runtime.kernels import invariant_kernels

GROUP = 32
TILE = 16  # the kernel's outputs per tile: a layer's output size must be a multiple
FLOAT_GGUF_TYPES = ("F32", "F16", "BF16")
# GGUF type -> the kernels' packed layout that holds it exactly (ids of kernels/quant_formats.h)
# ("affine8" is no GGUF type: the layout of Q8_0 beside other per-block types in one layer)
FORMATS = {"Q4_1": 0, "Q5_0": 1, "Q5_1": 1, "Q4_K": 2, "Q2_K": 3, "Q3_K": 3, "Q5_K": 4, "Q6_K": 5,
           "Q8_0": 6, "affine8": 7, "Q4_0": 8}
# per layout id: (kind, code bits, inputs per scale); a layout holds another of its kind exactly when
# its codes are at least as wide and its scale groups at most as long
LAYOUTS = {0: ("block", 4, 32), 1: ("block", 6, 32), 2: ("super", 4, 32), 3: ("super", 4, 16), 4: ("super", 6, 32),
           5: ("super", 6, 16), 6: ("q8", 8, 32), 7: ("block", 8, 32), 8: ("block", 4, 32)}


@dataclass
class Int4Codes:
    """4-bit codes [N, K] (values 0..15) with a scale and an offset per group [N, K/32]: w = s·q + c."""

    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor

    def dequantize(self) -> torch.Tensor:  # [N, K] float32, exact
        n, k = self.codes.shape
        q = self.codes.view(n, k // GROUP, GROUP).double()
        return (q * self.scales.double()[..., None] + self.offsets.double()[..., None]).float().view(n, k)


@dataclass
class Int8Codes:
    """8-bit codes [N, K] (−128..127) with one scale per group [N, K/32]: w = d·q."""

    codes: torch.Tensor
    scales: torch.Tensor

    def dequantize(self) -> torch.Tensor:  # [N, K] float32, exact
        n, k = self.codes.shape
        return (self.codes.view(n, k // GROUP, GROUP).float() * self.scales[..., None]).view(n, k)


def gguf_format(types: list[str]) -> str | None:
    """The layout (named by a GGUF type it is made for) that holds tensors of all `types` exactly when
    stacked in one layer; None when none does (float types, or kinds that do not mix)."""
    if any(t not in FORMATS for t in types):
        return None
    ids = {FORMATS[t] for t in types}
    if len(ids) == 1:
        return types[0]
    kinds = {LAYOUTS[i][0] for i in ids}
    if kinds <= {"block", "q8"}:
        kind = "block"  # Q8_0 beside other per-block types: 8-bit codes with an offset
    elif kinds == {"super"}:
        kind = "super"
    else:
        return None  # super-blocks beside per-block scales: no layout holds both exactly
    want = (kind, max(LAYOUTS[i][1] for i in ids), min(LAYOUTS[i][2] for i in ids))
    layout = next(i for i, spec in LAYOUTS.items() if spec == want)
    return next(t for t, i in FORMATS.items() if i == layout)


def pack_gguf_tensors(raws: list[torch.Tensor], types: list[str], orders: list[torch.Tensor | None],
                      layout: str) -> torch.Tensor:
    """Raw GGUF blocks ([rows, bytes] uint8 per tensor, stacked along outputs; each optional order
    [rows] picks the stored row of every output row) -> packed weights in `layout`'s format."""
    kernels = _kernels_or_raise()
    none = torch.empty(0, dtype=torch.long)
    return kernels.pack_gguf(raws, types, [none if o is None else o for o in orders], FORMATS[layout])


def _kernels_or_raise():
    kernels = invariant_kernels()
    if kernels is None:
        raise ConfigError("quantized weights need specdec's compiled CPU kernels, which could not be built "
                          "here; install a C++ compiler (g++) and ninja, or use --weights float32")
    return kernels


def quantized_kernels_available() -> bool:
    return invariant_kernels() is not None


class QuantizedLinear(nn.Module):
    """y = x Wᵀ (+ bias) with W in packed quantized codes; x [..., in] float32 -> [..., out] float32."""

    def __init__(self, codes: Int4Codes | Int8Codes, bias: torch.Tensor | None = None) -> None:
        kernels = _kernels_or_raise()
        out_features, in_features = codes.codes.shape
        _check_shape(out_features, in_features)
        four = isinstance(codes, Int4Codes)
        scales = _float16_exact(codes.scales, "scales")
        offsets = _float16_exact(codes.offsets, "offsets") if four else None
        packed = kernels.pack_quant_weights(codes.codes.contiguous(), scales, offsets)  # [N/16, K/32, bytes]
        self._set_packed(packed, "Q4_1" if four else "Q8_0", bias)

    @classmethod
    def from_packed(cls, packed: torch.Tensor, layout: str, bias: torch.Tensor | None = None) -> "QuantizedLinear":
        """A layer over weights already packed in `layout`'s format (GGUF blocks: `pack_gguf_tensors`)."""
        layer = cls.__new__(cls)
        layer._set_packed(packed, layout, bias)
        return layer

    def _set_packed(self, packed: torch.Tensor, layout: str, bias: torch.Tensor | None) -> None:
        nn.Module.__init__(self)
        self.packed = packed  # [N/16, units, unit bytes] uint8
        self.layout = layout
        self.bits = LAYOUTS[FORMATS[layout]][1]
        self.out_features = packed.shape[0] * TILE
        unit_inputs = 8 * GROUP if LAYOUTS[FORMATS[layout]][0] == "super" else GROUP  # inputs per packed unit
        self.in_features = packed.shape[1] * unit_inputs
        # inputs of a row sharing one 8-bit scale: Q8_K's per super-block, Q8_0's per block
        self.activation_group = unit_inputs
        self.multiply = _kernels_or_raise().quant_linear
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # [M, in]
        out = self.multiply(rows, self.packed)  # [M, out]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:  # [out, in] float32: the exact weights
        return _kernels_or_raise().dequantize_packed(self.packed, torch.empty(0, dtype=torch.long))


class QuantizedEmbedding(nn.Module):
    """A token table kept in its packed quantized form; rows are dequantized (exactly) as they are
    gathered. ids [...] -> [..., hidden] float32."""

    def __init__(self, packed: torch.Tensor) -> None:
        super().__init__()
        self.packed = packed  # [V/16, units, unit bytes] uint8 (shared with a tied LM head)
        self.gather = _kernels_or_raise().dequantize_packed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.gather(self.packed, ids.reshape(-1).cpu()).to(ids.device).reshape(*ids.shape, -1)


def _float16_exact(values: torch.Tensor, what: str) -> torch.Tensor:
    """`values` as float32, after checking that float16 (the kernel's storage) holds them exactly."""
    values = values.float()
    if not torch.equal(values.half().float(), values):
        raise ConfigError(f"quantized {what} must be float16 values (as GGUF stores them); got some that are not")
    return values


def _check_shape(out_features: int, in_features: int) -> None:
    if in_features % GROUP or out_features % TILE:
        raise ConfigError(f"quantized weights need an input size divisible by {GROUP} and an output size divisible "
                          f"by {TILE}, got {out_features} × {in_features}; use --weights float32 or bfloat16")


def quantize_int4(weight: torch.Tensor) -> Int4Codes:
    """Asymmetric 4-bit codes per group of 32 (like Q4_1): s = (max − min)/15 and c = min, both
    rounded to float16 first, then q = round((w − c)/s)."""
    n, k = weight.shape
    _check_shape(n, k)
    w = weight.detach().float().view(n, k // GROUP, GROUP)
    low, high = w.amin(-1), w.amax(-1)  # [N, K/32]
    offsets = low.half().float()
    scales = ((high - offsets) / 15).half().float()
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = ((w - offsets[..., None]) / safe[..., None]).round().clamp(0, 15).to(torch.uint8).view(n, k)
    return Int4Codes(codes, scales, offsets)


def quantize_int8(weight: torch.Tensor) -> Int8Codes:
    """Symmetric 8-bit codes per group of 32 (like Q8_0): d = max|w|/127 rounded to float16."""
    n, k = weight.shape
    _check_shape(n, k)
    w = weight.detach().float().view(n, k // GROUP, GROUP)
    scales = (w.abs().amax(-1) / 127).half().float()  # [N, K/32]
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = (w / safe[..., None]).round().clamp(-127, 127).to(torch.int8).view(n, k)
    return Int8Codes(codes, scales)


def quantize_linears(module: nn.Module, bits: int = 8) -> nn.Module:
    """`module` with every nn.Linear inside it (or itself) whose shape the kernel takes replaced, in
    place, by a QuantizedLinear of `bits` (8: symmetric, like Q8_0; 4: asymmetric, like Q4_1; groups
    of 32). For small drafting networks (EAGLE heads) that run beside a quantized target: one of their
    steps reads its weights once, so float32 weights make a step cost what their bytes cost."""
    if bits not in (4, 8):
        raise ValueError(f"quantize_linears makes 4- or 8-bit weights, not {bits}-bit")
    if isinstance(module, nn.Linear):
        return _quantized(module, bits)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, _quantized(child, bits))
    return module


def _quantized(linear: nn.Linear, bits: int) -> nn.Module:
    if linear.in_features % GROUP or linear.out_features % TILE:
        return linear  # a shape the kernel does not take stays float
    codes = quantize_int4(linear.weight) if bits == 4 else quantize_int8(linear.weight)
    return QuantizedLinear(codes, None if linear.bias is None else linear.bias.detach())


def quantized_bits(model: nn.Module) -> int | None:
    """The width for small networks beside `model` (`quantize_linears`): 4 where some of its linear
    layers have 4-bit codes (a Q4 GGUF), else 8 where any is quantized, else None."""
    bits = [m.bits for m in model.modules() if isinstance(m, QuantizedLinear)]
    return None if not bits else 4 if min(bits) <= 4 else 8
