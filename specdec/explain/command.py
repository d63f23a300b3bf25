"""`specdec explain PROMPT -o run.html`: run once with the trace on, then write the page."""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.errors import SpecdecError


def add_arguments(p: argparse.ArgumentParser, model_args) -> None:
    p.add_argument("prompt", help="the prompt text")
    model_args(p)
    p.add_argument("--raw", action="store_true", help="use the prompt as plain text, without the chat template")
    p.add_argument("-o", "--output", default="explain.html", help="the HTML file to write (default: explain.html)")
    p.add_argument("--no-compare", action="store_true", help="skip the plain-decoding run that measures the speed-up")


def build_page_data(engine, prompt_ids: list[int], config, compare: bool, meta: str) -> dict:
    """Run with the trace on (and plain decoding after it, to measure the speed-up); the page's data."""
    from dataclasses import replace

    from specdec.engine import Engine
    from specdec.explain.summary import run_summary

    result = engine.generate(prompt_ids, replace(config, trace=True))
    plain = Engine(engine.target).generate(prompt_ids, config) if compare else None
    costs = engine.costs(config.max_gamma) if engine.drafters else None
    return {
        "meta": meta,
        "prompt_text": engine.target.tokenizer.decode(prompt_ids, skip_special_tokens=False),
        "greedy": config.sampling.greedy,
        "text": result.text,
        "rounds": [r.to_dict() for r in result.rounds],
        "summary": run_summary(result.stats, costs, plain.stats if plain else None),
    }


def run(args, console, load, configs, prepare) -> int:
    from specdec.engine import GenerationConfig, require_prompt_text
    from specdec.explain.page import render_page

    require_prompt_text(args.prompt)
    output = Path(args.output).expanduser()
    if output.suffix.lower() not in (".html", ".htm"):
        raise SpecdecError(f"--output should be an .html file, got '{output}'")
    if not output.parent.is_dir():
        raise SpecdecError(f"the folder for --output does not exist: {output.parent}")
    config = configs(args)
    target, _, engine = load(args, console)
    prompt_ids = engine.encode(args.prompt, chat=not args.raw)
    prepare(engine, config, console)
    if not args.no_compare:  # warm up both paths so that neither pays first-call costs
        engine.generate(prompt_ids, GenerationConfig(max_new_tokens=4, gamma=args.gamma, max_gamma=args.max_gamma,
                                                     sampling=config.sampling))
    sampling = "greedy" if config.sampling.greedy else f"temperature {config.sampling.temperature}"
    meta = f"{target.name} · drafter {engine.name} · γ {args.gamma} · {sampling} · max {config.max_new_tokens} new tokens"
    with console.status("generating with the trace on" + ("" if args.no_compare else ", then plainly to compare")):
        data = build_page_data(engine, prompt_ids, config, not args.no_compare, meta)
    output.write_text(render_page(data), encoding="utf-8")
    s = data["summary"]
    speedup = f", speed-up {s['speedup']:.2f}×" if s["speedup"] is not None else ""
    console.print(f"{len(data['rounds']) - 1} rounds, {s['new_tokens']} tokens, MAT {s['mat']:.2f}, α {s['alpha']:.2f}"
                  f"{speedup}; wrote {output}", highlight=False)
    return 0
