"""`specdec serve`: the real server on a loopback port, spoken to with the official openai client and raw HTTP.

The server runs a tiny random model with a word-level chat template, so every request takes
milliseconds. Greedy answers are compared with `specdec generate` and with each other (streamed,
not streamed, per-request speculation settings); the error cases check status, OpenAI's error
format and a message that names the problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import OpenAI

from live_server import MODEL, PROMPT, LiveServer, free_port, make_service, post, wait_for
from specdec.cli import main
from specdec.loadtest.client import run_load_test, speculation_setting
from specdec.serve.scheduler import Scheduler, ServerBusy


@pytest.fixture(scope="module")
def client(live):
    return OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


def test_greedy_chat_matches_specdec_generate(client, chat_folder, capsys):
    code = main(["generate", PROMPT, "--model", str(chat_folder), "--drafter", "ngram", "--max-new-tokens", "24", "--json"])
    assert code == 0
    expected = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    response = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=24,
                                              temperature=0, extra_body={"speculation": {"drafter": "ngram"}})
    assert response.choices[0].message.content == expected["text"]
    assert response.usage.completion_tokens == expected["speculative"]["new_tokens"]
    spec = response.model_extra["speculation"]
    assert spec["drafter"] == "ngram" and spec["accepted_tokens"] <= spec["drafted_tokens"]
    assert spec["target_passes"] + spec["accepted_tokens"] == response.usage.completion_tokens  # one pass: its accepted + 1


def test_streaming_equals_whole_and_reports_usage_and_speculation(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=30, temperature=0,
                  extra_body={"speculation": {"drafter": "ngram", "gamma": 3}})  # suffix learns: its rounds differ
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    last_choice = [c for c in chunks if c.choices][-1]
    assert last_choice.choices[0].finish_reason == whole.choices[0].finish_reason
    assert last_choice.model_extra["speculation"] == whole.model_extra["speculation"]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_text_completions_with_ids_stop_strings_and_seeded_sampling(client):
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0)
    words = plain.choices[0].text.split()
    assert plain.choices[0].finish_reason == "length" and len(words) == 20
    by_ids = client.completions.create(model=MODEL, prompt=[int(w[1:]) for w in PROMPT.split()], max_tokens=20, temperature=0)
    assert by_ids.choices[0].text == plain.choices[0].text
    stop = " ".join(words[5:7])
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop])
    cut = plain.choices[0].text.index(stop)
    assert stopped.choices[0].text == plain.choices[0].text[:cut] and stopped.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop], stream=True))
    assert streamed == stopped.choices[0].text
    one, two = (client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=1.0, top_p=0.9, seed=7,
                                          extra_body={"speculation": {"drafter": "ngram", "gamma": 3}}) for _ in range(2))
    assert one.choices[0].text == two.choices[0].text  # the same seed and drafting repeat a sampled answer


def test_per_request_speculation(client):
    def ask(speculation):
        return client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0,
                                         extra_body={"speculation": speculation} if speculation is not None else None)

    off, fixed, default = ask({"enabled": False}), ask({"drafter": "ngram", "gamma": 2}), ask(None)
    assert off.choices[0].text == fixed.choices[0].text == default.choices[0].text  # speed changes, never output
    off_spec, fixed_spec = off.model_extra["speculation"], fixed.model_extra["speculation"]
    assert off_spec["drafted_tokens"] == 0 and off_spec["target_passes"] == off.usage.completion_tokens
    assert fixed_spec["drafter"] == "ngram" and fixed_spec["drafted_tokens"] > 0
    assert fixed_spec["target_passes"] + fixed_spec["accepted_tokens"] == fixed.usage.completion_tokens
    assert default.model_extra["speculation"]["drafter"] == "auto(ngram,suffix)"


def test_models_health_and_metrics(live, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0,
                              extra_body={"speculation": {"drafter": "ngram", "gamma": 3}})
    assert httpx.get(live.url + "/health").json()["status"] == "ok"
    wrong_method = httpx.get(live.url + "/v1/completions")
    assert wrong_method.status_code == 405 and "not allowed" in wrong_method.json()["error"]["message"]
    metrics = httpx.get(live.url + "/metrics").text
    for name in ("specdec_drafted_tokens_total", "specdec_accepted_tokens_total", "specdec_target_passes_total",
                 'specdec_drafted_tokens_by_position_total{position="1"}', "specdec_time_to_first_token_seconds_bucket",
                 "specdec_time_per_output_token_seconds_count", "specdec_request_seconds_count", "specdec_queue_length",
                 'specdec_requests_total{route="/v1/completions",status="200"}'):
        assert name in metrics, name


ERROR_CASES = [
    ("/v1/completions", '{"model": "tiny", "prompt": ', 400, "not valid JSON"),
    ("/v1/completions", "[1, 2]", 400, "body"),
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "max_tokens": 10**9}, 400, "ask for at most"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "temperature": 2.5}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "seed": 2**70}, 400, "seed"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "logprobs": 2}, 400, "logprobs: unknown field"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5 " * 300}, 400, "context"),
    ("/v1/completions", {"model": MODEL, "prompt": [70000]}, 400, "token ids must lie in"),
    ("/v1/completions", {"model": "gpt-9", "prompt": "t5"}, 404, "not served here"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "speculation": {"drafter": "medusa"}}, 400, "not loaded"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "speculation": {"gamma": 0}}, 400, "speculation.gamma"),
    ("/v1/completions", {"model": MODEL, "prompt": "t5", "speculation": {"enabled": False, "gamma": 2}}, 400, "enabled is false"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "t5"}]}, 400, "messages.0.role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "t5"}], "stream_options": {}}, 400,
     "stream: true"),
    ("/v1/nothing", {}, 404, "no route"),
]


@pytest.mark.parametrize("path,body,status,fragment", ERROR_CASES)
def test_bad_requests_get_openai_errors(live, path, body, status, fragment):
    response = post(live, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"]


def test_api_key_guards_every_route_but_health(chat_folder):
    server = LiveServer(make_service(chat_folder, "ngram", api_key="sesame"))
    try:
        assert httpx.get(server.url + "/health").status_code == 200
        for path in ("/v1/models", "/metrics"):
            assert httpx.get(server.url + path).status_code == 401
            assert httpx.get(server.url + path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        body = {"model": MODEL, "prompt": "t5 t9", "max_tokens": 3, "temperature": 0}  # greedy: the count cannot depend on a sampled end token
        refused = httpx.post(server.url + "/v1/completions", json=body)
        assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
        good = OpenAI(base_url=server.url + "/v1", api_key="sesame", max_retries=0)
        assert good.completions.create(**body).usage.completion_tokens == 3
    finally:
        server.stop()


def gated(engine, gate: threading.Event):
    """Make `engine`'s requests hold the decoding thread after their first update until `gate` is set."""
    make_row = engine.row

    def row(prompt_ids, config):
        held = make_row(prompt_ids, config)
        event, sent = held.event, []

        def event_after_the_gate():
            if sent:
                gate.wait(30)
            update = event()
            if update is not None:
                sent.append(update)
            return update

        held.event = event_after_the_gate
        return held

    engine.row = row


