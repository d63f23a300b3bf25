"""The command line: bad input gives one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import re

import pytest

from conftest import make_tiny_model
from specdec.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def run_json(capsys, *argv) -> tuple[dict, str]:
    """A command with --json: standard output is exactly one JSON line (it pipes into jq); the
    tables and messages went to standard error. Returns (the JSON, standard error)."""
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    assert out.count("\n") == 1 and out.endswith("\n"), f"stdout holds more than the JSON line: {out!r}"
    return json.loads(out), err


@pytest.mark.parametrize("argv,message", [
    (["generate", "   "], "prompt is empty"),
    (["generate", "hi", "--gamma", "0"], "gamma"),
    (["generate", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "hi", "--top-p", "0"], "top_p"),
    (["generate", "hi", "--top-p", "1.5"], "top_p"),
    (["generate", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
    (["generate", "hi", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["generate", "hi", "--model", "/nonexistent/model.gguf"], "does not exist"),
    (["generate", "hi", "--dtype", "float8"], "unknown dtype"),
    (["generate", "hi", "--runtime", "jax"], "unknown runtime"),
    (["generate", "hi", "--gamma", "two"], "gamma must be 'auto' or a whole number >= 1, got 'two'"),
    (["generate", "hi", "--max-gamma", "40"], "max_gamma must be a whole number in [1, 16]"),
    (["costs", "--max-gamma", "0"], "--max-gamma must be in [1, 16]"),
    (["plan", "--alpha", "1.5", "--c", "0.1"], "alpha"),
    (["plan", "--alpha", "0.5", "--c", "-1"], "c (draft cost"),
    (["load-test", "--shared-prefix", "/nonexistent/prefix.txt"], "--shared-prefix /nonexistent/prefix.txt: cannot read it"),
])
def test_bad_arguments(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code in (1, 2)
    assert message in err


def test_corrupt_model_file(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    code, _, err = run(capsys, "generate", "hi", "--model", str(bad))
    assert code == 1 and "not a readable GGUF file" in err


def test_folder_without_weights_and_pickles_refused(capsys, tmp_path):
    folder = make_tiny_model(tmp_path / "m", "llama")
    for weights in folder.glob("*.safetensors"):
        weights.rename(weights.with_suffix(".bin"))  # what a pickled checkpoint would be called
    code, _, err = run(capsys, "generate", "hi", "--model", str(folder), "--drafter", "none")
    assert code == 1 and "no .safetensors weights" in err


def test_draft_model_with_another_vocabulary(capsys, tmp_path, tiny_folder):
    other = make_tiny_model(tmp_path / "other", "llama", vocab_size=80)
    code, _, err = run(capsys, "generate", "t5 t6", "--model", str(tiny_folder), "--drafter", f"draft:{other}")
    assert code == 1 and "share the target's tokenizer" in err


def test_prompt_longer_than_the_context(capsys, tmp_path):
    short = make_tiny_model(tmp_path / "short", "llama", max_positions=32)
    code, _, err = run(capsys, "generate", " ".join(["t5"] * 40), "--model", str(short), "--raw")
    assert code == 1 and "context holds 32" in err


@pytest.mark.parametrize("spec,message", [("early:0", "exit layer must be in [1, 1]"), ("early:x", "early:L needs")])
def test_bad_early_exit_layer(capsys, tiny_folder, spec, message):
    code, _, err = run(capsys, "generate", "t5", "--model", str(tiny_folder), "--drafter", spec)
    assert code == 1 and message in err


def test_unknown_drafter(capsys, tiny_folder):
    code, _, err = run(capsys, "generate", "t5", "--model", str(tiny_folder), "--drafter", "magic")
    assert code == 1 and "unknown drafter 'magic'" in err


def generate_compare(capsys, folder, drafter: str, max_new_tokens: int, *extra: str) -> tuple[dict, str]:
    """`specdec generate --compare --json` on a repetitive prompt: (the JSON line, everything else printed)."""
    return run_json(capsys, "generate", "t5 t9 t12 t7 t5 t9 t12 t7 t5", "--model", str(folder), "--raw",
                    "--drafter", drafter, "--max-new-tokens", str(max_new_tokens), "--compare", *extra)


def test_generate_compare_reports_identical_greedy_output(capsys, tiny_folder):
    result, err = generate_compare(capsys, tiny_folder, "ngram", 30)
    assert result["identical"] is True
    assert result["speculative"]["new_tokens"] == result["plain"]["new_tokens"]
    assert "speed-up" in err and result["text"] in err  # the streamed text and the tables: on standard error



def test_generate_compare_does_not_draft_from_its_own_earlier_run(capsys, tiny_folder, monkeypatch):
    """`--compare` runs the prompt three times (a warm-up, the streamed run, the timed one). A suffix
    drafter learns each answer; the timed run must draft as the first did, not from the answer before
    (it measured a cache hit: α = 1.00 and 2.4× on the default model). The reported run drafts
    exactly as a single run does. Control: learning as it comes, the timed run accepts more."""
    from contextlib import nullcontext

    from specdec.decode.engine import Engine

    def accepted(*extra) -> int:
        result, _ = run_json(capsys, "generate", "t5 t9 t12", "--model", str(tiny_folder), "--raw",
                             "--drafter", "suffix", "--gamma", "3", "--max-new-tokens", "24", *extra)
        return result["speculative"]["accepted"]

    alone = accepted()
    assert accepted("--compare") == alone
    monkeypatch.setattr(Engine, "learning_held", lambda self: nullcontext())
    assert accepted("--compare") > alone

def test_generate_auto_reports_the_policy_and_predicted_vs_measured(capsys, tiny_folder):
    # γ fixed: the policy still picks the drafter each round, but always drafts (on a tiny model, whose
    # passes cost about as much as the Python around them, γ = auto may rightly decide not to)
    result, err = generate_compare(capsys, tiny_folder, "auto:ngram,suffix", 40, "--gamma", "3")
    assert result["identical"] is True and result["breakdown"]
    assert result["speculative"]["drafter"] == "auto(ngram,suffix)"
    assert result["speculative"]["decisions"][0]["reason"].startswith(("best predicted", "probe", "below 1×", "plain:"))
    for row in result["breakdown"]:
        assert row["baseline"] == "plain run" and row["predicted_speedup"] > 0 and row["measured_speedup"] > 0
    assert "  model  costed  its rounds" in err  # the models' figures beside its rounds' measured rate


def test_costs_command_measures_then_reads_the_cache(capsys, tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_COSTS_DIR", str(tmp_path))
    costs = ("costs", "--model", str(tiny_folder), "--drafter", "auto:ngram,suffix", "--max-gamma", "4")
    first, err = run_json(capsys, *costs)
    assert sorted(first["pass_seconds"], key=int) == ["1", "2", "3", "4", "5"]
    assert set(first["draft_costs"]) == {"ngram", "suffix"}
    assert "measuring this machine's costs" in err  # the first measurement says what it is doing
    again, err = run_json(capsys, *costs)
    assert again == first and "measuring" not in err  # read back, not measured again
    remeasured, _ = run_json(capsys, *costs, "--remeasure")
    assert remeasured["description"]["model"] == first["description"]["model"]
    code, out, err = run(capsys, *costs)  # without --json: the tables on standard output, no JSON
    assert code == 0 and "target passes" in out and "{" not in out


def test_plan_prints_the_seed_formulas(capsys):
    result, err = run_json(capsys, "plan", "--alpha", "0.8", "--c", "0.1", "--max-gamma", "8")
    assert "best γ in 1..8: 6" in err
    assert result["rows"][3] == {"gamma": 4, "tokens_per_pass": 3.3616, "speedup": 2.4011}
    assert result["best_gamma"] == 6


def test_chat_two_turns(capsys, monkeypatch, tiny_folder):
    """A chat with a model that has no chat template is refused clearly; with a template it runs turns."""
    folder = tiny_folder
    answers = iter(["t5 t6"])
    monkeypatch.setattr("rich.console.Console.input", lambda self, prompt="": next(answers))
    code, _, err = run(capsys, "chat", "--model", str(folder))
    assert code == 1 and "needs a model with a chat template" in err and "specdec generate --raw PROMPT" in err
    assert "--chat-template" in err
    answers = iter(["t5 t6 t7", "/exit"])  # a template given on the command line: the chat runs
    template_file = folder.parent / "turns.jinja"
    template_file.write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}")
    code, out, _ = run(capsys, "chat", "--model", str(folder), "--max-new-tokens", "5", "--chat-template", str(template_file))
    assert code == 0 and out.count("tokens, MAT") == 1
    code, _, err = run(capsys, "chat", "--model", str(folder), "--chat-template", "missing.jinja")
    assert code != 0 and "--chat-template missing.jinja: neither a template name" in err and "Traceback" not in err
    template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    (folder / "chat_template.jinja").write_text(template)
    try:
        answers = iter(["t5 t6 t7", "/help", "/reest", "/reset", "t8 t9", "/exit"])
        monkeypatch.setattr("rich.console.Console.input", lambda self, prompt="": next(answers))
        code, out, _ = run(capsys, "chat", "--model", str(folder), "--max-new-tokens", "5")
        assert code == 0
        assert out.count("tokens, MAT") == 2  # /help, the typo and /reset were not sent to the model
        assert "anything else is sent to the model" in out and "unknown command /reest" in out
        assert "conversation cleared" in out
        answers = iter(["t5 t6 t7", "t8 t9", "/exit"])  # the second turn prefills only what the first did not
        code, out, _ = run(capsys, "chat", "--model", str(folder), "--max-new-tokens", "5")
        kept = [int(n) for n in re.findall(r"tokens, (\d+) of them kept from before", out)]
        assert code == 0 and len(kept) == 2 and kept[0] == 0 and kept[1] >= 3, out

        from specdec.decode.engine import Engine

        stream = Engine.stream

        def interrupted(self, prompt_ids, config):  # Ctrl-C after the first round's tokens
            events = stream(self, prompt_ids, config)
            yield next(events)
            raise KeyboardInterrupt

        monkeypatch.setattr(Engine, "stream", interrupted)
        answers = iter(["t5 t6 t7", "t8 t9", "/exit"])
        code, out, _ = run(capsys, "chat", "--model", str(folder), "--max-new-tokens", "5")
        assert code == 0 and out.count("stopped: the conversation keeps what was written") == 2, out
    finally:
        (folder / "chat_template.jinja").unlink()


def test_corrupt_safetensors_in_a_folder(capsys, tmp_path):
    folder = make_tiny_model(tmp_path / "m", "llama")
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"\x00garbage" * 10)
    code, _, err = run(capsys, "generate", "t5", "--model", str(folder), "--drafter", "none")
    assert code == 1 and "not a readable safetensors file" in err


def test_ngram_1_is_accepted_as_documented(capsys, tiny_folder):
    result, _ = run_json(capsys, "generate", "t5 t9 t5 t9 t5", "--model", str(tiny_folder), "--raw",
                         "--drafter", "ngram:1", "--max-new-tokens", "8")
    assert result["speculative"]["drafter"] == "ngram:1-1"


def modules_entered_again(stack: list[str]) -> list[str]:
    """The modules a call stack (outermost first) leaves and then enters again."""
    runs = [name for i, name in enumerate(stack) if i == 0 or stack[i - 1] != name]
    return sorted({name for name in runs if runs.count(name) > 1})


def test_the_drafter_spec_goes_from_the_command_line_to_the_drafter_through_each_module_once(capsys, tiny_folder,
                                                                                             monkeypatch):
    """`--drafter auto:suffix` from `specdec generate` to the drafter's constructor: the call stack there
    passes each of specdec's modules once (cli → options → drafters.build → drafters.suffix), no module
    left and entered again. Control: a stack that goes back into a module it left is caught."""
    import inspect

    from specdec.drafters import suffix

    stacks = []
    constructor = suffix.SuffixDrafter.__init__

    def recording(self, *args, **kwargs):
        stacks.append([frame.frame.f_globals.get("__name__", "") for frame in reversed(inspect.stack()[1:])])
        constructor(self, *args, **kwargs)

    monkeypatch.setattr(suffix.SuffixDrafter, "__init__", recording)
    run_json(capsys, "generate", "t5 t9", "--model", str(tiny_folder), "--raw", "--max-new-tokens", "2",
             "--drafter", "auto:suffix")
    [stack] = stacks
    ours = [name for name in stack if name.startswith("specdec")]
    assert ours[0] == "specdec.cli" and ours[-1] == "specdec.drafters.suffix", ours
    assert modules_entered_again(ours) == [], ours
    assert modules_entered_again(["specdec.cli", "specdec.drafters", "specdec.drafters.build", "specdec.drafters",
                                  "specdec.drafters.suffix"]) == ["specdec.drafters"]


@pytest.mark.parametrize("command", ["generate", "chat", "costs", "serve", "explain", "bench", "load-test"])
def test_drafter_help_names_every_drafter(capsys, command):
    """Every command that takes --drafter names every kind of the one list (eagle3 and eagle3-chain were
    missing from all of them); a command without --drafter is skipped, not passed."""
    from specdec.drafters.spec import DRAFTER_KINDS

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps the help, even inside a spec
    if "--drafter" not in text:
        pytest.skip(f"{command} takes no --drafter")
    for spec in DRAFTER_KINDS:
        assert spec in text, (command, spec)


def test_version_and_a_prompt_from_standard_input(capsys, tiny_folder, monkeypatch):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("specdec ")
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("t5 t9 t5 t9 t5"))
    result, _ = run_json(capsys, "generate", "-", "--model", str(tiny_folder), "--raw", "--max-new-tokens", "4",
                         "--drafter", "none")
    assert result["speculative"]["new_tokens"] == 4


@pytest.mark.parametrize("command", [["generate", "t5"], ["bench", "--prompts", "starter"], ["costs"]])
def test_a_misspelt_drafter_fails_before_the_model_loads(capsys, tmp_path, command, monkeypatch):
    """The drafter spec is checked first: with a model that does not exist, the error is the drafter's
    (before, generate loaded the model for 15 s and only then refused the drafter)."""
    import specdec.runtime.loading

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the drafter spec was checked")

    monkeypatch.setattr(specdec.runtime.loading, "load_model", no_loading)
    monkeypatch.setattr(specdec.runtime, "load_model", no_loading)
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, *command, "--model", str(tmp_path / "missing-model"), "--drafter", "auto:ngram,sufix")
    assert code == 1 and "unknown drafter 'auto:ngram,sufix'; did you mean 'suffix'?" in err


def test_a_misspelt_drafter_gets_a_suggestion(capsys, tiny_folder):
    code, _, err = run(capsys, "generate", "t5", "--model", str(tiny_folder), "--drafter", "sufix")
    assert code == 1 and "did you mean 'suffix'?" in err


@pytest.mark.parametrize("argv,where", [(["generate", "t5", "--gamma", "x"], "specdec generate"),
                                        (["bench", "--repeats"], "specdec bench"), (["nosuch"], "specdec")])
def test_usage_errors_point_at_the_commands_own_help(capsys, argv, where):
    code, _, err = run(capsys, *argv)
    assert code == 2 and err.startswith(f"{where}: error: ") and f"(see {where} --help)" in err


@pytest.mark.parametrize("argv,message", [
    (["generate", "t5", "--max-new", "4"], "unrecognized arguments: --max-new 4"),  # argparse took it for --max-new-tokens
    (["load-test", "--clients", "0"], "argument --clients: takes a whole number >= 1, got '0'"),
    (["load-test", "--requests", "-3"], "argument --requests: takes a whole number >= 1, got '-3'"),
    (["load-test", "--curve", "1,2", "--requests-per-client", "0"], "argument --requests-per-client: takes a whole number >= 1"),
])
def test_abbreviations_and_counts_below_one_are_refused(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


@pytest.fixture
def no_loading(monkeypatch):
    """Any model load fails the test: what is checked before it must fail first."""
    import specdec.runtime.loading

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before a cheap argument was checked")

    monkeypatch.setattr(specdec.runtime.loading, "load_model", refuse)
    monkeypatch.setattr(specdec.runtime, "load_model", refuse)


def test_serve_on_a_busy_port_fails_before_the_model_loads(capsys, no_loading):
    """Before, `serve` loaded for 15 s, printed 'serving … on http://…' and then died in uvicorn."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out, err = run(capsys, "serve", "--port", str(port))
    assert code == 1 and f"cannot listen on 127.0.0.1:{port}: Address already in use" in err and "--port" in err
    assert "serving" not in out
    code, _, err = run(capsys, "serve", "--host", "no-such-host.invalid", "--port", "8000")
    assert code == 1 and "--host no-such-host.invalid: not an address to listen on" in err


