"""The engine on tiny random models: greedy equality, stop conditions, seeds, whole-run distributions.

Whole-generation distribution test: the target samples with temperature 1 and top-k = 3, so the
first 4 new tokens have 3^4 = 81 possible values, whose exact probabilities come from the target by
enumeration (40 forward passes). 3,000 seeded generations of 4 tokens are run with plain sampling,
with each drafter kind `--drafter` takes (`whole_runs.SPECULATIVE_KINDS`, from `specdec.drafters.spec`:
prompt lookup, the draft model, early exit, suffix drafting, EAGLE and EAGLE-3 heads as chains and
as trees, Medusa heads as a static tree; γ = 3), and with the adaptive policy
choosing among all of them and γ each round ("auto"), and each histogram is compared with the
exact law by a chi-square test at ALPHA = 1e-3 (false-positive rate 0.1% per test). At 3,000 runs,
68 of the 81 cells expect at least 5 counts and the other 13 (1.3% of the mass) are pooled: 69 cells,
68 degrees of freedom, critical chi-square 109.8. The negative control runs the same speculative
engines with a verifier that accepts every draft and must fail (p < 1e-3); tree rounds get a
verifier that walks down the first children to a leaf. A second, subtler negative control keeps the
right acceptance test but resamples a rejected position from p instead of norm(max(0, p − q)); it
must fail too, for the drafters whose drafts overlap the target's top-3 (see its test). The same
test with top-p 0.8 instead of top-k (3 tokens: 2,350 sequences, 111 cells after pooling, 110 dof)
runs with the draft model and an EAGLE tree, with its negative control (measured on seeds 0..2999:
p = 0.24 and 0.19; the controls give p = 0, an accepted draft outside the target's nucleus).
"""

from __future__ import annotations

import pytest
import torch

from specdec.decode import verify as verify_module
from specdec.control.cost_model import CostModel, DraftCost
from specdec.control.policy import AdaptivePolicy
from specdec.drafters import DraftModelDrafter, EarlyExitDrafter, PromptLookupDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.decode.text import TextAssembler
from specdec.decode.engine import Engine, GenerationConfig
from specdec.records.trace import ACCEPTED
from specdec.errors import SpecdecError
from specdec.runtime import load_model
from specdec.runtime.tokenizer import IncrementalDetokenizer
from specdec.sampling import SamplingParams
from stat_helpers import ALPHA, accept_everything, patch_chain_rule, residual_from_p, tree_accept_first_children
from whole_runs import (PROMPT, RUNS, SPECULATIVE_KINDS, TOP_K_LAW, TOP_P_LAW, LawSetting, auto_engine, drafters,
                        law_pvalue, lookup, synthetic_costs)


@pytest.mark.parametrize("gamma", [1, 3, 6])
@pytest.mark.parametrize("kind", SPECULATIVE_KINDS)
def test_greedy_speculative_equals_plain(tiny_target, draft_model, kind, gamma):
    config = GenerationConfig(max_new_tokens=60, gamma=gamma, ignore_eos=True)
    plain = Engine(tiny_target).generate(PROMPT, config)
    spec = Engine(tiny_target, drafters(tiny_target, draft_model)[kind]).generate(PROMPT, config)
    assert spec.token_ids == plain.token_ids
    assert spec.text == plain.text
    assert len(spec.token_ids) == 60
    # the run exercised both outcomes: some drafts accepted, some rejected
    assert 0 < spec.stats.accepted < spec.stats.drafted
    assert spec.stats.target_passes < plain.stats.target_passes == 60


@pytest.mark.parametrize("kind", SPECULATIVE_KINDS)
def test_greedy_adaptive_gamma_equals_plain(tiny_target, draft_model, kind):
    config = GenerationConfig(max_new_tokens=60, ignore_eos=True)  # γ = auto
    drafter = drafters(tiny_target, draft_model)[kind]
    spec = Engine(tiny_target, drafter, cost_model=synthetic_costs([drafter], 0.02)).generate(PROMPT, config)
    assert spec.token_ids == Engine(tiny_target).generate(PROMPT, config).token_ids
    assert spec.stats.drafted > 0 and spec.stats.decisions