def test_full_queue_answers_429_and_a_departed_client_frees_its_place(chat_folder):
    service = make_service(chat_folder, "none", max_pending=2)
    gate = threading.Event()
    gated(service.default, gate)
    server = LiveServer(service)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": True}
    health = lambda: httpx.get(server.url + "/health").json()  # noqa: E731
    try:
        with httpx.Client(base_url=server.url, timeout=30) as first, httpx.Client(base_url=server.url, timeout=30) as second:
            with first.stream("POST", "/v1/completions", json=body) as running:
                stream_lines = running.iter_lines()
                received = [next(stream_lines)]  # generation started and is held
                wait_for(lambda: health()["running"] == 1)
                with second.stream("POST", "/v1/completions", json=body) as waiting:
                    assert waiting.status_code == 200
                    wait_for(lambda: health()["waiting"] == 1)
                    busy = httpx.post(server.url + "/v1/completions", json=body)
                    assert busy.status_code == 429 and "busy" in busy.json()["error"]["message"]
                    assert busy.headers["retry-after"] == "1"
                # the waiting client left: its place is free at once, while the first still runs
                wait_for(lambda: health()["waiting"] == 0)
                assert health()["running"] == 1
                gate.set()
                lines = [line for line in received + list(stream_lines) if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            text = "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines[:-1])
        expected = httpx.post(server.url + "/v1/completions", json={**body, "stream": False}).json()["choices"][0]["text"]
        assert text == expected
        metrics = httpx.get(server.url + "/metrics").text
        assert "specdec_requests_rejected_busy_total 1.0" in metrics and "specdec_requests_cancelled_total 1.0" in metrics
    finally:
        gate.set()
        server.stop()


def test_cancelled_jobs_give_their_place_back_and_stop_within_a_round(tiny_target):
    from specdec.decode.engine import Engine, GenerationConfig

    async def scenario():
        engine = Engine(tiny_target)
        gate = threading.Event()
        gated(engine, gate)
        scheduler = Scheduler(max_pending=2)
        config = GenerationConfig(max_new_tokens=50, ignore_eos=True)
        running = scheduler.submit(engine, [5, 9, 12], config)
        waiting = scheduler.submit(engine, [5, 9, 12], config)
        with pytest.raises(ServerBusy):
            scheduler.submit(engine, [5, 9, 12], config)
        first = await asyncio.wait_for(running.updates.get(), 10)
        assert first.pieces and scheduler.running == 1 and scheduler.waiting == 1
        scheduler.cancel(waiting)  # a waiting job gives its place back at once
        assert scheduler.waiting == 0 and scheduler.running == 1
        later = scheduler.submit(engine, [5, 9, 12], config)
        scheduler.cancel(running)  # a running one stops at the end of its round
        gate.set()
        while not running.released:
            await asyncio.sleep(0.01)
        updates = []
        while not running.updates.empty():
            updates.append(running.updates.get_nowait())
        assert len(updates) <= 1 and all(u.stats is None for u in updates)  # no final update: it did not finish
        scheduler.close()  # shutdown cancels what is left
        await asyncio.sleep(0.05)
        assert not waiting.started and later.cancelled and scheduler.running == scheduler.waiting == 0

    asyncio.run(scenario())


def test_load_many_streaming_clients_lose_no_tokens(chat_folder):
    server = LiveServer(make_service(chat_folder, "ngram", max_pending=8, max_batch=1))
    try:
        prompts = [PROMPT, "t3 t4 t3 t4 t3", "t40 t41 t42", "t7"]
        result = asyncio.run(run_load_test(server.url, MODEL, prompts, clients=32, requests=120, max_tokens=12))
        summary = result.summary()
        assert summary["completed"] == 120 and summary["errors"] == 0 and summary["mismatches"] == 0, summary
        assert summary["busy_answers_429"] > 0  # 32 clients against a bound of 8: the bound was hit
        assert httpx.get(server.url + "/health").json() == {"status": "ok", "model": MODEL, "running": 0, "waiting": 0}
    finally:
        server.stop()


@pytest.mark.parametrize("speculation", ["off", "3", "auto"])
def test_32_clients_decoded_in_batches_each_get_the_answer_they_get_alone(chat_folder, speculation):
    """Continuous batching: 32 concurrent streaming clients, 8 rows at a time, answers of 4, 12 and
    24 tokens, a quarter of the clients leaving after a few events; every completed answer equals the
    answer the same request gets alone (not streamed, on an idle server), and the batch really held
    several rows (the batch-size gauge)."""
    server = LiveServer(make_service(chat_folder, "auto:ngram,suffix", max_pending=32, max_batch=8))
    try:
        prompts = [PROMPT, "t3 t4 t3 t4 t3", "t40 t41 t42", "t7", "t9 t9 t8 t9 t9 t8 t9"]
        result = asyncio.run(run_load_test(server.url, MODEL, prompts, clients=32, requests=96, max_tokens=24,
                                           speculation=speculation_setting(speculation), answer_lengths=[4, 12, 24],
                                           disconnect_share=0.25, seed=1))
        summary = result.summary()
        assert summary["errors"] == 0 and summary["mismatches"] == 0, summary
        assert summary["completed"] + summary["disconnected"] == 96 and summary["disconnected"] > 0
        metrics = httpx.get(server.url + "/metrics").text.splitlines()
        peak = next(float(line.split()[1]) for line in metrics if line.startswith("specdec_batch_rows_peak "))
        assert 1 < peak <= 8  # rows were decoded together, never more than the bound
    finally:
        server.stop()


def test_one_clients_question_does_not_reach_another_clients_drafts(chat_folder):
    """Isolation: with suffix drafting, a second client asking the first client's exact question
    must see the acceptance a fresh server gives (the first answer was not learned); with
    --share-learning the same probe does see it (the control: the probe can tell)."""
    question = {"model": MODEL, "prompt": "t40 t41 t42 t43", "max_tokens": 40, "temperature": 0,
                "speculation": {"drafter": "suffix", "gamma": 4}}

    def second_answer(share: bool, ask_first: bool) -> dict:
        server = LiveServer(make_service(chat_folder, "suffix", share_learning=share, max_batch=2))
        try:
            if ask_first:
                assert httpx.post(server.url + "/v1/completions", json=question).status_code == 200
            return httpx.post(server.url + "/v1/completions", json=question).json()["speculation"]
        finally:
            server.stop()

    fresh = second_answer(share=False, ask_first=False)
    assert second_answer(share=False, ask_first=True) == fresh
    learned = second_answer(share=True, ask_first=True)
    assert learned["accepted_tokens"] > fresh["accepted_tokens"], (learned, fresh)


def test_requests_that_begin_alike_prefill_only_the_rest_and_get_the_same_answers(chat_folder):
    """A system prompt sent by every client: from the second request on, its tokens come from the
    prefix cache (`usage.prompt_tokens_details.cached_tokens`, read by the official client), and each
    answer is the one a server without the cache gives. Control: with --prefix-cache 0 nothing is
    reused."""
    system = {"role": "system", "content": " ".join(f"t{10 + i % 30}" for i in range(60))}
    questions = ["t5 t9 t12", "t7 t8", "t5 t9 t13"]

    def answers(**settings) -> list[tuple[str, int]]:
        server = LiveServer(make_service(chat_folder, "auto:ngram,suffix", **settings))
        try:
            client = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            out = []
            for question in questions:
                response = client.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": question}],
                                                          max_tokens=8, temperature=0)
                out.append((response.choices[0].message.content, response.usage.prompt_tokens_details.cached_tokens))
            return out
        finally:
            server.stop()

    cached, without = answers(), answers(prefix_cache=0)
    assert [text for text, _ in cached] == [text for text, _ in without]
    assert [n for _, n in without] == [0, 0, 0]
    assert cached[0][1] == 0 and all(n >= 60 for _, n in cached[1:]), cached  # the system prompt's 60 words at least


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False)
                           | st.text(max_size=12), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
