"""The round-by-round trace agrees with the run it records, and recording it changes nothing."""

from __future__ import annotations

import pytest

from specdec.drafters import DraftModelDrafter, PromptLookupDrafter
from specdec.decode.engine import Engine, GenerationConfig
from specdec.runtime import load_model
from specdec.sampling import SamplingParams
from specdec.records.trace import ACCEPTED, BONUS, CORRECTED, DISCARDED, REJECTED, TARGET
from tolerances import EPS32, U32, normalisation_error

PROMPT = [5, 9, 12, 7, 5, 9, 12, 7, 5, 9]


@pytest.fixture(scope="module")
def draft_model(tiny_draft_folder):
    return load_model(str(tiny_draft_folder))


def traced(engine, config):
    """(the result, the kind of each committed piece as the engine tagged it)."""
    kinds = [piece.kind for event in engine.stream(PROMPT, config) for piece in event.pieces if piece.token_ids]
    return engine.generate(PROMPT, config), kinds


def check_agrees_with_run(result, piece_kinds, tokenizer):
    rounds = result.rounds
    stats = result.stats
    assert rounds[0].index == 0 and rounds[0].drafter is None and not rounds[0].positions
    assert len(rounds) == stats.rounds + 1  # the prefill and every round
    assert [t for r in rounds for t in r.committed] == result.token_ids
    assert [k for r in rounds for k in r.kinds()] == piece_kinds  # what the terminal colours by
    assert tokenizer.decode(result.token_ids) == result.text
    assert "".join(t for r in rounds for t in r.texts + [r.tail]) == result.text  # what explain shows
    assert sum(r.accepted for r in rounds) == stats.accepted
    assert sum(len(r.positions) for r in rounds) == stats.drafted
    for r in rounds:
        verdicts = [pos.verdict for pos in r.positions]
        assert verdicts == [ACCEPTED] * r.accepted + ([REJECTED] if r.accepted < len(verdicts) else []) + \
            [DISCARDED] * max(0, len(verdicts) - r.accepted - 1)
        assert r.next_kind == (TARGET if not r.positions else BONUS if r.accepted == len(r.positions) else CORRECTED)
        assert r.committed == ([p.token for p in r.positions[:r.accepted]] + [r.next_token])[:len(r.committed)]


def test_greedy_trace_agrees_with_the_run(tiny_target):
    engine = Engine(tiny_target, PromptLookupDrafter(max_ngram=3, min_ngram=1))
    result, kinds = traced(engine, GenerationConfig(max_new_tokens=40, gamma=4, trace=True, ignore_eos=True))
    check_agrees_with_run(result, kinds, tiny_target.tokenizer)
    assert result.stats.drafted > 0
    for r in result.rounds:
        for pos in r.positions:  # greedy: accepted exactly when the draft is the target's argmax
            is_argmax = pos.target_top[0].id == pos.token
            assert (pos.verdict == ACCEPTED) == is_argmax or pos.verdict == DISCARDED
            assert pos.uniform is None and pos.accept_probability == (1.0 if is_argmax else 0.0)
        assert r.next_token == r.next_top[0].id  # the target's own token is its argmax
    plain = engine.generate(PROMPT, GenerationConfig(max_new_tokens=40, gamma=4, ignore_eos=True))
    assert plain.token_ids == result.token_ids and plain.rounds == []  # off: nothing recorded


def test_sampled_trace_records_the_draws_that_decided(tiny_target, draft_model):
    engine = Engine(tiny_target, DraftModelDrafter(draft_model, tiny_target))
    config = GenerationConfig(max_new_tokens=60, gamma=3, sampling=SamplingParams(temperature=1.0, seed=3), trace=True,
                              ignore_eos=True)
    result, kinds = traced(engine, config)
    check_agrees_with_run(result, kinds, tiny_target.tokenizer)
    rejected = 0
    for r in result.rounds:
        for pos in r.positions:
            assert pos.q is not None and 0 < pos.q <= 1 and pos.draft_top
            # the ratio the rule used: at most one float32 rounding from the one of the recorded p and q
            assert pos.accept_probability == pytest.approx(min(1.0, pos.p / pos.q), rel=EPS32, abs=0)
            if pos.verdict == ACCEPTED:
                assert pos.uniform * pos.q < pos.p
            elif pos.verdict == REJECTED:
                assert pos.uniform * pos.q >= pos.p
                rejected += 1
        if r.next_kind == CORRECTED:
            assert r.next_from == "residual"
            rejected_token = r.positions[r.accepted].token
            # the residual max(0, p − q) is 0 at the rejected token (rejected means p < u·q ≤ q)
            assert all(entry.id != rejected_token or entry.prob == 0 for entry in r.next_top)
            assert r.next_top and r.next_top[0].prob > 0 and r.next_top[0].id != rejected_token
    assert rejected > 0 and result.stats.accepted > 0
    untraced = engine.generate(PROMPT, GenerationConfig(max_new_tokens=60, gamma=3,
                                                        sampling=SamplingParams(temperature=1.0, seed=3), ignore_eos=True))
    assert untraced.token_ids == result.token_ids  # recording consumes no random draws


