"""Every command in README.md runs as written, with small settings: the `specdec` lines of its code
blocks (a misspelt command or option fails here) and its library snippet.

Each line runs through `specdec.cli.main` in one working folder (the training lines use the data
the lines before them made), with the options in SMALL appended: argparse keeps an option's last
value, so they shrink what the line asks for without changing what it says. The commands that
load a model run on the suite's tiny random model with a chat template (`--model` appended, and in
the library snippet in place of the default model's name), where measuring the cost model and
training take a second instead of a minute; `export` keeps the README's default model, whose head
ships with the package. SKIPPED is the short list of lines that cannot run here, each with its
reason; it must name lines still in the README.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from specdec.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)

# what each command is given on top of the README's line: a short answer, a few prompts, one epoch
TRAIN = ["--examples", "16", "--max-new-tokens", "64", "--batch-size", "16", "--epochs", "1", "--max-len", "96"]
SMALL = {
    "generate": ["--max-new-tokens", "8"],
    "chat": ["--max-new-tokens", "8"],
    "explain": ["--max-new-tokens", "8"],
    "bench": ["--max-new-tokens", "4", "--per-category", "1"],
    "load-test": ["--clients", "2", "--requests", "4", "--max-new-tokens", "4"],
    "serve": ["--max-batch", "2"],
    "train": TRAIN,
}
ON_THE_TINY_MODEL = ("generate", "chat", "explain", "bench", "costs", "serve", "train")
CHAT_TEMPLATE = "{% for m in messages %}t2 {{ m['content'] }} {% endfor %}{% if add_generation_prompt %}t3{% endif %}"
SKIPPED = {
    "--model ~/models/Llama-3.2-1B-Instruct-Q4_K_M.gguf": "the reader's own GGUF file, not on this machine",
    "--endpoint http://gpu-box:8000": "needs servers on other machines",
}


def readme_commands() -> list[str]:
    """The `specdec` lines of the README's indented code blocks, continuation lines joined; a line
    that pipes into or out of specdec (`echo ... | specdec ... | jq ...`) counts too."""
    commands, pending, in_code, blank = [], "", False, True
    for line in README.read_text().splitlines():
        code = line.startswith("    ") and (in_code or blank)
        in_code, blank = code, not line.strip()
        if not code:
            continue
        text = pending + line.strip().removeprefix("$ ")
        pending = text[:-1] + " " if text.endswith("\\") else ""
        if not pending and re.match(r"(specdec |.*\| *specdec )", text):
            commands.append(text)
    return commands


COMMANDS = readme_commands()


def test_the_readme_has_its_commands_and_every_skip_names_one_of_them():
    assert len(COMMANDS) >= 20 and any(c.startswith("specdec train") for c in COMMANDS)
    for line in SKIPPED:
        assert any(line in c for c in COMMANDS), f"SKIPPED names a line no longer in README.md: {line}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """One folder for every line: `bench-out`, `run.html`, the training data land here, and the
    files a reader would have (`my-prompts.txt`) are here."""
    folder = tmp_path_factory.mktemp("readme")
    (folder / "my-prompts.txt").write_text("Repeat this sentence: the cat sat on the mat.\n")
    return folder


@pytest.fixture(scope="module")
def tiny_chat_model(tiny_folder, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("readme-model") / "model"
    shutil.copytree(tiny_folder, folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def server(workdir, tiny_chat_model):
    """`specdec serve` as the README starts it (plus SMALL and a free port), for the load-test line."""
    line = next(c for c in COMMANDS if c.startswith("specdec serve"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [*shlex.split(line, comments=True)[1:], *SMALL["serve"], "--model", str(tiny_chat_model), "--port", str(port)]
    process = subprocess.Popen([sys.executable, "-m", "specdec.cli", *argv], cwd=workdir, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    else:
        process.kill()
        pytest.fail(f"`{line}` did not start (exit {process.poll()}): {process.communicate()[0][-2000:]}")
    yield url
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0, process.communicate()[0][-2000:]


def run_line(line: str, workdir: Path, monkeypatch, capsys, request) -> None:
    parts = [p.strip() for p in line.split(" | ")]
    stdin, filters = "", []
    if not parts[0].startswith("specdec "):  # echo TEXT | specdec ...
        stdin = shlex.split(parts.pop(0))[1] + "\n"
    argv = shlex.split(parts.pop(0), comments=True)[1:]
    filters = parts  # what the output is piped into
    command = argv[0]
    argv += SMALL.get(command, [])
    if command in ON_THE_TINY_MODEL and "llama.cpp" not in argv:  # llama.cpp runs GGUF files: the default model
        argv += ["--model", str(request.getfixturevalue("tiny_chat_model"))]
    if command == "bench" and "--prompts" not in argv:  # of the starter set's six categories, one prompt
        argv += ["--category", "qa"]
    if command == "load-test":
        argv += ["--url", request.getfixturevalue("server")]
    if command == "chat":
        stdin = "Say hello.\n/exit\n"
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, f"`{line}` exited {code}:\n{err[-3000:]}"
    assert "Traceback" not in out + err
    for name in filters:  # `jq .a.b`: the JSON line has that field
        program, path = shlex.split(name)
        assert program == "jq", f"README pipes into {program}, which this test does not know"
        value = json.loads(out)
        for key in path.strip(".").split("."):
            value = value[key]
        assert value is not None


@pytest.mark.parametrize("line", COMMANDS, ids=[c[:60] for c in COMMANDS])
def test_a_readme_command_runs_as_written(line, workdir, monkeypatch, capsys, request):
    for part, reason in SKIPPED.items():
        if part in line:
            pytest.skip(reason)
    if "--baseline llama.cpp" in line:
        pytest.importorskip("llama_cpp", reason="llama-cpp-python, an optional extra, is not installed")
    if line.startswith("specdec serve"):
        request.getfixturevalue("server")  # started, answered /health; stopped cleanly at the end
        return
    run_line(line, workdir, monkeypatch, capsys, request)


def test_the_readme_library_snippet_runs(capsys, tiny_chat_model):
    (snippet,) = PYTHON_BLOCK.findall(README.read_text())
    assert 'load_model("smollm2-135m")' in snippet, "the snippet's model changed: update this test"
    small = snippet.replace('load_model("smollm2-135m")', f"load_model({str(tiny_chat_model)!r})")
    small = small.replace("GenerationConfig(sampling=", "GenerationConfig(max_new_tokens=8, sampling=")
    small = small.replace("max_new_tokens=64", "max_new_tokens=8")
    assert small.count("max_new_tokens=8") == 2, "the snippet's configs changed: update this test"
    exec(compile(small, str(README), "exec"), {"__name__": "readme"})
    assert capsys.readouterr().out.strip()


def test_the_drafter_table_lists_every_kind_the_parser_takes():
    """The README's `--drafter` table is the parser's table (drafters/spec.py): every kind, as its
    syntax reads, and nothing else."""
    from specdec.drafters.spec import DRAFTER_KINDS

    text = README.read_text()
    table = text[text.index("| drafter | what proposes the tokens |"):]
    table = table[:table.index("\n\n")]
    listed = set(re.findall(r"`([a-z0-9-]+(?::[A-Z]+|\[:[A-Z,.]+\])?)`", table))
    assert listed == set(DRAFTER_KINDS)


def test_the_readme_stays_short():
    """The README is what a user reads first (issue 55): at most 2,000 words, as `wc -w` counts them;
    the details live in docs/."""
    assert len(README.read_text().split()) <= 2000


def test_the_readme_lists_the_models_the_loader_runs():
    """The README's list of what runs is the loader's own (`gguf_convert.RUNS`, which its refusal of
    another architecture quotes too)."""
    from specdec.runtime.gguf_convert import RUNS

    text = " ".join(README.read_text().split())
    assert f"Any Llama-family GGUF runs as it is stored: {RUNS}; other architectures are refused by name." in text