SPECULATION = st.fixed_dictionaries({}, optional={
    "enabled": st.booleans(), "drafter": st.sampled_from(["ngram", "suffix", "auto", "none", "x"]),
    "gamma": st.integers(-1, 20) | st.just("auto"), "max_gamma": st.integers(0, 20)})
# Mostly valid values, so that requests get past validation and generate; any JSON value now and then.
FIELD_VALUES = {
    "model": st.just(MODEL) | JSON_VALUES,
    "prompt": st.sampled_from(["t5 t9", PROMPT, "", "zz", [5, 9], ["t5 t9"]]) | JSON_VALUES,
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                                "content": st.sampled_from(["t5 t9", "", "t7 t7 t7"])}), max_size=3) | JSON_VALUES,
    "max_tokens": st.integers(-2, 300) | JSON_VALUES,
    "max_completion_tokens": st.integers(-2, 300),
    "temperature": st.floats(-0.5, 2.5) | JSON_VALUES,
    "top_p": st.floats(-0.1, 1.1) | JSON_VALUES,
    "top_k": st.integers(-1, 100) | JSON_VALUES,
    "seed": st.integers(-2**70, 2**70) | JSON_VALUES,
    "stop": st.sampled_from(["t9", ["t9", "t12"], [], [""], "t5 t9"]) | JSON_VALUES,
    "n": st.integers(0, 3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}) | JSON_VALUES,
    "speculation": SPECULATION | JSON_VALUES,
    "logit_bias": JSON_VALUES,
}


