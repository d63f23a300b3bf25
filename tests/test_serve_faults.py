"""Faults while serving: a row is the unit of failure, a broken worker says so, places are free before
the answer ends, gauges are exact at rest.

- a drafter that raises on its third proposal ends its own row with an error; the rows beside it, in
  the same batch, finish with exactly the tokens they get alone (greedy);
- the same through the server: the failing request gets a 500 error object, the others their answers;
- an error outside the rounds (the worker itself) fails every admitted request, /health answers 503
  and new requests get a 503 naming the cause;
- a finished request's place is given back before its answer's end is sent: four clients sending
  request after request at a bound of four never get a 429, even when the worker thread is held
  just after sending (what the GIL can do to it), and /health and the batch gauge read 0 at once.
Each of these fails on a scheduler that sends the last update before releasing the place, or that
fails the whole round for one row's error.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from live_server import MODEL, PROMPT, LiveServer, make_service, wait_for

from specdec.decode.batch import Batch
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.decode.engine import Engine, GenerationConfig
from specdec.runtime import load_model
from specdec.serve import scheduler as scheduler_module
from specdec.serve.memory import cache_bytes_per_slot
from specdec.serve.service import ServeSettings, Service

PROMPTS = [[5, 9, 12, 7, 5, 9, 12, 7, 5], [3, 4, 5, 3, 4, 5, 3], [8, 8, 8, 8, 8, 8]]


class FailsOnThirdProposal(PromptLookupDrafter):
    """Prompt lookup that raises on its third proposal of a request (a drafter's bug), once `armed`
    (after the server measured its costs)."""

    armed = True

    def begin(self, prompt_ids, max_len, target_cache=None) -> None:
        super().begin(prompt_ids, max_len, target_cache)
        self.proposals = 0

    def propose(self, tokens, max_tokens, params, generator):
        self.proposals += 1
        if self.armed and self.proposals == 3:
            raise RuntimeError("the drafter broke on its third proposal")
        return super().propose(tokens, max_tokens, params, generator)


def test_a_failing_row_ends_alone_and_the_others_finish_as_alone(tiny_target):
    config = GenerationConfig(max_new_tokens=24, gamma=3, ignore_eos=True)
    good = [Engine(tiny_target), Engine(tiny_target, [PromptLookupDrafter()])]
    bad = Engine(tiny_target, [FailsOnThirdProposal()])
    alone = [engine.generate(prompt, config).token_ids for engine, prompt in zip(good, PROMPTS)]
    with pytest.raises(RuntimeError, match="third proposal"):  # alone, the library call raises the row's error
        bad.generate(PROMPTS[2], config)
    batch = Batch(tiny_target)
    rows = [engine.row(prompt, config) for engine, prompt in zip([*good, bad], PROMPTS)]
    for row in rows:
        batch.add(row)
    outputs = {id(row): [] for row in rows}
    errors = {}
    while batch.rows:
        for row, event in batch.step():
            outputs[id(row)] += [t for piece in event.pieces for t in piece.token_ids]
            if event.error is not None:
                errors[id(row)] = event.error
    assert list(errors) == [id(rows[2])] and "third proposal" in str(errors[id(rows[2])])
    assert [outputs[id(row)] for row in rows[:2]] == alone


def test_a_row_whose_cache_overflows_fails_alone(tiny_target):
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    engine = Engine(tiny_target)
    alone = engine.generate(PROMPTS[0], config).token_ids
    batch = Batch(tiny_target)
    kept, broken = engine.row(PROMPTS[0], config), engine.row(PROMPTS[1], config)
    broken.cache.max_len = broken.full_slots = len(PROMPTS[1]) + 2  # room for the prompt and two more tokens only
    batch.add(kept)
    batch.add(broken)
    errors = []
    while batch.rows:
        errors += [(row, event.error) for row, event in batch.step() if event.error is not None]
    assert [row for row, _ in errors] == [broken] and "past the cache" in str(errors[0][1])
    assert kept.tokens[len(PROMPTS[0]):] == alone


def test_a_failing_request_gets_its_error_and_the_others_their_answers(chat_folder):
    target = load_model(str(chat_folder))
    drafter = FailsOnThirdProposal()
    drafter.armed = False  # while the server measures its costs
    service = Service(target, [drafter], ServeSettings(model_id=MODEL, max_batch=4))
    service.prepare()
    drafter.armed = True
    server = LiveServer(service)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    try:
        plain = {**body, "speculation": {"enabled": False}}
        expected = httpx.post(server.url + "/v1/completions", json=plain, timeout=30).json()["choices"][0]["text"]
        with ThreadPoolExecutor(4) as pool:
            bad = pool.submit(httpx.post, server.url + "/v1/completions",
                              json={**body, "speculation": {"drafter": "ngram", "gamma": 2}}, timeout=30)
            good = [pool.submit(httpx.post, server.url + "/v1/completions", json={**body, "speculation": {"enabled": False}},
                                timeout=30) for _ in range(3)]
            answers = [g.result() for g in good]
            failed = bad.result()
        assert failed.status_code == 500 and "third proposal" in failed.json()["error"]["message"]
        assert [a.status_code for a in answers] == [200] * 3
        assert [a.json()["choices"][0]["text"] for a in answers] == [expected] * 3
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        server.stop()


def test_a_broken_worker_fails_what_it_holds_and_health_says_503(chat_folder, monkeypatch):
    service = make_service(chat_folder, "none")
    server = LiveServer(service)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    try:
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200

        def broken_round(batch):
            raise MemoryError("no memory for the round")

        monkeypatch.setattr(scheduler_module.Batch, "step", broken_round)
        failed = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        assert failed.status_code == 500 and "worker stopped" in failed.json()["error"]["message"]
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and "MemoryError" in health.json()["error"]["message"]
        refused = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        assert refused.status_code == 503 and "restart" in refused.json()["error"]["message"]
    finally:
        server.stop()


def test_sequential_clients_at_the_bound_never_get_429(chat_folder, monkeypatch):
    service = make_service(chat_folder, "none", max_pending=4, max_batch=4)
    send = scheduler_module.Job.send

    def send_then_stall(job, update):  # the worker loses the CPU right after sending an answer's end
        send(job, update)
        if update.stats is not None or update.error is not None:
            time.sleep(0.2)

    monkeypatch.setattr(scheduler_module.Job, "send", send_then_stall)
    server = LiveServer(service)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "temperature": 0}

    def client(_) -> list[int]:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            return [http.post("/v1/completions", json=body).status_code for _ in range(5)]

    try:
        with ThreadPoolExecutor(4) as pool:
            statuses = [s for run in pool.map(client, range(4)) for s in run]
        assert statuses == [200] * 20  # 20 requests, never more than 4 in flight
        health = httpx.get(server.url + "/health").json()
        assert health["running"] == 0 and health["waiting"] == 0
        wait_for(lambda: "specdec_batch_rows 0.0" in httpx.get(server.url + "/metrics").text)
    finally:
        server.stop()


def test_the_place_is_free_when_the_answer_ends(tiny_target, monkeypatch):
    """The scheduler alone: on reading a job's last update, its place is already given back."""
    import asyncio

    held = threading.Event()
    send = scheduler_module.Job.send

    def send_then_stall(job, update):
        send(job, update)
        if update.stats is not None:
            held.wait(0.5)

    monkeypatch.setattr(scheduler_module.Job, "send", send_then_stall)

    async def scenario():
        scheduler = scheduler_module.Scheduler(max_pending=1)
        job = scheduler.submit(Engine(tiny_target), [5, 9, 12], GenerationConfig(max_new_tokens=3, ignore_eos=True))
        while (update := await asyncio.wait_for(job.updates.get(), 10)).stats is None:
            pass
        free = job.released and scheduler.running == 0
        held.set()
        scheduler.close()
        return free

    assert asyncio.run(scenario())


def test_nothing_is_measured_while_serving(chat_folder, monkeypatch):
    """Once prepared, every speculation setting a request may send runs on the measured costs; a γ
    past the server's bound gets a 400 naming the bound (it once paused every stream to measure)."""
    service = make_service(chat_folder, "auto:ngram,suffix")  # --max-gamma 8, measured at start

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured while serving")

    from specdec.control.cost_model import measure

    for name in ("measure_pass_costs", "measure_row_costs", "measure_draft_cost"):
        monkeypatch.setattr(measure, name, no_measuring)
    server = LiveServer(service)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    allowed = [{}, {"drafter": "auto"}, {"gamma": 8}, {"max_gamma": 8}, {"drafter": "ngram"}, {"drafter": "suffix", "gamma": 3},
               {"drafter": "ngram", "gamma": "auto", "max_gamma": 2}, {"enabled": False}]
    try:
        for speculation in allowed:
            answer = httpx.post(server.url + "/v1/completions", json={**body, "speculation": speculation}, timeout=30)
            assert answer.status_code == 200, (speculation, answer.text)
        for speculation, param in (({"max_gamma": 16}, "speculation.max_gamma"), ({"gamma": 12}, "speculation.gamma")):
            refused = httpx.post(server.url + "/v1/completions", json={**body, "speculation": speculation}, timeout=30)
            error = refused.json()["error"]
            assert refused.status_code == 400 and error["param"] == param and "bound of 8" in error["message"]
    finally:
        server.stop()


def test_rows_join_only_while_their_caches_fit_the_budget(tiny_target):
    """Three requests whose rows each need half the budget, with room for four rows: two decode at a
    time, the third joins when one leaves, and each answer is the one it gets alone."""
    import asyncio

    from specdec.decode.batch import cache_slots

    engine = Engine(tiny_target)
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    need = cache_slots(len(PROMPTS[0]) + 20, []) * cache_bytes_per_slot(tiny_target.net)
    alone = engine.generate(PROMPTS[0], config).token_ids
    rows_per_round = []

    async def scenario():
        scheduler = scheduler_module.Scheduler(max_pending=8, max_batch=4, memory_budget=2 * need,
                                               on_round=lambda rows, gammas: rows_per_round.append(rows))
        with pytest.raises(scheduler_module.CacheTooLarge, match="can never fit"):
            scheduler.submit(engine, PROMPTS[0], config, cache_bytes=2 * need + 1)
        jobs = [scheduler.submit(engine, PROMPTS[0], config, cache_bytes=need) for _ in range(3)]
        outputs = []
        for job in jobs:
            tokens = []
            while (update := await asyncio.wait_for(job.updates.get(), 30)).stats is None:
                tokens += [t for piece in update.pieces for t in piece.token_ids]
            outputs.append(tokens + [t for piece in update.pieces for t in piece.token_ids])
        scheduler.close()
        return outputs

    assert asyncio.run(scenario()) == [alone] * 3
    assert max(rows_per_round) == 2 and rows_per_round.count(1) >= 1  # the third ran after the others left


def test_a_request_whose_cache_can_never_fit_is_refused_by_name(chat_folder):
    service = make_service(chat_folder, "none")
    slot = cache_bytes_per_slot(service.target.net)
    service.scheduler.memory_budget = 256 * slot  # one row of the tiny model's whole context (256 tokens)
    server = LiveServer(service)
    try:
        body = {"model": MODEL, "prompt": PROMPT, "temperature": 0, "max_tokens": 8}
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200
        service.scheduler.memory_budget = 255 * slot  # less than the smallest cache a row takes (256 slots)
        refused = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        error = refused.json()["error"]
        assert refused.status_code == 400 and error["code"] == "kv_memory_exceeded" and "--kv-memory" in error["message"]
    finally:
        server.stop()


def test_an_8b_models_rows_and_what_the_start_up_line_says():
    """Llama-3.1-8B's shape (32 layers, 8 KV heads of 128): 256 KiB of float32 cache a token, so 16
    rows of 4k tokens need 16 GiB; the start-up line says how many fit the budget."""
    from types import SimpleNamespace

    from specdec.runtime.config import ModelConfig
    from specdec.runtime.llama import LlamaModel
    from specdec.serve.command import memory_line

    config = ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                         num_kv_heads=8, head_dim=128, max_position_embeddings=8192)
    net = LlamaModel.on_meta(config)
    slot = cache_bytes_per_slot(net)
    assert slot == 32 * 2 * 8 * 128 * 4
    target = SimpleNamespace(net=net, max_context=8192)
    service = Service.__new__(Service)  # just what memory_line reads
    service.target, service.drafters, service.slot_bytes = target, [], slot
    service.scheduler, service.prefix_cache = SimpleNamespace(memory_budget=15 << 30), None
    line = memory_line(service)
    assert "256 KiB a token" in line and "15.0 GiB" in line and "7 requests of the full 8192-token" in line
    assert "(4k tokens: 15)" in line and "--prefix-cache" not in line
    service.prefix_cache = SimpleNamespace(max_bytes=1 << 30)
    assert memory_line(service).endswith("; 1.00 GiB kept for prompts that begin alike (--prefix-cache)")


