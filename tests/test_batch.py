"""Batched decoding (`specdec.decode.batch`): every row is the request run alone.

- greedy: up to 8 rows of different prompt lengths, joining and leaving between rounds, with mixed
  drafters (lookup, suffix, draft model, early exit, EAGLE chains and trees, Medusa) and plain rows
  (γ = 0), give each row exactly the tokens it gets alone;
- seeded sampling: a row's output depends only on its own seed, not on what else is in the batch;
- the whole-run law test of test_engine (3,000 seeded runs, α = 1e-3) for rows decoded 8 at a time,
  with fixed γ and with the adaptive policy (γ = auto: each row's choices weigh the batch's size), each
  with its negative control (accept every draft), which must fail;
- a long prompt joins in chunks of PREFILL_CHUNK tokens while the other rows keep decoding.
"""

from __future__ import annotations

import pytest

from specdec.decode import batch as batch_module
from specdec.decode import verify as verify_module
from specdec.decode.batch import PREFILL_CHUNK, Batch
from specdec.decode.engine import Engine, GenerationConfig
from specdec.sampling import SamplingParams
from stat_helpers import ALPHA, accept_everything, patch_chain_rule, tree_accept_first_children
from whole_runs import PROMPT, RUNS, TOP_K_LAW, auto_engine, drafters, law_pvalue

PROMPTS = [PROMPT, [3, 4, 5], [7, 30, 5, 9, 12, 7, 8, 3, 44, 2, 9, 9, 9, 5, 9, 12, 7], [2], [8, 8, 8, 8, 8, 8, 8, 8],
           PROMPT[::-1], [40, 41, 42, 40, 41, 42, 40], [6, 5, 4, 3, 2, 1, 6, 5, 4]]


def run_batched(requests: list[tuple[Engine, list[int], GenerationConfig]], max_rows: int,
                stats: list | None = None) -> list[list[int]]:
    """Decode the requests in one batch of at most `max_rows` rows, each joining as soon as a row
    leaves (continuous batching); returns each request's generated ids (and puts each row's final
    statistics in `stats`)."""
    batch = Batch(requests[0][0].target)
    waiting = list(enumerate(requests))
    outputs: dict[int, list[int]] = {}
    index_of = {}
    while waiting or batch.rows:
        while waiting and len(batch.rows) < max_rows:
            i, (engine, prompt, config) = waiting.pop(0)
            row = engine.row(prompt, config)
            index_of[id(row)] = i
            outputs[i] = []
            batch.add(row)
        for row, event in batch.step():
            outputs[index_of[id(row)]] += [t for piece in event.pieces for t in piece.token_ids]
            if event.done and stats is not None:
                stats.append(event.stats)
    return [outputs[i] for i in range(len(requests))]


def mixed_engines(tiny_target, draft_model) -> list[Engine]:
    pool = drafters(tiny_target, draft_model)
    return [Engine(tiny_target)] + [Engine(tiny_target, pool[kind]) for kind in pool] + [auto_engine(tiny_target, draft_model)]


def test_greedy_rows_equal_each_request_alone(tiny_target, draft_model):
    engines = mixed_engines(tiny_target, draft_model)  # plain, one per drafter kind, auto
    requests = []
    for i in range(24):  # rows of different lengths and budgets, joining and leaving
        engine, prompt = engines[i % len(engines)], PROMPTS[i % len(PROMPTS)]
        config = GenerationConfig(max_new_tokens=4 + 3 * (i % 5), gamma=2 + i % 3 if engine.drafters and i % 4 else "auto",
                                  ignore_eos=True)
        requests.append((engine, prompt, config))
    alone = [engine.generate(prompt, config).token_ids for engine, prompt, config in requests]
    for max_rows in (2, 8):
        assert run_batched(requests, max_rows) == alone


