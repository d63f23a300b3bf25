"""Weight-only quantized linear layers, run as they are stored, with 8-bit activations.

Weights are kept in codes per group of 32 inputs: 4-bit (`Int4Codes`, w = s·q + c, q in 0..15:
GGUF's Q4_1 is s = d, c = m; Q4_0 is s = d, c = −8d) or 8-bit (`Int8Codes`, w = d·q: GGUF's Q8_0),
scales and offsets in float16 as GGUF stores them. `QuantizedLinear` multiplies them with the
compiled kernel `quant_linear` (`runtime/kernels/quant_gemm.cpp`), which quantizes each input row
in blocks of 32 to 8 bits (d = max|x|/127 per row and block, llama.cpp's recipe for Q4 × Q8_0),
takes exact integer dot products per block (AVX-512 VNNI, or AVX2) and combines them in float32 in
a fixed order. So:
- a weight tile is unpacked once per call and used by every row: a pass over k rows streams the
  weights once (measured in `scripts/pass_costs.py`);
- every row is computed by one recipe whatever the row count: batch-invariant, bit for bit, and
  the AVX-512 and AVX2 builds agree bit for bit;
- the only rounding besides float32 is the rows' 8-bit quantization (relative error ≤ 1/254 of
  each block's largest entry); the residual stream, norms, attention, softmax and logits stay float32.

`quantize_int4` / `quantize_int8` make codes from float weights (a float checkpoint loaded with
`weights="int4"` or `"int8"`); `gguf_blocks` reads Q4_0, Q4_1 and Q8_0 blocks straight from a GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from specdec.errors import ConfigError
from specdec.runtime.kernels import invariant_kernels

GROUP = 32
TILE = 16  # the kernel's outputs per tile: a layer's output size must be a multiple
EXACT_GGUF_TYPES = {"Q4_0": "int4", "Q4_1": "int4", "Q8_0": "int8"}


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

    def rows(self, index: np.ndarray) -> "Int4Codes":
        return Int4Codes(self.codes[index], self.scales[index], self.offsets[index])


@dataclass
class Int8Codes:
    """8-bit codes [N, K] (−128..127) with one scale per group [N, K/32]: w = d·q."""

    codes: torch.Tensor
    scales: torch.Tensor

    def dequantize(self) -> torch.Tensor:  # [N, K] float32, exact
        n, k = self.codes.shape
        return (self.codes.view(n, k // GROUP, GROUP).float() * self.scales[..., None]).view(n, k)

    def rows(self, index: np.ndarray) -> "Int8Codes":
        return Int8Codes(self.codes[index], self.scales[index])


def concat_codes(parts: list) -> Int4Codes | Int8Codes:
    """Stack the codes of several layers' outputs (fused q/k/v or gate/up), all of one kind."""
    first = parts[0]
    if isinstance(first, Int4Codes):
        return Int4Codes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scales", "offsets")))
    return Int8Codes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scales")))


def quantized_kernels_available() -> bool:
    return invariant_kernels() is not None


class QuantizedLinear(nn.Module):
    """y = x Wᵀ (+ bias) with W in 4- or 8-bit codes; x [..., in] float32 -> [..., out] float32."""

    def __init__(self, codes: Int4Codes | Int8Codes, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        kernels = invariant_kernels()
        if kernels is None:
            raise ConfigError("quantized weights need specdec's compiled CPU kernels, which could not be built "
                              "here; install a C++ compiler (g++) and ninja, or use --weights float32")
        self.out_features, self.in_features = codes.codes.shape
        _check_shape(self.out_features, self.in_features)
        self.bits = 4 if isinstance(codes, Int4Codes) else 8
        scales = _float16_exact(codes.scales, "scales")
        offsets = _float16_exact(codes.offsets, "offsets") if self.bits == 4 else None
        self.packed = kernels.pack_quant_weights(codes.codes.contiguous(), scales, offsets)  # [N/16, K/32, bytes]
        self.multiply = kernels.quant_linear
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)  # [M, in]
        out = self.multiply(rows, self.packed)  # [M, out]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:  # [out, in] float32: the exact weights
        return unpack_codes(self.packed, self.bits).dequantize()


def unpack_codes(packed: torch.Tensor, bits: int) -> Int4Codes | Int8Codes:
    """The codes, scales and offsets back from the kernel's layout (see quant_gemm.cpp's header)."""
    tiles, blocks, _ = packed.shape
    data = packed.numpy()
    if bits == 4:
        chunks = data[..., :256].reshape(tiles, blocks, 4, TILE, 4)  # [T, B, j, lane, i]
        both = np.stack([chunks & 0x0F, chunks >> 4], axis=2)  # [T, B, half, j, lane, i]: input 16·half + 4j + i
        codes = both.transpose(0, 4, 1, 2, 3, 5)  # [T, lane, B, half, j, i]
    else:
        codes = data[..., :512].view(np.int8).reshape(tiles, blocks, 8, TILE, 4).transpose(0, 3, 1, 2, 4)  # [T, lane, B, g, i]
    codes = torch.from_numpy(np.ascontiguousarray(codes).reshape(tiles * TILE, blocks * GROUP))

    def halves(offset: int) -> torch.Tensor:  # 16 float16 per tile and block -> [N, K/32] float32
        field = data[..., offset:offset + 32].copy().view(np.float16)  # [T, B, lane]
        return torch.from_numpy(field.transpose(0, 2, 1).reshape(tiles * TILE, blocks).astype(np.float32))

    if bits == 4:
        return Int4Codes(codes, halves(256), halves(288))
    return Int8Codes(codes, halves(512))


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


def gguf_blocks(type_name: str, data: np.ndarray, rows: int, cols: int) -> Int4Codes | Int8Codes:
    """Codes of a Q4_0, Q4_1 or Q8_0 GGUF tensor from its raw blocks (data: [rows, bytes per row])."""
    blocks = np.ascontiguousarray(data).reshape(rows, cols // GROUP, -1)  # [N, K/32, bytes per block]

    def half(offset: int) -> torch.Tensor:  # a float16 field of every block -> [N, K/32] float32
        return torch.from_numpy(blocks[..., offset:offset + 2].copy().view(np.float16)[..., 0].astype(np.float32))

    def nibbles(offset: int) -> torch.Tensor:  # 16 bytes: values 0..15 low nibbles, 16..31 high ones
        packed = blocks[..., offset:offset + 16]
        codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # [N, K/32, 32]
        return torch.from_numpy(codes.reshape(rows, cols).astype(np.uint8))

    if type_name == "Q4_0":
        scales = half(0)
        return Int4Codes(nibbles(2), scales, -8 * scales)
    if type_name == "Q4_1":
        return Int4Codes(nibbles(4), half(0), half(2))
    if type_name == "Q8_0":
        codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
        return Int8Codes(torch.from_numpy(codes), half(0))
    raise ValueError(f"no exact layout for GGUF type {type_name}")


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
    """The fewest bits among `model`'s quantized linear layers (4 for a Q4 GGUF), None if none is."""
    bits = [m.bits for m in model.modules() if isinstance(m, QuantizedLinear)]
    return min(bits) if bits else None