@pytest.mark.parametrize("argv,message", [
    (["train", "eagle3", "--data", "{tmp}/data", "--out", "{tmp}/head", "--init", "{tmp}/no-head"], "--init {tmp}/no-head: no trained head there"),
    (["train", "eagle3", "--data", "{tmp}/data", "--out", "{tmp}/head", "--more-data", "{tmp}/none"], "--more-data {tmp}/none: no self-distillation data there"),
    (["train", "data", "--data", "{tmp}/data", "--passages", "{tmp}/none"], "--passages {tmp}/none: {tmp}/none holds no self-distillation data"),
    (["train", "data", "--data", "{tmp}/data", "--follow-ups", "{tmp}/none"], "--follow-ups {tmp}/none: {tmp}/none holds no self-distillation data"),
    (["train", "data", "--data", "{tmp}/file"], "--data {tmp}/file is a file"),
    (["train", "medusa", "--data", "{tmp}/data", "--out", "{tmp}/file"], "--out {tmp}/file is a file"),
    (["train", "data", "--data", "{tmp}/data", "--passages", "{tmp}/data"], "--passages must name another data folder"),
])
def test_train_checks_its_folders_before_the_model_loads(capsys, tmp_path, no_loading, argv, message):
    (tmp_path / "data").mkdir()
    (tmp_path / "file").write_text("")
    code, _, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert code == 1 and message.format(tmp=tmp_path) in err


