"""`specdec train data|eagle3|eagle|medusa|draft`: self-distillation data from the target, then a
drafter trained on it.

    specdec train data --model smollm2-135m --data distill-data --examples 10500      (the data only)
    specdec train eagle3 --model smollm2-135m --data distill-data --out my-eagle3
    specdec generate "..." --drafter eagle3:my-eagle3
    specdec train eagle --model smollm2-135m --data distill-data --out my-eagle
    specdec generate "..." --drafter eagle:my-eagle       (or eagle-tree:my-eagle)
    specdec train medusa --model smollm2-135m --data distill-data --out my-medusa
    specdec train draft --model smollm2-135m --data distill-data --out my-draft --layers 4

Long-input tasks (summaries, answers from a text, retrieval over documents) made from the target's
own answers in a first data folder, then a head trained further on both:

    specdec train data --data long-data --passages distill-data --examples 2000
    specdec train eagle3 --data distill-data --more-data long-data --max-len 1024 --init my-eagle3 --out my-eagle3-long

Two-turn conversations (an earlier instruction, the target's answer, a follow-up request):

    specdec train data --data turns-data --follow-ups distill-data --examples 1500

Both steps resume: the data is written in shards (a stopped run continues after the last complete
one), training keeps a checkpoint (model and optimiser, safetensors) every few steps and at the end
of each epoch, outside the output folder (`--checkpoint-dir`, default: a folder of the specdec cache
named after --out; printed when training starts) and deleted once the result is written. For a
run in the background, `--progress-file` keeps one JSON line with where it is (phase, done, total,
rates, time left). The instructions come from two template generators (`instructions.py`, and
`instructions_v2.py`: the default, `--instructions 1` for the first) or from the target's own
earlier answers (`--passages`, `--follow-ups`), never from a benchmark set.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.heads.eagle3 import default_aux_layers
from specdec.options import add_threads_arg
from specdec.terminal import plural

KINDS = ("data", "eagle3", "eagle", "medusa", "draft")
DEFAULT_LR = {"eagle3": 1e-3, "eagle": 1e-3, "medusa": 1e-3, "draft": 2e-4}
DEFAULT_TEMPERATURES = "0,0.7,0,1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=KINDS, help="what to make: the data only, or a drafter (after making or resuming the data)")
    p.add_argument("--model", "--target", dest="model", default="smollm2-135m",
                   help="the target: built-in name, Hugging Face folder or .gguf file")
    p.add_argument("--data", required=True, type=Path, help="folder for the self-distillation data (made or resumed)")
    p.add_argument("--out", "-o", type=Path, help="folder for the head (head.safetensors, head.json) or the draft model")
    p.add_argument("--checkpoint-dir", type=Path,
                   help="folder for the training checkpoints, deleted once the result is written; run the same "
                        "command again to resume a stopped training (default: a folder under the specdec cache "
                        "named after --out)")
    p.add_argument("--progress-file", type=Path,
                   help="keep one JSON line here with the run's progress (for a run in the background)")
    p.add_argument("--examples", "--prompts", dest="prompts", type=int, default=2048, metavar="N",
                   help="how many prompts the target answers for the data: instructions, long-input tasks or "
                        "conversations (default 2048; `bench --prompts` is a file of prompts, this a count)")
    p.add_argument("--passages", type=Path, metavar="DATA",
                   help="make long-input tasks instead of the template instructions: summaries, answers from the "
                        "text, retrieval over numbered documents, rewrites and translations of the target's own "
                        "answers in the data folder DATA (made from the template instructions)")
    p.add_argument("--follow-ups", type=Path, metavar="DATA",
                   help="make two-turn conversations instead: an instruction of the data folder DATA, the target's "
                        "answer to it and a follow-up request (simpler, shorter, an example, …)")
    p.add_argument("--instructions", type=int, choices=(1, 2),
                   help="which template generator makes the instructions: 1 (explain, list, write, code, arithmetic) "
                        "or 2 (factual questions, word problems, puzzles, German to translate, news to summarize, "
                        "extraction, role play, code to debug); default: the one an existing --data folder was "
                        "made with, else 2")
    p.add_argument("--more-data", type=Path, action="append", default=[], metavar="DATA",
                   help="eagle3: train on this data folder too (already made, with the same aux layers); repeatable")
    p.add_argument("--max-new-tokens", type=int, default=192, help="longest answer in the data (default 192)")
    p.add_argument("--batch-size", type=int, default=16, help="answers generated together (default 16)")
    p.add_argument("--temperatures", default=DEFAULT_TEMPERATURES,
                   help="answer temperatures, used in turn (0 = greedy; default %(default)s: half greedy, half sampled)")
    p.add_argument("--aux-layers", default="auto",
                   help="layers whose input the data keeps for EAGLE-3 (comma-separated; default auto: 2, L/2, L-3 "
                        "as vLLM and SGLang capture; 'none' keeps only the final features)")
    p.add_argument("--draft-vocab", type=int, help="tokens the head may propose: the most frequent (default 8192; "
                                                   "with --init the head's own, or more: all of its own, grown to "
                                                   "this size by the most frequent others)")
    p.add_argument("--depth", type=int, default=3, help="eagle, eagle3: draft steps unrolled in training (default 3)")
    p.add_argument("--heads", type=int, default=4, help="medusa: number of heads, i.e. tokens guessed ahead (default 4)")
    p.add_argument("--layers", type=int, help="draft: the target's first layers the draft starts from "
                   "(default: a quarter of them, as early:L)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-len", type=int, default=384,
                   help="training: sequences are cut to this many tokens (default 384; long-input data needs ~1024)")
    p.add_argument("--init", type=Path, help="eagle3: a trained head to start from (train it further) instead of random weights")
    p.add_argument("--lr", type=float, help="peak learning rate (default: 1e-3 for heads, 2e-4 for a draft model)")
    p.add_argument("--seed", type=int, default=0, help="seeds the instructions, the answers, the split and the training")
    p.add_argument("--device", default="cpu")
    add_threads_arg(p)


def parse_temperatures(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise SpecdecError(f"--temperatures takes comma-separated numbers such as {DEFAULT_TEMPERATURES}, got {text!r}") from None
    if not values or any(not 0 <= v <= 2 for v in values):
        raise SpecdecError(f"--temperatures must lie in [0, 2] (0 = greedy), got {text!r}")
    return values


def aux_layers_for(text: str, num_layers: int) -> tuple[int, ...]:
    """--aux-layers for a target of `num_layers` layers."""
    if text == "none":
        return ()
    if text == "auto":
        return tuple(default_aux_layers(num_layers))
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise SpecdecError(f"--aux-layers takes comma-separated layer numbers, 'auto' or 'none', got {text!r}") from None
    if any(not 0 <= x < num_layers for x in layers) or len(set(layers)) != len(layers):
        raise SpecdecError(f"--aux-layers must be distinct layers in 0..{num_layers - 1}, got {text!r}")
    return layers


def check(args) -> None:
    for name in ("prompts", "max_new_tokens", "batch_size", "draft_vocab", "depth", "heads", "epochs", "max_len"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SpecdecError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.layers is not None and args.layers < 1:
        raise SpecdecError(f"--layers must be at least 1, got {args.layers}")
    if args.lr is not None and not args.lr > 0:
        raise SpecdecError(f"--lr must be positive, got {args.lr}")
    if args.kind != "data" and args.out is None:
        raise SpecdecError(f"`specdec train {args.kind}` needs --out: the folder for what it trains")
    if args.passages is not None and args.follow_ups is not None:
        raise SpecdecError("--passages and --follow-ups each make a data folder of their own; give one of them")
    if args.instructions is not None and (args.passages is not None or args.follow_ups is not None):
        raise SpecdecError("--instructions picks the template generator; --passages and --follow-ups make their "
                           "prompts from a data folder's answers instead: give one or the other")
    for option, value in (("--init", args.init), ("--more-data", args.more_data)):
        if value and args.kind != "eagle3":
            raise SpecdecError(f"{option} is for `specdec train eagle3`, not `specdec train {args.kind}`")
    parse_temperatures(args.temperatures)
    check_paths(args)


def check_paths(args) -> None:
    """The folders named, before the target loads: those read must exist, those written must not be files."""
    read = [("--passages", args.passages), ("--follow-ups", args.follow_ups), ("--init", args.init),
            *(("--more-data", folder) for folder in args.more_data)]
    for option, folder in read:
        if folder is not None and not folder.is_dir():
            if option in ("--passages", "--follow-ups"):  # as distill.answered_instructions says it
                raise SpecdecError(f"{option} {folder}: {folder} holds no self-distillation data (no such folder): "
                                   f"make it with `specdec train data --data {folder}`")
            what = "trained head" if option == "--init" else "self-distillation data"
            raise SpecdecError(f"{option} {folder}: no {what} there (no such folder)")
    for option, folder in (("--data", args.data), ("--out", args.out), ("--checkpoint-dir", args.checkpoint_dir)):
        if folder is not None and folder.exists() and not folder.is_dir():
            raise SpecdecError(f"{option} {folder} is a file; it names a folder")
    for option, folder in read[:2]:
        if folder is not None and folder.resolve() == args.data.resolve():
            raise SpecdecError(f"{option} must name another data folder than --data (the one whose answers it reuses)")


class ProgressFile:
    """One JSON line, rewritten (atomically, at most once a second) with where a long run is."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.last = 0.0

    def write(self, force: bool = False, **fields) -> None:
        if self.path is None or (not force and time.monotonic() - self.last < 1.0):
            return
        self.last = time.monotonic()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"updated": time.strftime("%Y-%m-%dT%H:%M:%S"), **fields}) + "\n")
        tmp.replace(self.path)