@pytest.mark.parametrize("draft_cost", [0.02, 1.0])
def test_greedy_adaptive_drafter_choice_equals_plain(tiny_target, draft_model, draft_cost):
    """Cheap drafts: the policy switches drafters and γ; dear ones (a whole pass a token, so that
    even drafts that are always accepted cannot pay): the free lookups are used, the model drafters
    only probed. Either way the output is plain decoding's. (At 0.6 of a pass a token a model drafter
    that the tiny target agrees with 9 times in 10 would pay, and the policy rightly takes it.)"""
    config = GenerationConfig(max_new_tokens=120, ignore_eos=True)
    spec = auto_engine(tiny_target, draft_model, draft_cost).generate(PROMPT, config)
    assert spec.token_ids == Engine(tiny_target).generate(PROMPT, config).token_ids
    used = spec.stats.by_drafter
    if draft_cost < 0.5:
        assert len([name for name in used if name != "plain"]) >= 2, used
        assert len({g for name, tally in used.items() if name != "plain" for g in tally.gammas}) >= 2, used
    else:  # the dear model drafters never win against the free lookups: they are only probed now and then
        models = [d for d in spec.stats.decisions if d["drafter"].split(":")[0] not in {"ngram", "suffix+corpus", "plain"}]
        assert all(d["reason"].startswith("probe") for d in models), models
        assert len(models) < len(spec.stats.decisions) / 2, spec.stats.decisions


def test_greedy_suffix_choosing_between_its_two_texts_equals_plain(tiny_target, monkeypatch):
    """A suffix drafter whose corpus holds plain decoding's answer with every fifth token changed
    matches in both texts (its corpus's long matches go wrong at the changed tokens): the policy
    verifies the alternative of some proposals, and the output is still plain decoding's."""
    config = GenerationConfig(max_new_tokens=80, ignore_eos=True)
    plain = Engine(tiny_target).generate(PROMPT, config).token_ids
    corpus = [[t if i % 5 else (t + 1) % 64 for i, t in enumerate(PROMPT + plain)]]
    chosen = {"proposal": 0, "alternative": 0}
    offer = AdaptivePolicy.offer

    def counting_offer(self, index, draft, rows=1, passes=None):
        weighed = offer(self, index, draft, rows, passes)
        if weighed:
            chosen["alternative" if weighed[1] is draft.alternative else "proposal"] += 1
        return weighed

    monkeypatch.setattr(AdaptivePolicy, "offer", counting_offer)
    drafter = SuffixDrafter(corpus, min_match=1)
    spec = Engine(tiny_target, drafter, cost_model=synthetic_costs([drafter], 0.0)).generate(PROMPT, config)
    assert spec.token_ids == plain
    assert chosen["alternative"] > 0 and chosen["proposal"] > 0, chosen
    assert 0 < spec.stats.accepted < spec.stats.drafted


def test_greedy_equality_through_the_transformers_adapter(tiny_folder, draft_model):
    target = load_model(str(tiny_folder), runtime="transformers")
    config = GenerationConfig(max_new_tokens=40, gamma=4, ignore_eos=True)
    plain = Engine(target).generate(PROMPT, config)
    spec = Engine(target, DraftModelDrafter(draft_model, target)).generate(PROMPT, config)
    lean_plain = Engine(load_model(str(tiny_folder))).generate(PROMPT, config)
    assert spec.token_ids == plain.token_ids == lean_plain.token_ids


def test_end_of_sequence_inside_an_accepted_draft_stops_like_plain(tiny_target, draft_model):
    """Make a token of the plain output the end-of-sequence token; the speculative run must stop at the
    same place even when that token arrives in the middle of a round's accepted drafts."""
    free = Engine(tiny_target).generate(PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True))
    saved = tiny_target.eos_token_ids
    found = False
    try:
        for eos in dict.fromkeys(free.token_ids[3:]):
            tiny_target.eos_token_ids = [eos]
            config = GenerationConfig(max_new_tokens=40, gamma=5)
            plain = Engine(tiny_target).generate(PROMPT, config)
            spec_engine = Engine(tiny_target, DraftModelDrafter(draft_model, tiny_target))
            events = list(spec_engine.stream(PROMPT, config))
            spec_ids = [t for e in events for p in e.pieces for t in p.token_ids]
            assert spec_ids == plain.token_ids and spec_ids[-1] == eos
            assert events[-1].stats.finish_reason == "stop"
            eos_kind = next(p.kind for p in events[-1].pieces if p.token_ids == [eos])
            if eos_kind == ACCEPTED:  # an accepted draft: its round had at least one more token, dropped
                found = True
                break
    finally:
        tiny_target.eos_token_ids = saved
    assert found, "no end-of-sequence token arrived inside an accepted draft"


