"""Checks the kernel tests share: a quantized layer against its stated recipe, and code run on the
kernels built for plain x86-64 with AVX2 (a subprocess), for comparing builds bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from specdec.runtime.quant import GROUP, QuantizedLinear


def recipe(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's stated arithmetic in float64 for rows x [M, K] and weights w [N, K]: (output, the
    rows as quantized [M, K], the rows' quantization error bound per output [M, N])."""
    m, k = x.shape
    blocks = x.double().view(m, k // GROUP, GROUP)
    scale = blocks.abs().amax(-1) / 127  # [M, K/32]
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    x_hat = ((blocks / safe[..., None]).round().clamp(-127, 127) * scale[..., None]).view(m, k)
    w = w.double()  # [N, K]
    w_abs_per_block = w.abs().view(w.shape[0], k // GROUP, GROUP).sum(-1)  # [N, K/32]
    return x_hat @ w.T, x_hat, (scale / 2) @ w_abs_per_block.T


def check_layer_recipe(layer: QuantizedLinear) -> None:
    """Every output within float32 round-off (1e-5 relative to Σ|x̂||w|) of the recipe in float64, and
    within the rows' quantization error of the exact product, which is visibly not skipped."""
    w = layer.dequantized_weight()
    x = torch.randn(9, layer.in_features, generator=torch.Generator().manual_seed(0))
    got = layer(x).double()
    want, x_hat, quantization = recipe(x, w)
    round_off = 1e-5 * (x_hat.abs() @ w.double().abs().T)
    assert ((got - want).abs() <= round_off).all()
    exact = x.double() @ w.double().T
    assert ((got - exact).abs() <= quantization + round_off).all()
    assert ((got - exact).abs() > round_off).any()  # the rows' quantization is visible, not skipped


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
