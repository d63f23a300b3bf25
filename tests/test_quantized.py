"""Quantized weights run as stored, and batch invariance: greedy speculation exact by construction.

- GGUF blocks: the 4-bit and 8-bit codes read from the default model's Q4_1 and Q8_0 tensors give
  gguf's own dequantization bit for bit; a wrong zero point (Q4_1's m instead of m + 8d) does not.
- Layers: `Int4Linear` applied to the identity returns its weights as the kernel computes them
  (fma(q − 8, s, z) with bfloat16 s and z, rounded to bfloat16) exactly; `Int8Linear` the float32
  sum of its two planes; on random rows each output is within 2^-7 · Σ|x||w| of the float32
  product with the exact weights (bfloat16 rounding of rows, scales and outputs: 3 · 2^-9).
- The int4 model against the float32 model with the GGUF's dequantized weights over a fixed text:
  logits within 2.0 absolute, top-1 agreement ≥ 90% (measured on an AVX-512 machine: 0.74 and
  100% over 88 tokens; logits span about ±40; printed by the test).
- Batch invariance, bit for bit: every row of a pass over k = 1..17 tokens (a chain) equals the
  one-token pass at the same position, at cache lengths 5, 40 and 300, and every node of a
  17-node token tree equals the one-token passes along its path, for the int4 (default) and int8
  weight forms; and on the generic path (kernels built for plain AVX2 and torch's AVX2
  kernels, in a subprocess). Negative control: with the batch-invariant kernels switched off
  (PyTorch's SDPA attention), rows differ. The float32 and bfloat16 forms are not batch-invariant
  (MKL and oneDNN choose their kernels by row count): measured here, not promised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from specdec.runtime import load_model
from specdec.runtime.loading import builtin_gguf_path
from specdec.runtime.quant import Int4Linear, Int8Linear, gguf_blocks, quantized_linear
from specdec.tree import TokenTree, tree_inputs

pytestmark = pytest.mark.model
CACHE_LENGTHS = (5, 40, 300)
MAX_K = 17


@pytest.fixture(scope="module")
def gguf_tensors():
    import gguf

    reader = gguf.GGUFReader(str(builtin_gguf_path("smollm2-135m")))
    return {t.name: t for t in reader.tensors}


def _codes(tensor):
    cols, rows = (int(n) for n in tensor.shape)
    return gguf_blocks(tensor.tensor_type.name, tensor.data, rows, cols)


def _dequantized(tensor) -> torch.Tensor:
    import gguf

    return torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32))


@pytest.mark.parametrize("name", ["blk.3.ffn_down.weight", "blk.0.attn_q.weight", "token_embd.weight"])
def test_gguf_codes_reproduce_the_dequantized_weights(gguf_tensors, name):
    tensor = gguf_tensors[name]
    assert tensor.tensor_type.name in ("Q4_1", "Q8_0")
    assert torch.equal(_codes(tensor).dequantize(), _dequantized(tensor))


def test_a_wrong_zero_point_is_caught(gguf_tensors):
    tensor = gguf_tensors["blk.3.ffn_down.weight"]
    codes = _codes(tensor)
    codes.zeros = codes.zeros - 8 * codes.scales  # Q4_1's m, not the kernel's m + 8d
    assert not torch.equal(codes.dequantize(), _dequantized(tensor))


def test_int4_layer_holds_the_kernel_weights_exactly_and_multiplies_within_round_off(gguf_tensors):
    codes = _codes(gguf_tensors["blk.3.ffn_down.weight"])
    layer = quantized_linear(codes)
    assert isinstance(layer, Int4Linear)
    identity = torch.eye(layer.in_features)
    assert torch.equal(layer(identity).T, codes.dequantize(torch.bfloat16).bfloat16().float())
    x = torch.randn(9, layer.in_features, generator=torch.Generator().manual_seed(0))
    exact = codes.dequantize()
    bound = 2**-7 * (x.abs() @ exact.abs().T)
    assert ((layer(x) - x @ exact.T).abs() <= bound).all()


def test_int8_layer_is_two_exact_int4_planes(gguf_tensors):
    codes = _codes(gguf_tensors["token_embd.weight"]).rows(np.arange(2048))
    layer = quantized_linear(codes)
    assert isinstance(layer, Int8Linear)
    identity = torch.eye(layer.in_features)
    assert torch.equal(layer(identity), layer.high(identity) + layer.low(identity))
    x = torch.randn(9, layer.in_features, generator=torch.Generator().manual_seed(0))
    exact = codes.dequantize()
    bound = 2**-7 * (x.abs() @ exact.abs().T)
    assert ((layer(x) - x @ exact.T).abs() <= bound).all()


def test_int4_model_against_the_float32_model():
    text = ("The history of the printing press begins in the fifteenth century, when Johannes "
            "Gutenberg combined movable metal type, oil-based ink and a wooden press. ") * 3
    quantized, exact = load_model("smollm2-135m"), load_model("smollm2-135m", weights="float32")
    assert quantized.weights.forms == {"int4", "int8"} and exact.weights.forms == {"float32"}
    ids = torch.tensor([quantized.tokenizer.encode(text)])
    got = quantized.net.forward(ids, quantized.net.new_cache(ids.shape[1]))[0]
    want = exact.net.forward(ids, exact.net.new_cache(ids.shape[1]))[0]
    agreement = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    print(f"int4 vs float32 over {ids.shape[1]} tokens: max |Δlogit| {(got - want).abs().max():.3f}, "
          f"top-1 agreement {agreement:.3f}")
    assert (got - want).abs().max() < 2.0
    assert agreement >= 0.9


def mismatched_rows(net, seed: int = 0) -> int:
    """Rows of k-token passes (chains, k = 1..17, and a 17-node tree) that differ from one-token
    passes at the same positions, summed over the cache lengths; 0 when the model is batch-invariant."""
    gen = torch.Generator().manual_seed(seed)
    vocab = net.vocab_size
    mismatches = 0
    for past in CACHE_LENGTHS:
        prefix = torch.randint(0, vocab, (1, past), generator=gen)
        tokens = torch.randint(0, vocab, (MAX_K,), generator=gen).tolist()
        cache = net.new_cache(past + MAX_K + 1)
        net.forward(prefix, cache)

        def one_token_passes(path: list[int]) -> list[torch.Tensor]:  # logits after each token
            cache.truncate(past)
            return [net.forward(torch.tensor([[tok]]), cache)[0, -1] for tok in path]

        reference = one_token_passes(tokens)
        for k in range(1, MAX_K + 1):
            cache.truncate(past)
            rows = net.forward(torch.tensor([tokens[:k]]), cache)[0]  # [k, V]
            mismatches += sum(not torch.equal(rows[i], reference[i]) for i in range(k))
        # a tree: root = tokens[0], 16 nodes with random earlier parents
        parents = [-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, MAX_K - 1)]
        tree = TokenTree(tokens[1:], parents)
        ids, positions, mask = tree_inputs(tree, tokens[0], past, "cpu")
        cache.truncate(past)
        rows = net.forward(ids, cache, positions=positions, tree_mask=mask)[0]  # [17, V]
        for node in range(len(tree)):
            path = [tokens[0], *(tree.tokens[i] for i in tree.path_to(node))]
            mismatches += not torch.equal(rows[node + 1], one_token_passes(path)[-1])
    return mismatches


@pytest.mark.parametrize("weights", ["auto", "int8"])
def test_rows_of_a_k_token_pass_equal_one_token_passes(weights):
    model = load_model("smollm2-135m", weights=weights)
    assert mismatched_rows(model.net) == 0


def test_negative_control_pytorch_attention_is_not_batch_invariant(monkeypatch):
    monkeypatch.setenv("SPECDEC_KERNELS", "off")
    assert mismatched_rows(load_model("smollm2-135m").net) > 0


def test_generic_path_is_batch_invariant_too():
    """The kernels built for plain x86-64 with AVX2 and torch's AVX2 kernels, in a fresh process."""
    env = {**os.environ, "SPECDEC_KERNEL_ISA": "generic", "ATEN_CPU_CAPABILITY": "avx2"}
    code = ("import json, torch; from tests.test_quantized import mismatched_rows; "
            "from specdec.runtime import load_model; "
            "print(json.dumps([torch.backends.cpu.get_cpu_capability(), mismatched_rows(load_model('smollm2-135m').net)]))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-2000:]
    capability, mismatches = json.loads(done.stdout.strip().splitlines()[-1])
    assert capability in ("AVX2", "DEFAULT")
    assert mismatches == 0