def test_a_seeded_row_repeats_its_output_whatever_else_is_in_the_batch(tiny_target, draft_model):
    engines = mixed_engines(tiny_target, draft_model)
    sampled = SamplingParams(temperature=1.0, top_p=0.9)

    def config(seed):
        return GenerationConfig(max_new_tokens=12, gamma=3, ignore_eos=True, sampling=SamplingParams(
            temperature=sampled.temperature, top_p=sampled.top_p, seed=seed))

    probe = (engines[2], PROMPT, config(7))  # the draft model's engine
    alone = probe[0].generate(PROMPT, probe[2]).token_ids
    for others in (1, 3, 7):
        neighbours = [(engines[(3 * k) % len(engines)], PROMPTS[k % len(PROMPTS)], config(100 + k)) for k in range(others)]
        assert run_batched([*neighbours[: others // 2], probe, *neighbours[others // 2:]], 8)[others // 2] == alone
    different_seed = run_batched([(probe[0], PROMPT, config(8))], 1)[0]
    assert different_seed != alone  # the seed matters: the comparison above could fail


def flat_auto_engine(tiny_target, draft_model) -> Engine:
    """The adaptive policy over every drafter kind, its pass costing 1 + 0.02 (k − 1) (a memory-bound
    model: 8 rows and their drafts cost about one pass) and model drafters 0.005 of a pass a token."""
    return auto_engine(tiny_target, draft_model, draft_cost=0.005, verify_growth=0.02)


def batched_pvalue(engine: Engine, law: dict, gamma: int | str = 3, stats: list | None = None) -> float:
    """The whole-run law test of test_engine (RUNS seeded runs) with the runs decoded 8 rows at a time."""
    requests = [(engine, PROMPT, GenerationConfig(max_new_tokens=TOP_K_LAW.new_tokens, gamma=gamma, ignore_eos=True,
                                                  sampling=TOP_K_LAW.seeded(seed)))
                for seed in range(RUNS)]
    counts: dict[tuple[int, ...], int] = {}
    for output in run_batched(requests, 8, stats):
        counts[tuple(output)] = counts.get(tuple(output), 0) + 1
    return law_pvalue(counts, law)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["draft", "eagle-tree", "eagle3"])
def test_batched_rows_follow_the_target_distribution(tiny_target, draft_model, first_tokens_law, kind):
    assert batched_pvalue(Engine(tiny_target, drafters(tiny_target, draft_model)[kind]), first_tokens_law) > ALPHA


@pytest.mark.slow
def test_batched_rows_negative_control(tiny_target, draft_model, first_tokens_law, monkeypatch):
    patch_chain_rule(monkeypatch, verify_module, accept_everything)
    monkeypatch.setattr(verify_module, "tree_sample", tree_accept_first_children)
    assert batched_pvalue(Engine(tiny_target, drafters(tiny_target, draft_model)["draft"]), first_tokens_law) < ALPHA


@pytest.mark.slow
def test_batched_rows_with_the_adaptive_policy_follow_the_target_distribution(tiny_target, draft_model,
                                                                              first_tokens_law):
    """γ = auto over every drafter kind, 8 rows a pass: each row's policy weighs the batch's size, so
    its choices differ from the same request's alone; each row must still follow the target's law.
    The pass's cost barely grows with its tokens (`flat_auto_engine`), so that drafting pays beside
    7 other rows (with test_engine's costs, 0.2 of a pass a token, the rows drafted 350 tokens in
    3,000 runs); measured on seeds 0..2999: 7,330 drafted tokens, by six drafters, p = 0.75 (the control: p = 0)."""
    stats: list = []
    assert batched_pvalue(flat_auto_engine(tiny_target, draft_model), first_tokens_law, "auto", stats) > ALPHA
    assert len(stats) == RUNS and sum(s.drafted for s in stats) > RUNS  # the rows speculated, not just decoded
    used = {d["drafter"] for s in stats for d in s.decisions if d["gamma"]}
    assert len(used) >= 3, used  # the choices depended on the rows' earlier random outcomes


@pytest.mark.slow
def test_batched_rows_with_the_adaptive_policy_negative_control(tiny_target, draft_model, first_tokens_law,
                                                                monkeypatch):
    patch_chain_rule(monkeypatch, verify_module, accept_everything)
    monkeypatch.setattr(verify_module, "tree_sample", tree_accept_first_children)
    assert batched_pvalue(flat_auto_engine(tiny_target, draft_model), first_tokens_law, "auto") < ALPHA


def test_a_long_prompt_joins_in_chunks_while_others_decode(tiny_target):
    engine = Engine(tiny_target)
    batch = Batch(tiny_target)
    short = engine.row(PROMPT, GenerationConfig(max_new_tokens=40, ignore_eos=True))
    batch.add(short)
    batch.step()  # the short prompt in one pass: it decodes from now on
    long_prompt = (PROMPTS[2] * 12)[: 3 * PREFILL_CHUNK + 5]
    joining = engine.row(long_prompt, GenerationConfig(max_new_tokens=4, ignore_eos=True))
    batch.add(joining)
    steps_to_first_token = 0
    while joining.generated == 0:
        before = short.generated
        batch.step()
        steps_to_first_token += 1
        assert short.generated == before + 1  # the decoding row went on every round
    assert steps_to_first_token == 4  # 3 full chunks and the rest
    alone = engine.generate(long_prompt, GenerationConfig(max_new_tokens=4, ignore_eos=True)).token_ids
    while batch.rows:
        batch.step()
    assert joining.tokens[len(long_prompt):] == alone


def test_the_prompt_chunk_beside_decoding_rows_follows_the_rounds_cost(tiny_target):
    """A round carrying a prompt chunk beside decoding rows that took longer than its target halves the
    next chunk (down to MIN_PREFILL_CHUNK), one under half the target doubles it (up to PREFILL_CHUNK);
    the target is SHARED_ROUND_SECONDS, or twice a round of the decoding rows alone where that is longer."""
    batch = Batch(tiny_target)
    slow, fast = 2 * batch_module.SHARED_ROUND_SECONDS, batch_module.SHARED_ROUND_SECONDS / 4
    sizes = []
    for seconds in [slow] * 5 + [fast] * 5:
        batch._tune_shared_prefill(seconds)
        sizes.append(batch.shared_prefill)
    assert sizes == [32, 16, 8, 8, 8, 16, 32, 64, 64, 64]
    batch.decoding_seconds = slow  # a large model's decoding rows: the target is twice their round
    batch._tune_shared_prefill(1.5 * slow)
    assert batch.shared_prefill == PREFILL_CHUNK
    batch._tune_shared_prefill(3 * slow)
    assert batch.shared_prefill == PREFILL_CHUNK // 2
