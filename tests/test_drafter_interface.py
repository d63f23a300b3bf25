"""The drafter interface: what a drafter must implement, and the capabilities it gets by default.

A drafter written outside this package implements `begin` and `propose` and nothing else; the engine,
the policy and the cost model read its capabilities (tree size, features, tokens verified) from the
base class's defaults. `build_drafters` gives one type for every spec: a list.
"""

from __future__ import annotations

import pytest

from specdec.drafters import Draft, Drafter, PromptLookupDrafter, build_drafters
from specdec.drafters.ngram import lookup
from specdec.decode.engine import Engine, GenerationConfig


class RepeatLookup(Drafter):
    """A minimal user drafter: prompt lookup, written against the interface only."""

    name = "repeat-lookup"

    def begin(self, prompt_ids, max_len, target_cache=None):
        pass

    def propose(self, tokens, max_tokens, params, generator):
        proposal, n = lookup(tokens, max_tokens, max_ngram=3, min_ngram=1)
        return Draft(proposal, match_length=n)


def test_a_drafter_needs_only_begin_and_propose(tiny_target):
    drafter = RepeatLookup()
    assert (drafter.max_nodes, drafter.wants_features, drafter.verified_tokens(5)) == (0, False, 5)
    prompt = tiny_target.tokenizer.encode("t5 t9 t12 t7 t5 t9 t12 t7 t5 t9")
    for gamma in (3, "auto"):  # a fixed γ, and the policy (which prices the drafter through the defaults)
        config = GenerationConfig(max_new_tokens=30, gamma=gamma, ignore_eos=True)
        spec = Engine(tiny_target, drafter).generate(prompt, config)
        assert spec.token_ids == Engine(tiny_target).generate(prompt, config).token_ids
    with pytest.raises(NotImplementedError, match="does not read the target's features"):
        drafter.accept_features(None)


def test_a_drafter_without_propose_cannot_be_made():
    class Incomplete(Drafter):
        name = "incomplete"

        def begin(self, prompt_ids, max_len, target_cache=None):
            pass

    with pytest.raises(TypeError, match="propose"):
        Incomplete()


def test_build_drafters_gives_a_list_for_every_spec(tiny_target):
    assert build_drafters("none", tiny_target) == []
    [one] = build_drafters("ngram:3", tiny_target)
    assert isinstance(one, PromptLookupDrafter) and isinstance(one, Drafter)
    several = build_drafters("auto:ngram,suffix", tiny_target)
    assert [d.name for d in several] == ["ngram", "suffix"] and all(isinstance(d, Drafter) for d in several)


def test_a_model_drafter_counts_the_committed_tokens_it_has_not_read(tiny_target, draft_model):
    """What the cost model prices as a catch-up (`catch_up_tokens`): after a fresh start all it reads
    but the last (a draft model every prompt token before the last; an EAGLE head the pairs of a
    token's feature and the next token, one fewer); after a proposal none; after k more committed
    tokens (not its drafts) k − 1 (the last is read by every proposal). A lookup reads nothing of the
    past: 0 (the control)."""
    import torch

    from specdec.drafters import DraftModelDrafter, EagleDrafter
    from specdec.drafters.base import Features
    from specdec.runtime.llama import Segment
    from specdec.sampling import SamplingParams
    from random_heads import random_eagle_head

    net, greedy = tiny_target.net, SamplingParams()
    prompt = [3, 9, 4, 17, 5, 22, 8, 31, 6, 12]
    eagle = EagleDrafter(tiny_target, random_eagle_head(tiny_target))
    model = DraftModelDrafter(draft_model, tiny_target)
    cache = net.new_cache(40)
    out = net.forward_segments(torch.tensor(prompt[:-1]), [Segment(cache, len(prompt) - 1)], return_hidden=True)
    for drafter, fresh in ((eagle, len(prompt) - 2), (model, len(prompt) - 1)):
        drafter.begin(prompt, 40, cache)
        if drafter.wants_features:
            drafter.accept_features(Features(out[1], {}).for_drafter(drafter))
        assert drafter.catch_up_tokens(prompt) == fresh, drafter.name
        drafts = drafter.propose(prompt, 3, greedy, greedy.generator(net.device)).tokens
        assert drafter.catch_up_tokens(prompt) == 0
        more = [(drafts[0] + 1) % tiny_target.vocab_size, 7, 11, 2]  # not its drafts
        if drafter.wants_features:
            grown = net.forward_segments(torch.tensor(prompt[-1:] + more[:-1]), [Segment(cache, len(more))],
                                         return_hidden=True)
            drafter.accept_features(Features(grown[1], {}).for_drafter(drafter))
        assert drafter.catch_up_tokens(prompt + more) == len(more) - 1, drafter.name
    assert PromptLookupDrafter().catch_up_tokens(prompt) == 0


class FixedProposal(Drafter):
    """Proposes `tokens` (as many as asked for, or `extra` more) every round."""

    name = "fixed"

    def __init__(self, tokens: list[int], extra: int = 0) -> None:
        self.tokens, self.extra = tokens, extra

    def begin(self, prompt_ids, max_len, target_cache=None):
        pass

    def propose(self, tokens, max_tokens, params, generator):
        return Draft(self.tokens[:max_tokens + self.extra])


@pytest.mark.parametrize("proposal, extra, broken", [([1, 2, 3, 4], 0, None),
                                                     ([1, 2, 3, 4], 1, "4 tokens deep for a budget of 3"),
                                                     ([1, -1, 2], 0, "ids within the vocabulary: False"),
                                                     ([1, "vocab", 2], 0, "ids within the vocabulary: False")])
def test_a_drafter_that_breaks_its_contract_is_named(tiny_target, proposal, extra, broken):
    """A draft deeper than the budget, or with an id outside the vocabulary, stops the request with an
    error naming the drafter and what it broke (a valid draft of the same drafter decodes: the control)."""
    tokens = [tiny_target.vocab_size if t == "vocab" else t for t in proposal]
    prompt = tiny_target.tokenizer.encode("t5 t9 t12")
    config = GenerationConfig(max_new_tokens=8, gamma=3, ignore_eos=True)
    engine = Engine(tiny_target, FixedProposal(tokens, extra))
    if broken is None:
        assert len(engine.generate(prompt, config).token_ids) == 8
        return
    with pytest.raises(RuntimeError, match=f"drafter fixed broke its contract: .*{broken}"):
        engine.generate(prompt, config)