def test_max_new_tokens_and_stop_strings(tiny_target):
    config = GenerationConfig(max_new_tokens=25, gamma=3, ignore_eos=True)
    full = Engine(tiny_target, lookup()).generate(PROMPT, config)
    assert len(full.token_ids) == 25 and full.stats.finish_reason == "length"
    words = full.text.split()
    stop = " " + words[10]  # stop at the (first occurrence of the) 11th word
    cut = full.text.index(stop)
    for drafter in (None, lookup()):
        run = Engine(tiny_target, drafter).generate(PROMPT, GenerationConfig(max_new_tokens=25, gamma=3, stop=(stop,), ignore_eos=True))
        assert run.text == full.text[:cut]
        assert run.stats.finish_reason == "stop"


def test_text_assembler_holds_back_a_possible_stop_string():
    class Letters:  # a tokenizer whose ids are letters
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(ord("a") + i) for i in ids)

    assembler = TextAssembler(IncrementalDetokenizer(Letters()), stop=("cde",))
    pieces = [assembler.push(i) for i in [0, 1, 2, 3]]  # a b c d: "cd" may start the stop string
    assert pieces == ["a", "b", "", ""]
    assert assembler.push(5) == "cdf"  # not the stop string after all: released
    assert assembler.push(2) == "" and assembler.push(3) == "" and assembler.push(4) == ""
    assert assembler.stopped and assembler.text == "abcdf"


def test_rounds_reach_the_cost_models_calibration(tiny_target):
    """Every round's pass time reaches the cost model's calibration (plain steps as k = 1), not its
    table; a frozen model ignores them."""
    pool = [PromptLookupDrafter()]
    costs = CostModel({k: 1e-3 * (1 + 0.2 * (k - 1)) for k in range(1, 10)}, {"ngram": DraftCost(0.0, 0.0)})
    result = Engine(tiny_target, pool, cost_model=costs).generate(PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True))
    assert costs.calibration.observations == result.stats.rounds
    assert set(costs.calibration.sums) <= set(range(1, 10))  # passes over 1 (plain) to 9 tokens
    assert costs.target_pass(3) == 1.4e-3  # the table the policy prices by stays as measured
    frozen = synthetic_costs(pool, 0.0)
    Engine(tiny_target, pool, cost_model=frozen).generate(PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True))
    assert frozen.calibration.observations == 0


def test_proposals_reach_the_draft_cost_calibration(tiny_target, draft_model):
    """Every proposal's time reaches the drafter's draft-cost calibration at its γ, except each
    drafter's first in a request (it also catches up on the prompt); a frozen model ignores them."""
    drafter = DraftModelDrafter(draft_model, tiny_target)
    costs = CostModel({k: 1e-3 for k in range(1, 10)}, {drafter.name: DraftCost(1e-4, 1e-4)})
    config = GenerationConfig(max_new_tokens=40, gamma=3, ignore_eos=True)
    result = Engine(tiny_target, [drafter], cost_model=costs).generate(PROMPT, config)
    proposals = result.stats.by_drafter[drafter.name].drafting_rounds
    calibration = costs.draft_calibration[drafter.name]
    assert proposals > 5 and calibration.observations == proposals - 1
    assert 3 in calibration.sums and set(calibration.sums) <= {1, 2, 3}  # the last rounds may ask fewer
    assert costs.draft_seconds(drafter.name, 3) == costs.draft_costs[drafter.name].seconds(3)  # the table: as measured
    frozen = CostModel({k: 1e-3 for k in range(1, 10)}, {drafter.name: DraftCost(1e-4, 1e-4)}, calibrate=False)
    Engine(tiny_target, [drafter], cost_model=frozen).generate(PROMPT, config)
    assert frozen.draft_calibration == {} and frozen.draft_seconds(drafter.name, 3) == pytest.approx(4e-4)


