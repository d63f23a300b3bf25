"""Quantized weights run as stored, and batch invariance: greedy speculation exact by construction.

- GGUF blocks: the default model's Q4_1 and Q8_0 tensors, packed as stored, give back gguf's own
  dequantization bit for bit (query rows un-permuted into the Hugging Face order); Q4_1 blocks read
  as Q4_0's do not (test_gguf_types.py does every type on random blocks).
- Rows quantized: an identity layer (Q8_0, Q4_K) returns the rows as quantized, equal bit for bit
  to the recipe (Q8_0 / Q8_K, ties to even; control: ties rounded away from zero differ).
- Layers: on random rows each output equals the stated recipe (rows quantized to 8 bits as llama.cpp does, exact
  integer dots, float32 combination) computed in float64 within float32 round-off (K·u relative
  to Σ|x̂||w|, K the row length), and the float32 product with the exact weights within the rows' quantization error
  (Σ over the rows' scale groups of the codes' error bound · Σ|w|, plus that round-off).
- The int4 model against the float32 model with the GGUF's dequantized weights over a fixed text:
  logits within 2.0 absolute, top-1 agreement ≥ 90% (printed by the test; see the README for
  the measured values; logits span about ±40).
- Batch invariance, bit for bit: every row of a pass over k = 1..17 tokens (a chain) equals the
  one-token pass at the same position, at cache lengths 5, 40 and 300, and every node of a
  17-node token tree equals the one-token passes along its path, for the int4 (default) and int8
  weight forms; and on the generic path (kernels built for plain x86-64 with AVX2, in a
  subprocess), whose logits also equal this machine's build bit for bit. Negative control: with
  the kernels switched off (float32 weights, PyTorch's SDPA attention), rows differ. The float32
  and bfloat16 forms are not batch-invariant (MKL and oneDNN choose their kernels by row count):
  measured here, not promised.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.runtime import load_model
from specdec.runtime.llama import Segment
from specdec.runtime.loading import builtin_gguf_path
from specdec.runtime.gguf_model import GgufTensors
from specdec.runtime.quant import GROUP, PACKED_GGUF_TYPES, QuantizedLinear, pack_gguf_tensors, quantize_int4, quantize_int8
from specdec.tree import TokenTree, tree_inputs
from tests.kernel_checks import check_layer_recipe, on_generic_build, quantized_rows
from tests.tolerances import decoder_sums, max_difference, round_off

pytestmark = pytest.mark.model
CACHE_LENGTHS = (5, 40, 300)
MAX_K = 17


@pytest.fixture(scope="module")
def gguf_tensors():
    return GgufTensors(builtin_gguf_path("smollm2-135m"))


def _dequantized(tensors, name: str) -> torch.Tensor:
    import gguf

    return torch.from_numpy(gguf.quants.dequantize(tensors.raw(name).numpy(), tensors.by_name[name].tensor_type)
                            .astype(np.float32))


def _layer(tensors, name: str, order=None) -> QuantizedLinear:
    kind = tensors.type_of(name)
    return QuantizedLinear.from_packed([pack_gguf_tensors([tensors.raw(name)], [kind], [order])], [kind])


def test_the_packed_types_are_the_kernels_own_list():
    """runtime/quant.py's packed GGUF types are the ones the compiled `pack_gguf` lists, so the Python
    list cannot drift from the kernels; a type outside it is refused by the kernels (the control)."""
    from specdec.runtime.kernels import invariant_kernels

    kernels = invariant_kernels()
    assert kernels is not None
    assert sorted(kernels.packed_gguf_types()) == sorted(PACKED_GGUF_TYPES)
    with pytest.raises(RuntimeError, match="no packing for GGUF type IQ4_NL"):
        kernels.pack_gguf([torch.zeros(16, 18, dtype=torch.uint8)], ["IQ4_NL"], [torch.arange(16)])


@pytest.mark.parametrize("name", ["blk.3.ffn_down.weight", "blk.0.attn_v.weight", "token_embd.weight"])
def test_gguf_blocks_reproduce_the_dequantized_weights(gguf_tensors, name):
    assert gguf_tensors.type_of(name) in ("Q4_1", "Q8_0")
    assert torch.equal(_layer(gguf_tensors, name).dequantized_weight(), _dequantized(gguf_tensors, name))


def test_query_rows_come_back_in_the_hugging_face_order(gguf_tensors):
    """GGUF stores Q's rows permuted for its RoPE layout; the layer's rows are the dequantized rows un-permuted."""
    from specdec.runtime.gguf_convert import unpermute_qk

    name = "blk.0.attn_q.weight"
    rows = _dequantized(gguf_tensors, name)
    order = torch.from_numpy(unpermute_qk(np.arange(rows.shape[0]), 9).copy())
    assert torch.equal(_layer(gguf_tensors, name, order).dequantized_weight(), rows[order])
    assert not torch.equal(_layer(gguf_tensors, name, order).dequantized_weight(), rows)


def test_blocks_read_as_another_type_are_caught(gguf_tensors):
    """Negative control: Q4_1 blocks (d, m, nibbles) read as Q4_0's (d, nibbles, offset −8d) are not the weights."""
    name = "blk.3.ffn_down.weight"
    raw = gguf_tensors.raw(name)
    as_q4_0 = raw.reshape(raw.shape[0], -1, 20)[:, :, 2:].reshape(raw.shape[0], -1).contiguous()  # drop m
    wrong = QuantizedLinear.from_packed([pack_gguf_tensors([as_q4_0], ["Q4_0"], [None])], ["Q4_0"])
    assert not torch.equal(wrong.dequantized_weight(), _dequantized(gguf_tensors, name))


