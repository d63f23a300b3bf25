"""Checks the kernel tests share: a quantized layer against its stated recipe, and code run on the
kernels built for plain x86-64 with AVX2 (a subprocess), for comparing builds bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from specdec.runtime.quant import GROUP, QuantizedLinear
from tests.tolerances import U32


def quantized_rows(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows x [M, K] quantized as the kernel states (llama.cpp's Q8_K for group 256, its x86 Q8_0 for
    32), in float32 as the kernel computes the codes: (x̂ [M, K] float64, the bound on |x - x̂| per
    group [M, K/group] float64)."""
    m, k = x.shape
    blocks = x.float().view(m, k // group, group)
    amax = blocks.abs().amax(-1)  # [M, K/group]
    nonzero = amax > 0
    if group == 8 * GROUP:  # Q8_K: the signed entry of largest magnitude, d = 1 / (-127 / top)
        top = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True)).squeeze(-1)
        mul = torch.where(nonzero, -127 / torch.where(nonzero, top, 1), 0)
        scale = torch.where(nonzero, 1 / torch.where(nonzero, mul, 1), 0)
        bound = scale.double().abs() / 2
    else:  # Q8_0: the multiplier 127 / amax, the scale amax / 127 in float16
        mul = torch.where(nonzero, 127 / torch.where(nonzero, amax, 1), 0)
        scale = (amax / 127).half().float()
        bound = amax.double() / 127 / 2 + 127 * (amax.double() / 127 - scale.double()).abs()
    codes = (blocks * mul[..., None]).round().clamp(max=127)  # ties to even, as the kernel
    return (codes.double() * scale.double()[..., None]).view(m, k), bound


def recipe(x: torch.Tensor, w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's stated arithmetic in float64 for rows x [M, K] and weights w [N, K]: (output, the
    rows as quantized [M, K], the rows' quantization error bound per output [M, N])."""
    m, k = x.shape
    x_hat, bound = quantized_rows(x, group)
    w = w.double()  # [N, K]
    w_abs_per_group = w.abs().view(w.shape[0], k // group, group).sum(-1)  # [N, K/group]
    return x_hat @ w.T, x_hat, bound @ w_abs_per_group.T


def check_layer_recipe(layer: QuantizedLinear) -> None:
    """Every output within float32 round-off (K·u relative to Σ|x̂||w|) of the recipe in float64, and
    within the rows' quantization error of the exact product, which is visibly not skipped; each part
    of the layer by its own recipe (the rows quantized as its type takes them)."""
    w = layer.dequantized_weight()
    x = torch.randn(9, layer.in_features, generator=torch.Generator().manual_seed(0))
    got = layer(x).double()
    first = 0
    for features, group in zip(layer.part_features, layer.activation_groups):
        part = slice(first, first + features)
        want, x_hat, quantization = recipe(x, w[part], group)
        # float32 sums of at most K products, in whatever order the kernel takes: within γ_K ≈ K·u of Σ|x̂||w|
        round_off = layer.in_features * U32 * (x_hat.abs() @ w[part].double().abs().T)
        assert ((got[:, part] - want).abs() <= round_off).all()
        exact = x.double() @ w[part].double().T
        assert ((got[:, part] - exact).abs() <= quantization + round_off).all()
        assert ((got[:, part] - exact).abs() > round_off).any()  # the rows' quantization is visible, not skipped
        first += features


def on_generic_build(code: str) -> list:
    """[the build's instruction set, *result]: `code` (which sets `result`, a JSON-able list) run in a
    fresh process on the kernels built for plain x86-64 with AVX2 (and torch's AVX2 kernels)."""
    env = {**os.environ, "SPECDEC_KERNEL_ISA": "generic", "ATEN_CPU_CAPABILITY": "avx2"}
    script = (f"import json; {code}; from specdec.runtime.kernels import invariant_kernels; "
              "print(json.dumps([invariant_kernels().quant_linear_path(), *result]))")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