def test_a_fixed_seed_repeats_a_sampled_run(tiny_target, draft_model):
    config = GenerationConfig(max_new_tokens=30, gamma=3, ignore_eos=True,
                              sampling=SamplingParams(temperature=1.0, top_p=0.9, seed=1234))
    make = lambda: Engine(tiny_target, DraftModelDrafter(draft_model, tiny_target))  # noqa: E731
    first, second = make().generate(PROMPT, config), make().generate(PROMPT, config)
    assert first.token_ids == second.token_ids
    other = make().generate(PROMPT, GenerationConfig(max_new_tokens=30, gamma=3, ignore_eos=True,
                                                     sampling=SamplingParams(temperature=1.0, top_p=0.9, seed=99)))
    assert other.token_ids != first.token_ids


def test_early_exit_leaves_the_target_cache_as_it_found_it(tiny_target):
    from specdec.sampling import SamplingParams

    cache = tiny_target.net.new_cache(64)
    tiny_target.net.forward(torch.tensor([PROMPT[:-1]]), cache)
    drafter = EarlyExitDrafter(tiny_target, exit_layer=1)
    drafter.begin(PROMPT, 64, cache)
    draft = drafter.propose(PROMPT, 5, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert len(draft) == 5 and draft.q.shape == (5, 64)
    assert cache.length == len(PROMPT) - 1


def test_bad_prompts_are_refused(tiny_folder):
    model = load_model(str(tiny_folder))
    with pytest.raises(SpecdecError, match="empty"):
        Engine(model).generate([])
    with pytest.raises(SpecdecError, match="empty"):
        Engine(model).encode("   ")
    with pytest.raises(SpecdecError, match=r"\[0, 64\)"):
        Engine(model).generate([3, 64])
    with pytest.raises(SpecdecError, match="context"):
        Engine(model).generate([3] * 256)


# --- whole generations against the exact law -------------------------------------------------

def sampled_pvalue(engine: Engine, law: dict, gamma: int | str = 3, choices: set | None = None,
                   setting: LawSetting = TOP_K_LAW) -> float:
    """p-value of RUNS seeded generations with `setting` against its `law`; `choices` collects each
    run's policy decisions."""
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(RUNS):
        config = GenerationConfig(max_new_tokens=setting.new_tokens, gamma=gamma, ignore_eos=True,
                                  sampling=setting.seeded(seed))
        result = engine.generate(PROMPT, config)
        key = tuple(result.token_ids)
        counts[key] = counts.get(key, 0) + 1
        if choices is not None:
            choices.add(tuple((d["drafter"], d["gamma"]) for d in result.stats.decisions))
    return law_pvalue(counts, law)


def confident_chain(tiny_target, draft_model) -> Engine:
    """An EAGLE-3 chain alone with γ = auto: asked for up to 8 tokens, it drafts while its
    confidence says one more could pay (`AdaptivePolicy.keep_drafting`)."""
    chain = drafters(tiny_target, draft_model)["eagle3-chain"]
    assert chain.stops_early
    return Engine(tiny_target, chain, cost_model=synthetic_costs([chain], 0.02))


@pytest.mark.slow
def test_a_chain_that_stops_by_its_confidence_follows_the_target_distribution(tiny_target, draft_model,
                                                                              first_tokens_law):
    # (the stopping rule's own law test, on longer chains with a biased rule as control: test_verify.py)
    assert sampled_pvalue(confident_chain(tiny_target, draft_model), first_tokens_law, "auto") > ALPHA


@pytest.mark.slow
def test_a_chain_that_stops_by_its_confidence_negative_control(tiny_target, draft_model, first_tokens_law,
                                                               monkeypatch):
    patch_chain_rule(monkeypatch, verify_module, accept_everything)
    assert sampled_pvalue(confident_chain(tiny_target, draft_model), first_tokens_law, "auto") < ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["none", *SPECULATIVE_KINDS])
def test_whole_generations_follow_the_target_distribution(tiny_target, draft_model, first_tokens_law, kind):
    drafter = None if kind == "none" else drafters(tiny_target, draft_model)[kind]
    assert sampled_pvalue(Engine(tiny_target, drafter), first_tokens_law) > ALPHA


@pytest.mark.slow
def test_whole_generations_with_the_adaptive_policy_follow_the_target_distribution(tiny_target, draft_model,
                                                                                   first_tokens_law):
    choices: set = set()
    assert sampled_pvalue(auto_engine(tiny_target, draft_model), first_tokens_law, "auto", choices) > ALPHA
    assert len(choices) > 1  # the choices depended on earlier rounds' random outcomes


