"""Weight-only quantized linear layers, run as they are stored (float32 activations).

Both layers multiply rows by weights kept in 4-bit codes, in groups of 32 along the input
dimension, with PyTorch's int4 CPU kernel (`_weight_int4pack_mm_for_cpu`), which computes every
output row by the same recipe whatever the row count (batch-invariant; tested bit for bit).

Precision: the kernel is fast only with bfloat16 operands (measured on the 3072 × 576 layer, one
row: 26 µs in bfloat16, 1.3 ms in float32, a slow fallback). So each layer rounds its input rows,
its scales and zero points to bfloat16, dequantizes each weight as fma(q − 8, s, z), accumulates
in float32 and returns bfloat16 outputs, which the layer widens back to float32 (the residual
stream, norms, attention and softmax stay float32). The 4-bit codes are the GGUF's own; only the
scales and zeros (float16 in the file) take the bfloat16 rounding, 2^-9 of their size at most.

- `Int4Linear`: w = (q − 8)·s + z per group. GGUF's Q4_0 (w = d·(q − 8)) is s = d, z = 0; Q4_1
  (w = d·q + m) is s = d, z = m + 8d.
- `Int8Linear`: symmetric 8-bit codes with one scale per group (GGUF's Q8_0: w = d·q, q in
  [−128, 127]), run as two int4 planes: q = 16·hi + lo with hi in [−8, 7], lo in [0, 15], so
  w = (16d)·hi + d·lo; the output is the float32 sum of the two planes' products.

`quantize_int4` / `quantize_int8` make the codes from float weights (a float checkpoint loaded
with `weights="int4"` or `"int8"`); `gguf_blocks` reads Q4_0, Q4_1 and Q8_0 blocks straight from a
GGUF tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

GROUP = 32
KERNEL_DTYPE = torch.bfloat16  # the int4 kernel's operands and outputs (see above)
EXACT_GGUF_TYPES = {"Q4_0": "int4", "Q4_1": "int4", "Q8_0": "int8"}


def int4_kernel_available() -> bool:
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


@dataclass
class Int4Codes:
    """4-bit codes [N, K] (values 0..15) with a scale and a zero per group [N, K/32]: w = (q − 8)·s + z."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[N, K] float32: the exact weights, with scales and zeros first rounded to `dtype`
        (bfloat16: what the kernel uses), then one rounding to float32 (the kernel's fma)."""
        n, k = self.codes.shape
        q = self.codes.view(n, k // GROUP, GROUP).double() - 8
        scales, zeros = (t.to(dtype).double()[..., None] for t in (self.scales, self.zeros))
        return (q * scales + zeros).float().view(n, k)

    def rows(self, index: np.ndarray) -> "Int4Codes":
        return Int4Codes(self.codes[index], self.scales[index], self.zeros[index])


@dataclass
class Int8Codes:
    """8-bit codes [N, K] (−128..127) with one scale per group [N, K/32]: w = d·q."""

    codes: torch.Tensor
    scales: torch.Tensor

    def dequantize(self) -> torch.Tensor:  # [N, K] float32
        n, k = self.codes.shape
        return (self.codes.view(n, k // GROUP, GROUP).float() * self.scales[..., None]).view(n, k)

    def rows(self, index: np.ndarray) -> "Int8Codes":
        return Int8Codes(self.codes[index], self.scales[index])


def concat_codes(parts: list) -> Int4Codes | Int8Codes:
    """Stack the codes of several layers' outputs (fused q/k/v or gate/up), all of one kind."""
    first = parts[0]
    if isinstance(first, Int4Codes):
        return Int4Codes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scales", "zeros")))
    return Int8Codes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("codes", "scales")))


class Int4Linear(nn.Module):
    def __init__(self, codes: Int4Codes, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = codes.codes.shape
        _check_shape(self.in_features)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.codes.to(torch.int32).contiguous(), 1)
        # [K/32, N, 2]: (scale, zero) per group and output, bfloat16 (the kernel's operand type)
        self.scale_zero = torch.stack([codes.scales, codes.zeros], -1).transpose(0, 1).to(KERNEL_DTYPE).contiguous()
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] float32 -> [..., out] float32
        rows = x.reshape(-1, self.in_features).to(KERNEL_DTYPE)  # [M, in]
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP, self.scale_zero).float()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


class Int8Linear(nn.Module):
    def __init__(self, codes: Int8Codes, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        q = codes.codes.to(torch.int32)
        high = torch.div(q, 16, rounding_mode="floor")  # [N, K] in [-8, 7]
        low = q - 16 * high  # [N, K] in [0, 15]
        scales = codes.scales.float()
        self.high = Int4Linear(Int4Codes((high + 8).to(torch.uint8), 16 * scales, torch.zeros_like(scales)))
        self.low = Int4Linear(Int4Codes(low.to(torch.uint8), scales, 8 * scales))
        self.out_features, self.in_features = self.high.out_features, self.high.in_features
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., in] float32 -> [..., out]
        out = self.high(x) + self.low(x)
        return out if self.bias is None else out + self.bias


def quantized_linear(codes: Int4Codes | Int8Codes, bias: torch.Tensor | None = None) -> nn.Module:
    return Int4Linear(codes, bias) if isinstance(codes, Int4Codes) else Int8Linear(codes, bias)


def _check_shape(in_features: int) -> None:
    if in_features % GROUP:
        from specdec.errors import ConfigError

        raise ConfigError(f"quantized weights need an input size divisible by {GROUP}, got {in_features}")


def quantize_int4(weight: torch.Tensor) -> Int4Codes:
    """Asymmetric 4-bit codes per group of 32 (like Q4_1): s = (max − min)/15, z = min + 8s."""
    n, k = weight.shape
    _check_shape(k)
    w = weight.detach().float().view(n, k // GROUP, GROUP)
    low, high = w.amin(-1), w.amax(-1)  # [N, K/32]
    scales = (high - low) / 15
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = ((w - low[..., None]) / safe[..., None]).round().clamp(0, 15).to(torch.uint8).view(n, k)
    return Int4Codes(codes, scales, low + 8 * scales)


def quantize_int8(weight: torch.Tensor) -> Int8Codes:
    """Symmetric 8-bit codes per group of 32 (like Q8_0): d = max|w|/127."""
    n, k = weight.shape
    _check_shape(k)
    w = weight.detach().float().view(n, k // GROUP, GROUP)
    scales = w.abs().amax(-1) / 127  # [N, K/32]
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
        return Int4Codes(nibbles(2), scales, torch.zeros_like(scales))
    if type_name == "Q4_1":
        scales, mins = half(0), half(2)
        return Int4Codes(nibbles(4), scales, mins + 8 * scales)
    if type_name == "Q8_0":
        codes = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
        return Int8Codes(torch.from_numpy(codes), half(0))
    raise ValueError(f"no exact layout for GGUF type {type_name}")