def test_export_checks_its_out_folder_before_reading_the_head(capsys, tmp_path, monkeypatch):
    from specdec.export import source

    def refuse(*args, **kwargs):
        raise AssertionError("the head was read before --out was checked")

    monkeypatch.setattr(source, "read_head", refuse)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kept.txt").write_text("")
    code, _, err = run(capsys, "export", "eagle3", "--format", "vllm", "-o", str(tmp_path / "out"))
    assert code == 1 and "is not empty; choose an empty folder or pass --force" in err


@pytest.mark.parametrize("command,main_name,aliases,dest", [
    (["bench"], "--out", ["--out-dir", "-o"], "out_dir"),
    (["explain", "t5"], "--out", ["-o", "--output"], "output"),
    (["train", "eagle3", "--data", "d"], "--out", ["-o"], "out"),
    (["export", "eagle3", "--format", "vllm"], "--out", ["-o"], "out"),
    (["load-test"], "--out", ["-o"], "out"),
    (["load-test"], "--max-new-tokens", ["--max-tokens"], "max_tokens"),
    (["load-test"], "--endpoint", ["--url"], "url"),
    (["load-test"], "--served-model", ["--model"], "model"),
    (["train", "eagle3", "--data", "d"], "--examples", ["--prompts"], "prompts"),
])
def test_one_name_per_option_with_the_old_names_kept(capsys, command, main_name, aliases, dest):
    """Every command calls an output path --out and a count of new tokens --max-new-tokens; the
    names they had before still work, and the help shows the main name first."""
    from specdec.cli import build_parser

    parser = build_parser()
    for name in [main_name, *aliases]:
        assert str(getattr(parser.parse_args([*command, name, "7"]), dest)) == "7"
    with pytest.raises(SystemExit):
        main([*command[:1], "--help"])
    assert f"  {main_name} " in capsys.readouterr().out