def test_point_mass_drafts_are_traced_with_q_none(tiny_target):
    engine = Engine(tiny_target, PromptLookupDrafter(max_ngram=3, min_ngram=1))
    config = GenerationConfig(max_new_tokens=40, gamma=4, sampling=SamplingParams(temperature=0.8, seed=1), trace=True,
                              ignore_eos=True)
    result, kinds = traced(engine, config)
    check_agrees_with_run(result, kinds, tiny_target.tokenizer)
    positions = [pos for r in result.rounds for pos in r.positions]
    assert positions and all(pos.q is None and not pos.draft_top and pos.accept_probability == pos.p for pos in positions)


def test_tree_candidates_record_the_acceptance_probability_after_rejected_siblings(tiny_target):
    """Sampling a token tree, the rule tests a node's children in order, each against r: p with the
    siblings rejected before it removed, renormalised. So a later child is accepted with probability
    r(x) = p(x) / (1 − Σ p(rejected siblings)), not p(x), and that is what the trace records."""
    from random_heads import random_eagle_head

    from specdec.drafters import EagleDrafter

    engine = Engine(tiny_target, EagleDrafter(tiny_target, random_eagle_head(tiny_target), name="eagle-tree",
                                              tree_budget=10, top_k=3))
    config = GenerationConfig(max_new_tokens=60, gamma=3, sampling=SamplingParams(temperature=1.0, seed=5), trace=True,
                              ignore_eos=True)
    result = engine.generate(PROMPT, config)
    tree_rounds = [r for r in result.rounds if r.tree]  # the others: too close to the token budget to draft
    assert len(tree_rounds) > 10
    tested_after_rejections = 0
    for r in tree_rounds:
        tree = r.tree
        assert [pos.node for pos in r.positions if pos.verdict == ACCEPTED] == tree.path
        assert r.committed == ([tree.tokens[node] for node in tree.path] + [r.next_token])[:len(r.committed)]
        tested_before: dict[int, list] = {}  # parent node → its children tested so far, in order
        for pos in r.positions:
            siblings = tested_before.setdefault(tree.parents[pos.node], [])
            assert all(s.verdict == REJECTED for s in siblings) and pos.q is None
            rejected_mass = sum(s.p for s in siblings)
            # r = p / (1 − rejected mass) in float32: the mass left, a sum over V (as is Σp = 1 itself), taken relative to it
            left = (2 * normalisation_error(tiny_target.vocab_size) + U32) / (1 - rejected_mass)
            assert pos.accept_probability == pytest.approx(pos.p / (1 - rejected_mass), rel=left, abs=0)
            assert (pos.uniform < pos.accept_probability) == (pos.verdict == ACCEPTED)
            if rejected_mass > 1e-3 and pos.p > 1e-3:
                tested_after_rejections += 1
                assert pos.accept_probability != pytest.approx(pos.p, rel=1e-3)
                residual_top_mass = sum(entry.prob for entry in pos.residual_top)  # part of a float32 distribution over V
                assert pos.residual_top and residual_top_mass <= 1 + normalisation_error(tiny_target.vocab_size)
                assert all(entry.prob == 0 for entry in pos.residual_top if entry.id in {s.token for s in siblings})
            siblings.append(pos)
        if r.next_kind == CORRECTED:  # every child of the last accepted node was rejected: drawn from what is left
            assert r.next_from == "residual"
            rejected = {pos.token for pos in r.positions if pos.depth == r.accepted + 1}
            assert r.next_top and all(entry.id not in rejected for entry in r.next_top)
    assert tested_after_rejections > 0
    untraced = engine.generate(PROMPT, GenerationConfig(max_new_tokens=60, gamma=3,
                                                        sampling=SamplingParams(temperature=1.0, seed=5), ignore_eos=True))
    assert untraced.token_ids == result.token_ids  # recording consumes no random draws
