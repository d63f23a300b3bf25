"""`specdec train eagle|medusa|draft`: self-distillation data from the target, then a drafter trained on it.

    specdec train eagle --model smollm2-135m --data distill-data --out my-eagle
    specdec generate "..." --drafter eagle:my-eagle       (or eagle-tree:my-eagle)
    specdec train medusa --model smollm2-135m --data distill-data --out my-medusa
    specdec generate "..." --drafter medusa:my-medusa
    specdec train draft --model smollm2-135m --data distill-data --out my-draft --layers 4
    specdec generate "..." --drafter draft:my-draft

Both steps resume: the data is written in shards (a stopped run continues after the last complete
one), training keeps a checkpoint (model and optimiser, safetensors) every few steps and at the end
of each epoch, outside the output folder (`--checkpoint-dir`, default: a folder of the specdec cache
named after --out; printed when training starts) and deleted once the result is written. The
instructions come from a template generator (`instructions.py`), never from a benchmark set.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.errors import SpecdecError

KINDS = ("eagle", "medusa", "draft")
DEFAULT_LR = {"eagle": 1e-3, "medusa": 1e-3, "draft": 2e-4}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=KINDS, help="what to train")
    p.add_argument("--model", "--target", dest="model", default="smollm2-135m",
                   help="the target: built-in name, Hugging Face folder or .gguf file")
    p.add_argument("--data", required=True, type=Path, help="folder for the self-distillation data (made or resumed)")
    p.add_argument("--out", required=True, type=Path,
                   help="folder for the head (head.safetensors, head.json) or the draft model")
    p.add_argument("--checkpoint-dir", type=Path,
                   help="folder for the training checkpoints, deleted once the result is written; run the same "
                        "command again to resume a stopped training (default: a folder under the specdec cache "
                        "named after --out)")
    p.add_argument("--prompts", type=int, default=2048, help="instructions to answer for the data (default 2048)")
    p.add_argument("--max-new-tokens", type=int, default=192, help="longest answer in the data (default 192)")
    p.add_argument("--batch-size", type=int, default=32, help="answers generated together (default 32)")
    p.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head may propose: the most frequent (default 8192)")
    p.add_argument("--depth", type=int, default=3, help="eagle: draft steps unrolled in training (default 3)")
    p.add_argument("--heads", type=int, default=4, help="medusa: number of heads, i.e. tokens guessed ahead (default 4)")
    p.add_argument("--layers", type=int, help="draft: the target's first layers the draft starts from "
                   "(default: a quarter of them, as early:L)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, help="peak learning rate (default: 1e-3 for heads, 2e-4 for a draft model)")
    p.add_argument("--seed", type=int, default=0, help="seeds the instructions, the split and the training")
    p.add_argument("--device", default="cpu")


def check(args) -> None:
    for name in ("prompts", "max_new_tokens", "batch_size", "draft_vocab", "depth", "heads", "epochs"):
        if getattr(args, name) < 1:
            raise SpecdecError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.layers is not None and args.layers < 1:
        raise SpecdecError(f"--layers must be at least 1, got {args.layers}")
    if args.lr is not None and not args.lr > 0:
        raise SpecdecError(f"--lr must be positive, got {args.lr}")


def run(args, console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from specdec.runtime import load_model
    from specdec.train.distill import distill
    from specdec.train.draft import train_draft
    from specdec.train.eagle import train_eagle
    from specdec.train.instructions import instructions
    from specdec.train.loop import default_checkpoint_dir
    from specdec.train.medusa import train_medusa

    check(args)
    with console.status(f"loading {args.model}"):
        target = load_model(args.model, device=args.device)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[note]}"),
               TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("answers", total=args.prompts, note="")
        meta = distill(target, instructions(args.prompts, seed=args.seed), args.data, max_new_tokens=args.max_new_tokens,
                       batch_size=args.batch_size, progress=lambda done, total: progress.update(task, completed=done))
    console.print(f"data: {meta['sequences']} sequences, {meta['answer_tokens']} answer tokens in {args.data}")
    checkpoints = args.checkpoint_dir or default_checkpoint_dir(args.out)
    console.print(f"checkpoints: {checkpoints} (deleted once the result is written; if stopped, run the same command "
                  "to resume)", highlight=False, soft_wrap=True)  # soft_wrap: the path on one line, to copy
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("training", total=None, note="")

        def on_step(step: int, total: int, loss: float) -> None:
            progress.update(task, completed=step, total=total, note=f"loss {loss:.3f}")

        common = dict(epochs=args.epochs, lr=args.lr or DEFAULT_LR[args.kind], seed=args.seed,
                      checkpoint_dir=checkpoints, progress=on_step, log=console.print)
        if args.kind == "draft":
            info = train_draft(target, args.data, args.out, layers=args.layers, **common)
        elif args.kind == "eagle":
            info = train_eagle(target, args.data, args.out, depth=args.depth, draft_vocab=args.draft_vocab, **common)
        else:
            info = train_medusa(target, args.data, args.out, num_heads=args.heads, draft_vocab=args.draft_vocab, **common)
    last = info["history"][-1]
    if args.kind == "draft":
        before = info["before"]
        console.print(f"draft model ({info['layers']} layers) written to {args.out}: validation acceptance greedy "
                      f"{before['alpha_greedy']} → {last['alpha_greedy']}, at temperature 1 {before['alpha_t1']} → "
                      f"{last['alpha_t1']} (the target cut to its first layers → distilled)")
    else:
        console.print(f"{args.kind} head written to {args.out}: validation α per depth {last['alpha_per_depth']}, "
                      f"chain MAT {last['chain_mat']}; draft vocabulary covers {info['draft_vocab_coverage']:.1%} of "
                      "answer tokens")
    drafter = {"eagle": f"eagle-tree:{args.out}", "medusa": f"medusa:{args.out}", "draft": f"draft:{args.out}"}[args.kind]
    console.print(f"use it with: specdec generate \"...\" --model {args.model} --drafter {drafter}")
    return 0