@pytest.fixture
def torch_threads():
    """The test may change torch's thread count: it is put back after."""
    import torch

    before = torch.get_num_threads()
    yield torch
    torch.set_num_threads(before)


def test_threads_are_set_before_the_model_loads_and_counted_from_the_cores_this_process_may_use(
        capsys, tiny_folder, torch_threads, monkeypatch):
    """`--threads N` sets the passes' threads for every model command; without it, the cores of this
    process's affinity (a container's share), not the machine's count. More threads than cores runs,
    with a warning; 0 is refused. Control: the count seen by the command is the one asked for."""
    import specdec.options
    from specdec.cli import build_parser

    for command in (["generate", "hi"], ["chat"], ["costs"], ["bench"], ["serve"], ["explain", "hi"],
                    ["train", "eagle3", "--data", "d", "--out", "o"]):
        assert build_parser().parse_args([*command, "--threads", "3"]).threads == 3, command
    code, _, err = run(capsys, "generate", "hi", "--threads", "0")
    assert code == 2 and "argument --threads: takes a whole number >= 1, got '0'" in err

    seen = []
    monkeypatch.setattr(specdec.options, "cores_available", lambda: 1)
    for threads, expected, warned in ((["--threads", "1"], 1, False), ([], 1, False), (["--threads", "2"], 2, True)):
        result, err = run_json(capsys, "generate", "t5 t9", "--model", str(tiny_folder), "--raw", "--drafter", "none",
                               "--max-new-tokens", "2", *threads)
        seen.append(torch_threads.get_num_threads())
        assert ("more than the 1 cores this process may use" in err) == warned, err
    assert seen == [1, 1, 2]
