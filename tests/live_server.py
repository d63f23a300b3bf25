"""What the server tests share (test_serve, test_serve_faults, test_serve_hardening, test_bench_endpoint):
the tiny model's chat template and prompt, a live `specdec serve` server in a thread, and small
waiting and posting helpers. The fixtures built on them (`chat_folder`, `live`) are in conftest.py."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx

from specdec.drafters import build_drafters
from specdec.runtime import load_model
from specdec.serve.app import GracefulServer
from specdec.serve.service import ServeSettings, Service

MODEL = "tiny"
CHAT_TEMPLATE = "{% for m in messages %}t2 {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}t3{% endif %}"
PROMPT = "t5 t9 t12 t7 t5 t9 t12 t7 t5"  # repetitive: prompt lookup finds drafts


class LiveServer:
    """The server `specdec serve` runs (GracefulServer, uvicorn) on a free loopback port, in a thread."""

    def __init__(self, service: Service, shutdown_timeout: float = 30.0) -> None:
        self.service = service
        self.server = GracefulServer(service, "127.0.0.1", 0, shutdown_timeout, log_level="warning")
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def make_service(folder, drafter="ngram", **settings) -> Service:
    target = load_model(str(folder))
    service = Service(target, build_drafters(drafter, target), ServeSettings(model_id=MODEL, **settings))
    service.prepare()
    return service


def post(live, path, body, **kwargs):
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(live.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=30, **kwargs)


def wait_for(predicate, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
