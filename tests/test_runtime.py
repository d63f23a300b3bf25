"""The lean runtime against transformers, and the KV cache against recomputation.

Tolerance: float32 logits agree with transformers' up to float32 round-off (the two differ only in
the order of floating-point operations: fused projections, SDPA), stated from the arithmetic as
`tolerances.round_off`: relative to the logits' magnitude, through each layer's longest sum.
"""

from __future__ import annotations

import pytest
import torch

from conftest import FAMILIES, make_tiny_model
from specdec.runtime import load_model
from tolerances import decoder_sums, max_difference, round_off


def assert_round_off(got: torch.Tensor, want: torch.Tensor, net) -> None:
    """One float32 decoder in two orders of operations: within round-off of |logits| through its layers' sums."""
    assert max_difference(got, want) <= round_off(want, *decoder_sums(net.config))


@pytest.fixture(scope="module", params=FAMILIES)
def family_folder(request, tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp(request.param), request.param, seed=3)


def transformers_logits(folder, ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # [T, V]


def test_lean_logits_equal_transformers(family_folder):
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    lean = load_model(str(family_folder), kv_cache="float32")  # transformers' float32 cache
    assert lean.net.config.family in ("llama", "qwen2", "qwen3", "mistral", "phi3")
    ours = lean.net.forward(torch.tensor([ids]), lean.net.new_cache(64))[0]  # [T, V]
    ref = transformers_logits(family_folder, ids)
    assert_round_off(ours, ref, lean.net)


def test_incremental_decoding_equals_one_pass(family_folder):
    """Prefill + one token at a time through the cache gives the logits of one full pass. A float32
    cache: the float weights' linears (MKL) round a row differently by row count, and a float16 cache
    would turn some of those 1e-7 differences into a float16 rounding step (the float16 cache's
    exactness is tested on the batch-invariant kernels, test_kv_cache_dtype.py)."""
    model = load_model(str(family_folder), kv_cache="float32").net
    ids = list(range(2, 30))
    full = model.forward(torch.tensor([ids]), model.new_cache(64))[0]
    cache = model.new_cache(64)
    steps = [model.forward(torch.tensor([ids[:10]]), cache)[0]]
    for token in ids[10:]:
        steps.append(model.forward(torch.tensor([[token]]), cache)[0])
    assert_round_off(torch.cat(steps), full, model)


def test_transformers_adapter_matches_lean_and_rolls_back(tiny_folder):
    lean = load_model(str(tiny_folder), kv_cache="float32").net
    adapter = load_model(str(tiny_folder), runtime="transformers").net
    ids = [3, 9, 4, 17, 22, 5]
    a_cache, l_cache = adapter.new_cache(32), lean.new_cache(32)
    adapter.forward(torch.tensor([ids]), a_cache)
    adapter.forward(torch.tensor([[7, 8, 9]]), a_cache)  # drafts the target will "reject"
    a_cache.truncate(len(ids))
    got = adapter.forward(torch.tensor([[11, 12]]), a_cache)[0]
    want = lean.forward(torch.tensor([ids + [11, 12]]), l_cache)[0, -2:]
    assert_round_off(got, want, lean)


def test_truncate_then_continue_equals_recompute(tiny_folder):
    model = load_model(str(tiny_folder)).net
    prefix, rejected, accepted = [5, 6, 7, 8], [40, 41, 42], [9, 10]
    cache = model.new_cache(32)
    model.forward(torch.tensor([prefix]), cache)
    model.forward(torch.tensor([rejected]), cache)
    cache.truncate(len(prefix))
    got = model.forward(torch.tensor([accepted]), cache)[0]
    want = model.forward(torch.tensor([prefix + accepted]), model.new_cache(32))[0, -2:]
    assert cache.length == len(prefix + accepted)
    assert_round_off(got, want, model)


def test_tree_pass_and_compact_equal_recompute(tiny_folder):
    """Verify a small token tree in one pass (siblings share a position), keep one path with
    `compact`, continue decoding: logits equal a plain recompute of prefix + path."""
    model = load_model(str(tiny_folder)).net
    prefix = [5, 6, 7, 8]
    # tree: a=20 (depth 1), b=21 (depth 1, sibling of a), c=30 (child of b), d=31 (child of a)
    tree_tokens = [20, 21, 30, 31]
    parents = [-1, -1, 1, 0]
    depth = [1, 1, 2, 2]
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for i in range(4):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    cache = model.new_cache(32)
    model.forward(torch.tensor([prefix]), cache)
    positions = torch.tensor([[len(prefix) - 1 + d for d in depth]])
    tree_logits = model.forward(torch.tensor([tree_tokens]), cache, positions=positions, tree_mask=mask)[0]
    path = [1, 2]  # b then c
    path_tokens = [tree_tokens[i] for i in path]
    reference = model.forward(torch.tensor([prefix + path_tokens]), model.new_cache(32))[0]
    for node in path:  # each node's logits in the tree pass equal those of its own path
        index = len(prefix) - 1 + depth[node]
        assert_round_off(tree_logits[node], reference[index], model)
    keep = torch.tensor(list(range(len(prefix))) + [len(prefix) + i for i in path])
    cache.compact(keep)
    assert cache.length == len(prefix) + len(path)
    got = model.forward(torch.tensor([[44]]), cache)[0, -1]
    want = model.forward(torch.tensor([prefix + path_tokens + [44]]), model.new_cache(32))[0, -1]
    assert_round_off(got, want, model)


def test_cache_refuses_overflow_and_bad_compaction(tiny_folder):
    from specdec.errors import ConfigError

    model = load_model(str(tiny_folder)).net
    cache = model.new_cache(4)
    model.forward(torch.tensor([[1, 2, 3]]), cache)
    with pytest.raises(ConfigError, match="past the cache"):
        model.forward(torch.tensor([[4, 5]]), cache)
    with pytest.raises(ValueError, match="ascending"):
        cache.compact(torch.tensor([2, 1]))
    with pytest.raises(ValueError):
        cache.truncate(5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_equals_transformers_in_the_same_dtype(tiny_folder, dtype):
    """Lower precision is a user choice: logits come back as float32 and agree with transformers run
    in the same dtype within 1% of the logits' range (both round differently in places)."""
    from transformers import AutoModelForCausalLM

    ids = [[3, 4, 5, 6, 7]]
    low = load_model(str(tiny_folder), dtype=dtype).net
    ours = low.forward(torch.tensor(ids), low.new_cache(8))
    ref_model = AutoModelForCausalLM.from_pretrained(str(tiny_folder), dtype=getattr(torch, dtype)).eval()
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids)).logits.float()
    assert ours.dtype == torch.float32
    # each rounds every layer's outputs to 8 (bfloat16) or 11 (float16) bits: 1% of |logits| is ~1.3 or ~10 steps
    assert (ours - ref).abs().max().item() <= 0.01 * ref.abs().max().item()


def test_packed_linears_equal_plain_linears(tiny_folder):
    """The MKL-prepacked fast path (float32 CPU) against the plain nn.Linear reference."""
    from specdec.runtime.loading import load_lean
    from specdec.runtime.packed_linear import PackedLinear, packing_available
    import json

    if not packing_available(torch.device("cpu"), torch.float32):
        pytest.skip("this torch build has no MKL")
    hf_config = json.loads((tiny_folder / "config.json").read_text())
    plain = load_lean(tiny_folder, hf_config, "cpu", torch.float32, pack=False)
    packed = load_lean(tiny_folder, hf_config, "cpu", torch.float32, pack=True)
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 4 * 2 + 1  # qkv, o, gate_up, down ×2, head
    assert not any(isinstance(m, PackedLinear) for m in plain.modules())
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    for rows in (ids[:, :1], ids):  # one row (decode) and several (verification)
        a = plain.forward(rows, plain.new_cache(16))
        b = packed.forward(rows, packed.new_cache(16))
        assert_round_off(b, a, plain)
