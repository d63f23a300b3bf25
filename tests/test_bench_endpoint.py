"""`specdec bench --endpoint`: a real `specdec serve` server (on a free port, with an API key) measured by the
benchmark, alone and beside the local methods; and the one-line errors
for an endpoint that is not there, refuses the key, or is not an OpenAI-compatible server.
"""

from __future__ import annotations

import http.server
import json
import threading

import httpx
import pytest
from live_server import MODEL, PROMPT, LiveServer, free_port, make_service

from specdec.cli import main

KEY = "bench-key"
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def server(chat_folder):
    """The server `specdec serve` runs (uvicorn, on a free loopback port), with an API key and a fixed γ."""
    live = LiveServer(make_service(chat_folder, "ngram", api_key=KEY, gamma=3, max_gamma=3, max_batch=1))
    yield live.url
    live.stop()


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    records = [{"question_id": 1, "category": "qa", "turns": [PROMPT]},
               {"question_id": 2, "category": "writing", "turns": ["t7 t8 t7 t8 t7 t8", "t3 t4"]}]  # a conversation
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def bench(capsys, *argv) -> tuple[int, dict | None, str]:
    code = main(["bench", "--max-new-tokens", str(NEW_TOKENS), "--json", *argv])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    return code, json.loads(lines[-1])["summary"] if code == 0 else None, captured.err


def test_two_endpoints_are_measured_with_their_speculation(server, prompts, chat_folder, tmp_path, capsys):
    out = tmp_path / "out"
    code, summary, err = bench(capsys, "--prompts", str(prompts), "--out-dir", str(out), "--api-key", KEY,
                               "--endpoint", server, "--label", "ours", "--endpoint", server + "/v1/", "--label", "again")
    assert code == 0, err
    greedy = summary["0"]
    assert list(greedy["methods"]) == ["ours", "again"] and greedy["baseline"] == "ours"  # no local method ran
    for m in greedy["methods"].values():
        assert m["endpoint"] == server and m["tokens_per_second"]["median"] > 0
        assert 0 < m["time_to_first_token_seconds"]["median"] < 30
        assert m["mean_accepted_tokens"] >= 1 and m["acceptance_rate"] is not None  # read from the server's `speculation`
        assert m["identical"] == 2  # greedy: the same text as the first endpoint
        assert "speedup_vs_first_endpoint" in m and "speedup_vs_plain" not in m and "predicted_speedup" not in m
    report = (out / "report.md").read_text()
    assert "| ours |" in report and "first token s median" in report and "identical to ours" in report
    assert f"endpoint ours: {server}, model {MODEL}, new tokens counted from usage" in report
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["1", "2"]
    first = rows[0]["methods"]["ours"]
    assert first["new_tokens"] == [NEW_TOKENS] and len(first["time_to_first_token_seconds"]) == 1
    stats = first["stats"]
    assert stats["drafter"] == "ngram" and stats["accepted"] <= stats["drafted"]
    assert stats["target_passes"] + stats["accepted"] == NEW_TOKENS  # each pass: its accepted tokens + 1
    assert len(rows[1]["methods"]["ours"]["time_to_first_token_seconds"]) == 2  # one per turn
    for name in ("speedup_by_category.png", "acceptance_by_position.png", "predicted_vs_measured.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # greedy text: what the server answers not streamed, and what the local engine generates
    whole = httpx.post(server + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": NEW_TOKENS,
        "temperature": 0}).json()
    assert first["text"] == whole["choices"][0]["message"]["content"]
    assert main(["generate", PROMPT, "--model", str(chat_folder), "--max-new-tokens", str(NEW_TOKENS), "--json"]) == 0
    assert first["text"] == json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]


def test_an_endpoint_beside_the_local_methods(server, chat_folder, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text(PROMPT + "\n")
    code, summary, err = bench(capsys, "--prompts", str(prompts), "--out-dir", str(tmp_path / "out"), "--model",
                               str(chat_folder), "--drafter", "ngram", "--no-transformers", "--endpoint", server,
                               "--api-key", KEY, "--label", "served")
    assert code == 0, err
    greedy = summary["0"]
    assert list(greedy["methods"]) == ["plain", "ngram", "served"] and greedy["baseline"] == "plain"
    assert greedy["methods"]["served"]["speedup_vs_plain"] > 0 and greedy["methods"]["ngram"]["identical"] == 1
    assert "identical to plain (endpoints: served)" in (tmp_path / "out" / "report.md").read_text()


class NotOpenAI(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the standard library's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>a web page</html>")

    def log_message(self, *args):
        pass


@pytest.fixture
def web_page():
    httpd = http.server.HTTPServer(("127.0.0.1", 0), NotOpenAI)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_endpoint_errors_are_one_line_that_says_what_to_do(server, web_page, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("t5 t9\n")
    argv = ["--prompts", str(prompts), "--out-dir", str(tmp_path / "out")]
    nobody = f"http://127.0.0.1:{free_port()}"
    cases = [
        ([nobody], f"specdec: error: endpoint {nobody}: cannot reach {nobody}", "start the server or correct the URL"),
        ([server], "the server refused the API key (HTTP 401 on GET /v1/models)", "--api-key KEY"),
        ([server, "--api-key", KEY, "--served-model", "other"], "does not serve the model 'other'", "--served-model"),
        ([web_page], "GET /v1/models did not answer an OpenAI model list", "OpenAI-compatible server"),
        (["localhost:8000"], "give an http:// or https:// URL", ""),
        ([server, "--assistant", "x"], "add --drafter SPEC", ""),
    ]
    for (endpoint, *rest), message, fix in cases:
        code, _, err = bench(capsys, *argv, "--endpoint", endpoint, *rest)
        assert code == 1 and message in err and fix in err and len(err.strip().splitlines()) == 1, err
