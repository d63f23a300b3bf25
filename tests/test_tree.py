"""Token trees: structure, the tree pass against recomputation, and lossless tree verification.

One-round law: a fixed tree over a vocabulary of 6 (the root has 3 children, one of which has 2
children, one of those 1 more), random target distributions at each input (temperature-processed,
with and without top-k), 200,000 rounds sampled at once; each round's output (accepted path, then
the next token) is compared with the exact law — the product of the target's probabilities along
the output, enumerated — by a chi-square test at ALPHA = 1e-3 (false-positive rate 0.1% per test).
Negative controls: a rule that does not remove a rejected child from the residual (20,000 rounds:
it is a Python loop), and one that accepts the first child always, must fail the same test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.runtime import load_model
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.tree import TokenTree, from_paths, kept_slots, tree_inputs
from specdec.decode.verify import tree_sample, verify_tree_greedy
from reference_verify import tree_sample_reference
from stat_helpers import ALPHA, gof_pvalue
from tolerances import decoder_sums, law_normalisation_error, max_difference, round_off

VOCAB, SAMPLES = 6, 200_000
# root → tokens 2, 4, 0; node 0 (token 2) → tokens 1, 3; node 3 (token 1) → token 5
TREE = TokenTree([2, 4, 0, 1, 3, 5], [-1, -1, -1, 0, 0, 3])


def test_structure():
    assert TREE.depths() == [1, 1, 1, 2, 2, 3]
    assert TREE.children(-1) == [0, 1, 2] and TREE.children(0) == [3, 4] and TREE.path_to(5) == [0, 3, 5]
    mask = TREE.ancestor_mask()
    assert mask[6].tolist() == [True, True, False, False, True, False, True]  # node 5 sees root, 0, 3, itself
    assert mask[2].tolist() == [True, False, True, False, False, False, False]
    assert TokenTree.chain([7, 8, 9]).ancestor_mask().equal(torch.ones(4, 4, dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="earlier node"):
        TokenTree([1, 2], [1, -1])
    tree, paths = from_paths([[0], [1], [0, 0], [0, 1], [0, 0, 0], [2, 0]], [[11, 12, 13], [21, 22], [31]])
    assert tree.tokens == [11, 12, 13, 21, 22, 21, 31] and tree.parents == [-1, -1, -1, 0, 0, 2, 3]
    assert paths[-1] == [0, 0, 0]


def test_tree_pass_equals_each_path_recomputed(tiny_folder):
    """Every node's logits from one tree pass equal those of its path run as a sequence; after
    keeping one path, the cache continues exactly like a chain."""
    model = load_model(str(tiny_folder))
    net = model.net
    prefix = [5, 9, 12, 7, 30]
    cache = net.new_cache(64)
    net.forward(torch.tensor([prefix[:-1]]), cache)
    ids, positions, mask = tree_inputs(TREE, prefix[-1], cache.length, "cpu")
    logits = net.forward(ids, cache, positions=positions, tree_mask=mask)[0]  # [N+1, V]
    for node in range(len(TREE)):
        path_tokens = [TREE.tokens[i] for i in TREE.path_to(node)]
        alone = net.forward(torch.tensor([prefix + path_tokens]), net.new_cache(64))[0, -1]
        # one float32 model in two orders of operations: round-off of |logits| through each layer's longest sum
        assert max_difference(logits[node + 1], alone) <= round_off(alone, *decoder_sums(net.config))
    past = len(prefix) - 1
    cache.compact(kept_slots(past, TREE.path_to(5)))
    follow = net.forward(torch.tensor([[8]]), cache)[0, -1]
    chain = prefix + [2, 1, 5, 8]
    again = net.forward(torch.tensor([chain]), net.new_cache(64))[0, -1]
    assert max_difference(follow, again) <= round_off(again, *decoder_sums(net.config))


def test_greedy_walks_the_matching_path():
    logits = torch.full((7, VOCAB), -5.0)
    for j, token in enumerate([2, 1, 9 % VOCAB, 0, 5, 0, 3]):  # argmax at each input
        logits[j, token] = 5.0
    assert verify_tree_greedy(TREE, logits) == ([0, 3, 5], 3)  # 2 → 1 → 5, then the target's 3
    logits[0] = -5.0
    logits[0, 3] = 5.0  # 3 is not a child of the root
    assert verify_tree_greedy(TREE, logits) == ([], 3)


def exact_round_law(p: torch.Tensor) -> dict[tuple[int, ...], float]:
    """P(round output = s) for every s: walk the tree while the token is a child, else stop."""
    law: dict[tuple[int, ...], float] = {}

    def walk(at: int, prefix: tuple[int, ...], prob: float) -> None:
        node = at - 1
        children = {TREE.tokens[c]: c + 1 for c in TREE.children(node)}
        for token in range(VOCAB):
            mass = prob * float(p[at, token])
            if mass == 0:
                continue
            if token in children:
                walk(children[token], prefix + (token,), mass)
            else:
                law[prefix + (token,)] = law.get(prefix + (token,), 0.0) + mass

    walk(0, (), 1.0)
    return law


def round_outputs(accepted: torch.Tensor, next_token: torch.Tensor) -> list[tuple[int, ...]]:
    out = []
    for path, nxt in zip(accepted.tolist(), next_token.tolist()):
        out.append(tuple(TREE.tokens[n] for n in path if n >= 0) + (nxt,))
    return out


def tree_pvalue(sampler, params: SamplingParams, seed: int = 0, samples: int = SAMPLES) -> float:
    logits = torch.randn(len(TREE) + 1, VOCAB, generator=torch.Generator().manual_seed(seed)) * 1.5
    p = logits_to_probs(logits, params)  # [N+1, V]
    law = exact_round_law(p)
    accepted, next_token = sampler(TREE, p[None].expand(samples, -1, -1), torch.Generator().manual_seed(seed + 1))
    counts: dict[tuple[int, ...], int] = {}
    for output in round_outputs(accepted, next_token):
        counts[output] = counts.get(output, 0) + 1
    keys = list(law)
    observed = np.array([counts.get(k, 0) for k in keys] + [sum(c for k, c in counts.items() if k not in law)])
    return gof_pvalue(observed, np.array([law[k] for k in keys] + [0.0]), normalised_within=law_normalisation_error(law))


PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4), SamplingParams(temperature=1.3, top_p=0.9)]


@pytest.mark.parametrize("params", PARAMS, ids=["T1", "T0.7-topk4", "T1.3-topp0.9"])
def test_one_round_tree_law_is_exact(params):
    assert tree_pvalue(tree_sample, params) > ALPHA


def keep_rejected_children(tree, p, generator):
    """WRONG: tests the children in order but leaves a rejected child in the residual."""
    batch = p.shape[0]
    accepted = torch.full((batch, 3), -1, dtype=torch.long)
    next_token = torch.empty(batch, dtype=torch.long)
    u = torch.rand(batch, 3, 3, generator=generator)
    for b in range(batch):
        at, depth = 0, 0
        while True:
            kids = tree.children(at - 1)
            chosen = next((c for j, c in enumerate(kids) if u[b, depth, j] < p[b, at, tree.tokens[c]]), None)
            if chosen is None:
                next_token[b] = torch.multinomial(p[b, at], 1, generator=generator)
                break
            accepted[b, depth] = chosen
            at, depth = chosen + 1, depth + 1
    return accepted, next_token


def first_child_always(tree, p, generator):
    """WRONG: accepts the root's first child every time, then samples from p there."""
    batch = p.shape[0]
    accepted = torch.full((batch, 3), -1, dtype=torch.long)
    accepted[:, 0] = 0
    return accepted, torch.multinomial(p[:, 1], 1, generator=generator).squeeze(1)


@pytest.mark.parametrize("wrong", [first_child_always, keep_rejected_children])
def test_tree_negative_controls_fail(wrong):
    samples = 20_000 if wrong is keep_rejected_children else SAMPLES  # a Python loop: fewer rounds suffice
    assert tree_pvalue(wrong, PARAMS[0], samples=samples) < ALPHA


def test_fast_path_equals_reference():
    p = torch.softmax(torch.randn(500, len(TREE) + 1, VOCAB, generator=torch.Generator().manual_seed(3)), -1)
    fast = tree_sample(TREE, p, torch.Generator().manual_seed(9))
    slow = tree_sample_reference(TREE, p, torch.Generator().manual_seed(9))
    assert fast[0].equal(slow[0]) and fast[1].equal(slow[1])
