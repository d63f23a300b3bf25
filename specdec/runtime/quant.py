"""Weight-only quantized linear layers, run as they are stored, with 8-bit activations.

Weights are kept packed (`QuantizedLinear.packed`) in one of the kernels' layouts: codes per block
of 32 inputs with scales and offsets, w = s·u + c (a GGUF type's own, `PACKED_GGUF_TYPES`; or from float
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
are packed by the compiled `pack_gguf` into a layout per type (`PACKED_GGUF_TYPES`; the layouts are described
in `kernels/quant_gemm.cpp`), exactly and holding only what the type stores (the symmetric types,
Q4_0, Q5_0, Q3_K and Q6_K, keep no offsets): K-quants' sub-block scales are small integers times a
float16, exact in float32, and the kernel computes s = d·sc in float32 as it goes. A fused layer
whose tensors have different types (a Q4_K_M file's Q4_K q and k beside a Q6_K v) keeps one part
per type (`gguf_parts`), stacked along the outputs: no part is widened into another's layout.
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
# The GGUF types the kernels pack, each into a layout of its own (`pack_gguf`; their list is the compiled
# `packed_gguf_types()`, tests/test_quantized.py checks this one against it): the bits of their codes as
# packed, and which have scales per super-block of 256 inputs (K-quants: the rows' 8-bit scale too)
CODE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 6, "Q5_1": 6, "Q8_0": 8, "Q2_K": 4, "Q3_K": 4, "Q4_K": 4, "Q5_K": 6, "Q6_K": 6}
PACKED_GGUF_TYPES = tuple(CODE_BITS)
SUPER_BLOCK_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


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


def gguf_parts(types: list[str]) -> list[tuple[str, int]] | None:
    """How a layer of tensors of `types` (stacked along the outputs) is packed: [(type, how many
    consecutive tensors)] per part, one part per run of one type; None when a type has no packed
    layout (float types: the layer runs as float32)."""
    if any(t not in PACKED_GGUF_TYPES for t in types):
        return None
    parts: list[tuple[str, int]] = []
    for t in types:
        if parts and parts[-1][0] == t:
            parts[-1] = (t, parts[-1][1] + 1)
        else:
            parts.append((t, 1))
    return parts


def pack_gguf_tensors(raws: list[torch.Tensor], types: list[str], orders: list[torch.Tensor | None]) -> torch.Tensor:
    """Raw GGUF blocks of one type ([rows, bytes] uint8 per tensor, stacked along outputs; each
    optional order [rows] picks the stored row of every output row) -> packed weights in the type's
    layout."""
    kernels = _kernels_or_raise()
    none = torch.empty(0, dtype=torch.long)
    return kernels.pack_gguf(raws, types, [none if o is None else o for o in orders])


def _kernels_or_raise():
    kernels = invariant_kernels()
    if kernels is None:
        raise ConfigError("quantized weights need specdec's compiled CPU kernels, which could not be built "
                          "here; install a C++ compiler (g++) and ninja, or use --weights float32")
    return kernels


def quantized_kernels_available() -> bool:
    return invariant_kernels() is not None


class QuantizedLinear(nn.Module):
    """y = x Wᵀ (+ bias) with W in packed quantized codes; x [..., in] float32 -> [..., out] float32.
    W is one or more parts stacked along the outputs, each in its own layout (`parts`, `layouts`)."""

    def __init__(self, codes: Int4Codes | Int8Codes, bias: torch.Tensor | None = None) -> None:
        kernels = _kernels_or_raise()
        out_features, in_features = codes.codes.shape
        _check_shape(out_features, in_features)
        four = isinstance(codes, Int4Codes)
        scales = _float16_exact(codes.scales, "scales")
        offsets = _float16_exact(codes.offsets, "offsets") if four else None
        packed = kernels.pack_quant_weights(codes.codes.contiguous(), scales, offsets)  # [N/16, K/32, bytes]
        self._set_parts([packed], ["Q4_1" if four else "Q8_0"], bias)

    @classmethod
    def from_packed(cls, parts: list[torch.Tensor], layouts: list[str], bias: torch.Tensor | None = None) -> "QuantizedLinear":
        """A layer over weights already packed, part i in `layouts[i]`'s format (GGUF blocks:
        `pack_gguf_tensors`), the parts stacked along the outputs."""
        layer = cls.__new__(cls)
        layer._set_parts(list(parts), list(layouts), bias)
        return layer

    def _set_parts(self, parts: list[torch.Tensor], layouts: list[str], bias: torch.Tensor | None) -> None:
        nn.Module.__init__(self)
        if not parts or len(parts) != len(layouts):
            raise ValueError("a quantized layer needs one layout per part")
        self.parts = parts  # each [N_i/16, units, unit bytes] uint8
        self.layouts = layouts
        self.bits = min(CODE_BITS[layout] for layout in layouts)
        self.part_features = [part.shape[0] * TILE for part in parts]  # outputs of each part
        self.out_features = sum(self.part_features)
        # inputs of a row sharing one 8-bit scale, per part: Q8_K's per super-block, Q8_0's per block
        self.activation_groups = [8 * GROUP if layout in SUPER_BLOCK_TYPES else GROUP for layout in layouts]
        self.in_features = parts[0].shape[1] * self.activation_groups[0]
        self.multiply = _kernels_or_raise().quant_linear
        self.bias = None if bias is None else bias.detach().float()

    @property
    def layout(self) -> str:
        """The parts' layouts, as `Q4_K` or `Q4_K+Q6_K`."""
        return "+".join(self.layouts)

    @property
    def packed(self) -> torch.Tensor:
        """The packed weights of a one-part layer (a token table, a head's linear)."""
        if len(self.parts) != 1:
            raise ValueError(f"this layer has {len(self.parts)} parts ({self.layout}); use .parts")
        return self.parts[0]

    def slots(self, count: int) -> list[torch.Tensor]:
        """The parts in `count` slots, unused ones empty (the fused kernels' weight lists, layer.cpp)."""
        if len(self.parts) > count:
            raise ValueError(f"a layer of {len(self.parts)} parts does not fit {count} slots")
        return [*self.parts, *[torch.empty(0, dtype=torch.uint8)] * (count - len(self.parts))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # [M, in]
        out = self.multiply(rows, self.parts)  # [M, out]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:  # [out, in] float32: the exact weights
        kernels = _kernels_or_raise()
        everything = torch.empty(0, dtype=torch.long)
        return torch.cat([kernels.dequantize_packed(part, everything) for part in self.parts])


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