@pytest.mark.parametrize("recompute", [True, False])
def test_rows_preempted_for_memory_recompute_and_answer_as_alone(tiny_target, monkeypatch, recompute):
    """Three requests whose caches grow (in steps of 16 slots here) past a budget that holds one whole
    row and a little: the rows that joined last are preempted as the others grow, wait, recompute their
    caches and go on. No request is lost, and each answer is the one it gets alone: plain greedy, prompt
    lookup sampled with a seed at a fixed γ, and an EAGLE chain (whose head reads the target's features,
    which a recomputed cache must not give it twice). Control (`recompute` False): a preemption that
    frees the cache and goes on without filling it again changes the answers."""
    import asyncio

    from random_heads import random_eagle_head

    from specdec.decode import batch as batch_module
    from specdec.drafters.eagle import EagleDrafter
    from specdec.sampling import SamplingParams

    monkeypatch.setattr(batch_module, "CACHE_STEP", 16)
    if not recompute:
        def forgetful(row):
            row.cache.release()  # the memory given back, but nothing recomputed: decoding goes on from slot 0
        monkeypatch.setattr(batch_module.Row, "preempt", forgetful)
    slot = cache_bytes_per_slot(tiny_target.net)
    requests = [
        (Engine(tiny_target), PROMPTS[0], GenerationConfig(max_new_tokens=60, ignore_eos=True)),
        (Engine(tiny_target, [PromptLookupDrafter(max_ngram=3, min_ngram=1)]), PROMPTS[1],
         GenerationConfig(max_new_tokens=60, gamma=3, ignore_eos=True, sampling=SamplingParams(temperature=1.0, seed=3))),
        (Engine(tiny_target, [EagleDrafter(tiny_target, random_eagle_head(tiny_target))]), PROMPTS[2],
         GenerationConfig(max_new_tokens=60, gamma=3, ignore_eos=True)),
    ]
    alone = [engine.generate(prompt, config).token_ids for engine, prompt, config in requests]
    largest = max(batch_module.cache_slots(len(prompt) + config.max_new_tokens, engine.drafters)
                  for engine, prompt, config in requests) * slot

    async def scenario():
        scheduler = scheduler_module.Scheduler(max_pending=8, max_batch=4, memory_budget=largest + 32 * slot)
        jobs = [scheduler.submit(engine, prompt, config, cache_bytes=largest, first_bytes=16 * slot)
                for engine, prompt, config in requests]
        outputs = []
        for job in jobs:
            tokens = []
            while (update := await asyncio.wait_for(job.updates.get(), 60)).stats is None:
                assert update.error is None, update.error
                tokens += [t for piece in update.pieces for t in piece.token_ids]
            outputs.append(tokens + [t for piece in update.pieces for t in piece.token_ids])
        scheduler.close()
        return outputs, scheduler.preemptions

    outputs, preemptions = asyncio.run(scenario())
    assert preemptions >= 1 and all(len(tokens) == 60 for tokens in outputs)
    if recompute:
        assert outputs == alone
    else:
        assert outputs != alone