FUZZ_EXAMPLES = int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "200"))  # a longer run: SPECDEC_FUZZ_EXAMPLES=5000


@pytest.mark.slow
@settings(max_examples=FUZZ_EXAMPLES, derandomize=FUZZ_EXAMPLES <= 200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chat=st.booleans(), data=st.data())
def test_fuzzed_request_bodies_never_get_a_server_error(live, chat, data):
    """A valid body with up to three fields changed or removed: valid values mostly, any JSON value now and then."""
    body = {"model": MODEL, **({"messages": [{"role": "user", "content": "t5 t9"}]} if chat else {"prompt": "t5 t9"}),
            "max_tokens": 8}
    for name in data.draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=3, unique=True)):
        if data.draw(st.integers(0, 9)) == 0:
            body.pop(name, None)
        else:
            body[name] = data.draw(FIELD_VALUES[name], label=name)
    response = post(live, "/v1/chat/completions" if chat else "/v1/completions", body)
    assert response.status_code < 500, (body, response.text)
    if response.status_code != 200:
        assert response.json()["error"]["message"]
    elif body.get("stream"):
        assert response.text.rstrip().endswith("data: [DONE]") and '"error"' not in response.text, response.text


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_serve_command_starts_answers_and_shuts_down_cleanly(chat_folder, stop_signal):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--model", str(chat_folder), "--port", str(port),
                                "--drafter", "ngram", "--shutdown-timeout", "5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health").status_code == 200:
                    break
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.2)
        answer = httpx.post(url + "/v1/completions", json={"model": str(chat_folder), "prompt": PROMPT, "max_tokens": 5,
                                                                  "temperature": 0})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 5
        process.send_signal(stop_signal)
        assert process.wait(timeout=30) == 0
        assert b"stopped" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_references_asked_after_the_timed_requests_still_check_every_answer(chat_folder, monkeypatch):
    """`--references-after`: no reference is asked before the last timed request (so a prefix cache
    holds no timed prompt whole beforehand), and every answer is still checked against one: a
    reference planted wrong is reported as a mismatch. Control: by default the references come first."""
    import specdec.loadtest.client as load_client

    calls = []
    reference, stream_once = load_client._reference, load_client._stream_once

    async def logged_reference(client, model, prompt, *rest):
        calls.append("reference")
        text, tokens = await reference(client, model, prompt, *rest)
        return (text + " (planted)" if prompt == "t7" else text), tokens

    async def logged_stream(*args):
        calls.append("stream")
        return await stream_once(*args)

    monkeypatch.setattr(load_client, "_reference", logged_reference)
    monkeypatch.setattr(load_client, "_stream_once", logged_stream)
    server = LiveServer(make_service(chat_folder, "ngram", max_batch=4))
    try:
        prompts = [PROMPT, "t3 t4 t3 t4 t3", "t7"]
        after = asyncio.run(run_load_test(server.url, MODEL, prompts, clients=3, requests=6, max_tokens=6,
                                          references_after=True)).summary()
        assert calls == ["stream"] * 6 + ["reference"] * 3
        assert after["completed"] == 6 and after["errors"] == 0 and after["mismatches"] == 2  # the two "t7" answers
        calls.clear()
        first = asyncio.run(run_load_test(server.url, MODEL, prompts, clients=3, requests=6, max_tokens=6)).summary()
        assert calls == ["reference"] * 3 + ["stream"] * 6 and first["mismatches"] == 2
    finally:
        server.stop()