@pytest.mark.slow
def test_whole_generations_with_the_adaptive_policy_negative_control(tiny_target, draft_model, first_tokens_law,
                                                                      monkeypatch):
    patch_chain_rule(monkeypatch, verify_module, accept_everything)
    monkeypatch.setattr(verify_module, "tree_sample", tree_accept_first_children)
    assert sampled_pvalue(auto_engine(tiny_target, draft_model), first_tokens_law, "auto") < ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("kind", SPECULATIVE_KINDS)
def test_whole_generations_negative_control(tiny_target, draft_model, first_tokens_law, kind, monkeypatch):
    patch_chain_rule(monkeypatch, verify_module, accept_everything)
    monkeypatch.setattr(verify_module, "tree_sample", tree_accept_first_children)
    drafter = drafters(tiny_target, draft_model)[kind]
    assert sampled_pvalue(Engine(tiny_target, drafter), first_tokens_law) < ALPHA


TOP_P_KINDS = ["draft", "eagle-tree"]  # a chain with a full q, and a dynamic tree


@pytest.mark.slow
@pytest.mark.parametrize("kind", TOP_P_KINDS)
def test_whole_generations_with_top_p_follow_the_target_distribution(tiny_target, draft_model, top_p_law, kind):
    """Top-p 0.8 at T = 1 (`TOP_P_LAW`: 3 tokens, 111 cells, 110 dof, fail when p < ALPHA = 1e-3): the
    nucleus cuts p and q alike, and a draft outside the target's nucleus must be rejected."""
    drafter = drafters(tiny_target, draft_model)[kind]
    assert sampled_pvalue(Engine(tiny_target, drafter), top_p_law, setting=TOP_P_LAW) > ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("kind", TOP_P_KINDS)
def test_whole_generations_with_top_p_negative_control(tiny_target, draft_model, top_p_law, kind, monkeypatch):
    patch_chain_rule(monkeypatch, verify_module, accept_everything)
    monkeypatch.setattr(verify_module, "tree_sample", tree_accept_first_children)
    drafter = drafters(tiny_target, draft_model)[kind]
    assert sampled_pvalue(Engine(tiny_target, drafter), top_p_law, setting=TOP_P_LAW) < ALPHA


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["draft", "early", "suffix"])
def test_whole_generations_negative_control_resampling_from_p(tiny_target, draft_model, first_tokens_law, kind,
                                                              monkeypatch):
    """The subtler wrong verifier (`residual_from_p`: the right acceptance test, but a rejection
    resamples from p, not from norm(max(0, p − q))) must fail the same whole-run test: 3,000 runs
    over 81 cells (69 after pooling, 68 dof), fail when p < ALPHA = 1e-3.

    Drafters: the draft model and early exit (full q; the wrong rule over-produces the tokens the
    draft favours) and suffix drafting (point mass; a rejected draft can be drawn again). Measured
    when this test was written (seeds 0..2999, as here): p = 1.6e-41 (draft), 2.2e-45 (early),
    2.7e-161 (suffix); over 10 disjoint blocks of 3,000 seeds the largest p-values were 1.8e-31,
    1.9e-31 and 5e-155, i.e. estimated noncentralities of about 276, 279 and 975 against a critical
    value of 109.8: a miss has probability below 1e-17 per test. The right verifier passes on the
    same seeds (`test_whole_generations_follow_the_target_distribution`; false-positive rate 0.1%).

    Not here, because on this prompt the wrong rule is (nearly) the right one: prompt lookup's few
    rejected drafts lie outside the target's top-3, where the residual is p itself (4 rejections in
    300 runs, all with residual = p); the random EAGLE head's q barely overlaps p (20 of 597
    rejections had residual ≠ p, mean total variation 0.004; p = 0.48 and 0.11 on two seed blocks);
    tree rounds are verified by `tree_sample`, which this rule does not replace (test_tree has
    its own wrong tree rules); and the adaptive policy's runs showed no detectable change (p from
    0.00076 to 0.88 over 10 seed blocks, noncentrality about 1).
    """
    patch_chain_rule(monkeypatch, verify_module, residual_from_p)
    drafter = drafters(tiny_target, draft_model)[kind]
    assert sampled_pvalue(Engine(tiny_target, drafter), first_tokens_law) < ALPHA