def run(args, console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from specdec.runtime import load_model
    from specdec.train.distill import distill
    from specdec.train.loop import default_checkpoint_dir

    check(args)
    with console.status(f"loading {args.model}"):
        target = load_model(args.model, device=args.device)
    aux_layers = aux_layers_for(args.aux_layers, target.net.config.num_layers)
    status = ProgressFile(args.progress_file)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("answers", total=args.prompts, note="")

        def on_answer(done: int, total: int, tokens: int, seconds: float) -> None:
            rate = tokens / seconds if seconds else 0.0
            progress.update(task, completed=done, note=f"{rate:.0f} answer tok/s" if tokens else "")
            status.write(force=done == total, phase="data", done=done, total=total, answer_tokens_this_run=tokens,
                         answer_tokens_per_second=round(rate, 1), seconds=round(seconds))

        prompts, source = prompt_list(args, target)
        meta = distill(target, prompts, args.data, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                       temperatures=parse_temperatures(args.temperatures), seed=args.seed, aux_layers=aux_layers,
                       prompt_source=source, progress=on_answer)
    rate = meta["answer_tokens_per_second"]
    console.print(f"data: {meta['sequences']} sequences, {meta['answer_tokens']} answer tokens in {args.data}"
                  + (f" ({meta['answer_tokens_this_run']} made now at {rate} answer tokens/s)" if rate else ""))
    if args.kind == "data":
        return 0
    checkpoints = args.checkpoint_dir or default_checkpoint_dir(args.out)
    console.print(f"checkpoints: {checkpoints} (deleted once the result is written; if stopped, run the same command "
                  "to resume)", highlight=False, soft_wrap=True)  # soft_wrap: the path on one line, to copy
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("training", total=None, note="")
        started = time.monotonic()

        def on_step(step: int, total: int, loss: float) -> None:
            progress.update(task, completed=step, total=total, note=f"loss {loss:.3f}")
            elapsed = time.monotonic() - started
            status.write(force=step == total, phase="training", done=step, total=total, loss=round(loss, 4),
                         seconds=round(elapsed))

        info = train(args, target, checkpoints, on_step, console)
    report(args, info, console)
    return 0


def prompt_list(args, target) -> tuple[list, str]:
    """The prompts to answer and how they were made (kept in the data's meta.json)."""
    from specdec.train.distill import META, answered_instructions
    from specdec.train.instructions import passage_instructions
    from specdec.train.instructions_v2 import follow_up_conversations
    from specdec.train.prompt_source import GENERATORS, instructions_source, source_generator

    if args.passages is None and args.follow_ups is None:
        meta = args.data / META  # an existing folder keeps its generator
        made = source_generator(json.loads(meta.read_text()).get("prompt_source", "")) if meta.is_file() else None
        version = args.instructions or (made[0] if made else 2)
        return GENERATORS[version](args.prompts, seed=args.seed), instructions_source(version, args.seed)
    option, folder = ("--passages", args.passages) if args.passages is not None else ("--follow-ups", args.follow_ups)
    if args.follow_ups is not None and not target.tokenizer.chat_template:
        raise SpecdecError(f"--follow-ups makes conversations, which need a model with a chat template; {args.model} "
                           "has none")
    try:
        if args.passages is not None:
            answered = answered_instructions(folder, target, seed=args.seed)
            return (passage_instructions(answered, args.prompts, seed=args.seed),
                    f"passages({folder.name}: {len(answered)}, seed={args.seed})")
        answered = answered_instructions(folder, target, seed=args.seed, min_tokens=8, ended_only=True)
        return (follow_up_conversations(answered, args.prompts, seed=args.seed),
                f"follow-ups({folder.name}: {len(answered)}, seed={args.seed})")
    except ValueError as e:
        raise SpecdecError(f"{option} {folder}: {e}") from e


def train(args, target, checkpoints: Path, on_step, console) -> dict:
    from specdec.train.draft import train_draft
    from specdec.train.eagle import train_eagle
    from specdec.train.eagle3 import train_eagle3
    from specdec.train.loop import DEFAULT_DRAFT_VOCAB
    from specdec.train.medusa import train_medusa

    vocab = args.draft_vocab or DEFAULT_DRAFT_VOCAB
    common = dict(epochs=args.epochs, lr=args.lr or DEFAULT_LR[args.kind], seed=args.seed, max_len=args.max_len,
                  checkpoint_dir=checkpoints, progress=on_step, log=console.print)
    if args.kind == "draft":
        return train_draft(target, args.data, args.out, layers=args.layers, **common)
    if args.kind == "eagle3":
        return train_eagle3(target, args.data, args.out, depth=args.depth, draft_vocab=args.draft_vocab, init=args.init,
                            more_data=args.more_data, **common)
    if args.kind == "eagle":
        return train_eagle(target, args.data, args.out, depth=args.depth, draft_vocab=vocab, **common)
    return train_medusa(target, args.data, args.out, num_heads=args.heads, draft_vocab=vocab, **common)


def report(args, info: dict, console) -> None:
    last = info["history"][-1]
    if args.kind == "draft":
        before = info["before"]
        console.print(f"draft model ({plural(info['layers'], 'layer')}) written to {args.out}: validation acceptance greedy "
                      f"{before['alpha_greedy']} → {last['alpha_greedy']}, at temperature 1 {before['alpha_t1']} → "
                      f"{last['alpha_t1']} (the target cut to its first layers → distilled)")
    else:
        console.print(f"{args.kind} head written to {args.out}: validation α per depth {last['alpha_per_depth']}, "
                      f"chain MAT {last['chain_mat']}; draft vocabulary covers {info['draft_vocab_coverage']:.1%} of "
                      "answer tokens")
    drafter = {"eagle3": f"eagle3:{args.out}", "eagle": f"eagle-tree:{args.out}", "medusa": f"medusa:{args.out}",
               "draft": f"draft:{args.out}"}[args.kind]
    console.print(f"use it with: specdec generate \"...\" --model {args.model} --drafter {drafter}")