@pytest.mark.parametrize("name", ["blk.3.ffn_down.weight", "blk.0.attn_v.weight"])
def test_quantized_layer_follows_its_recipe(gguf_tensors, name):
    layer = _layer(gguf_tensors, name)
    assert layer.bits == (4 if gguf_tensors.type_of(name) == "Q4_1" else 8)
    check_layer_recipe(layer)


def _identity_blocks(kind: str, size: int) -> torch.Tensor:
    """[size, bytes per row] GGUF blocks of the identity matrix: Q8_0 (d = 1, the code 1 on the
    diagonal) or Q4_K (d = 1, dmin = 0, every sub-block's scale 1 and min 0, the code 1 on the diagonal)."""
    per_block = 32 if kind == "Q8_0" else 256
    block_bytes = 34 if kind == "Q8_0" else 144
    blocks = np.zeros((size, size // per_block, block_bytes), dtype=np.uint8)
    blocks[:, :, 0:2] = np.array([1.0], dtype=np.float16).view(np.uint8)  # d
    for n in range(size):
        i = n % per_block
        if kind == "Q8_0":
            blocks[n, n // per_block, 2 + i] = 1
        else:  # scales[12] at 4: sc of sub-blocks 0-3 in bytes 0-3, 4-7 in the low nibbles of bytes 8-11
            blocks[n, :, 4:8], blocks[n, :, 12:16] = 1, 1
            chunk, r = divmod(i, 64)  # qs at 16: 32 bytes per 64 inputs, low nibbles first
            blocks[n, n // per_block, 16 + 32 * chunk + r % 32] = 1 if r < 32 else 0x10
    return torch.from_numpy(blocks.reshape(size, -1))


def _rows_with_ties(group: int) -> torch.Tensor:
    """[4, 512] rows whose scale groups make the multiplier exactly ±1 (rows 0-2: each group holds
    ±127 as its entry of largest magnitude, so half-integers are rounding ties; in row 2 +127 comes
    before -127, the case where Q8_K's first entry of largest magnitude sets the sign); row 3 random."""
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(3)) * 20
    x[0:3] = x[0:3].clamp(-126, 126)
    halves = torch.tensor([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 62.5, -63.5])
    for first in range(0, 512, group):
        x[0:3, first + 1:first + 1 + len(halves)] = halves
        x[0:2, first] = 127.0 if group == GROUP else -127.0
        x[2, first], x[2, first + 20] = 127.0, -127.0
    return x


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K"])
def test_rows_are_quantized_exactly_as_stated(kind):
    """The identity layer returns the rows as quantized, x̂ = codes · scale: equal bit for bit to the
    stated recipe (Q8_0 per 32 inputs, Q8_K per 256; ties to even; the first entry of largest
    magnitude). Control: rounding ties away from zero gives another x̂, so the ties are exercised."""
    group = GROUP if kind == "Q8_0" else 8 * GROUP
    layer = QuantizedLinear.from_packed([pack_gguf_tensors([_identity_blocks(kind, 512)], [kind], [None])], [kind])
    assert torch.equal(layer.dequantized_weight(), torch.eye(512))
    x = _rows_with_ties(group)
    x_hat, _ = quantized_rows(x, group)
    got = layer(x)  # [4, 512]
    assert torch.equal(got, x_hat.float())
    ties_away = torch.sign(x[:3]) * torch.floor(x[:3].abs() + 0.5)  # rows 0-2: multiplier ±1, scale 1
    assert torch.equal(x_hat[:3].float(), torch.round(x[:3]))
    assert not torch.equal(got[:3], ties_away)


@pytest.mark.parametrize("bits", [4, 8])
def test_layers_quantized_from_float_follow_the_recipe(bits):
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    codes = quantize_int4(weight) if bits == 4 else quantize_int8(weight)
    layer = QuantizedLinear(codes)
    assert torch.equal(layer.dequantized_weight(), codes.dequantize())
    check_layer_recipe(layer)


def test_int4_model_against_the_float32_model():
    text = ("The history of the printing press begins in the fifteenth century, when Johannes "
            "Gutenberg combined movable metal type, oil-based ink and a wooden press. ") * 3
    quantized, exact = load_model("smollm2-135m"), load_model("smollm2-135m", weights="float32")
    assert quantized.weights.forms == {"Q4_1", "Q8_0"} and exact.weights.forms == {"float32"}
    ids = torch.tensor([quantized.tokenizer.encode(text)])
    got = quantized.net.forward(ids, quantized.net.new_cache(ids.shape[1]))[0]
    want = exact.net.forward(ids, exact.net.new_cache(ids.shape[1]))[0]
    agreement = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    print(f"int4 vs float32 over {ids.shape[1]} tokens: max |Δlogit| {(got - want).abs().max():.3f}, "
          f"top-1 agreement {agreement:.3f}")
    # the int4 weights' quantization error, not round-off: the kernels give the same bits on every build
    # (test_generic_path_is_batch_invariant_too), so the measured 1.08 (logits ±36) moves with no host
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


@pytest.mark.slow
def test_generic_path_is_batch_invariant_too():
    """The kernels built for plain x86-64 with AVX2 (and torch's AVX2 kernels), in a fresh process."""
    path, mismatches, logits = on_generic_build(
        "from tests.test_quantized import mismatched_rows, fixed_logits; from specdec.runtime import load_model; "
        "net = load_model('smollm2-135m').net; result = [mismatched_rows(net), fixed_logits(net)]")
    assert path == "avx2"
    assert mismatches == 0
    assert logits == fixed_logits(load_model("smollm2-135m").net)  # the same bits as this machine's build


def fixed_logits(net) -> list[float]:
    """Logits of a fixed 40-token pass, for comparing builds bit for bit."""
    ids = torch.arange(100, 140)[None]
    return net.forward(ids, net.new_cache(40))[0, :, :64].flatten().tolist()


@pytest.mark.parametrize("kernels", ["on", "off"])
def test_sequences_in_one_pass_equal_each_sequence_alone(kernels, monkeypatch):
    """forward_segments over four sequences at once (different cache lengths, a prompt chunk, a
    one-token step, a chain and a tree) gives each the logits it gets alone: bit for bit with the
    kernels; without them (PyTorch's operators, float32 weights) up to rounding. That an equality of
    this kind can fail is shown by test_negative_control_pytorch_attention_is_not_batch_invariant."""
    monkeypatch.setenv("SPECDEC_KERNELS", kernels)
    net = load_model("smollm2-135m").net
    gen = torch.Generator().manual_seed(3)
    pasts, news = [0, 40, 7, 90], [23, 1, 5, 6]
    contexts = [torch.randint(0, net.vocab_size, (p + n,), generator=gen) for p, n in zip(pasts, news)]
    tree = TokenTree([11, 12, 13, 14, 15], [-1, -1, 0, 0, 2])
    caches = []
    for context, past in zip(contexts, pasts):
        cache = net.new_cache(past + 8 + 24)
        if past:
            net.forward(context[None, :past], cache)
        caches.append(cache)
    ids, positions, mask = tree_inputs(tree, int(contexts[3][pasts[3]]), pasts[3], "cpu")  # [1, 6], [1, 6], [6, 6]
    new_ids = [context[past:] for context, past in zip(contexts[:3], pasts[:3])] + [ids[0]]
    segments = [Segment(c, len(n)) for c, n in zip(caches[:3], new_ids[:3])] + [Segment(caches[3], 6, positions[0], mask)]
    together = net.forward_segments(torch.cat(new_ids), segments).split([len(n) for n in new_ids])
    for cache, past in zip(caches, pasts):
        cache.truncate(past)
    alone = [net.forward(n[None], c)[0] for n, c in zip(new_ids[:3], caches[:3])]
    alone.append(net.forward(ids, caches[3], positions=positions, tree_mask=mask)[0])
    if kernels == "on":
        assert all(torch.equal(a, b) for a, b in zip(alone, together))
    else:  # float32 in other orders by row count: round-off of |logits| through each layer's longest sum
        assert all(max_difference(a, b) <= round_off(b, *decoder_sums(net.config)) for a, b in zip(alone, together))
