"""`specdec explain PROMPT --out run.html`: run once with the trace on, then write the page."""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.errors import SpecdecError
from specdec.options import add_json_arg, add_model_args, generation_config, load_engine, prepare_costs, warm_up
from specdec.terminal import plural


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", help="the prompt text")
    add_model_args(p)
    p.add_argument("--raw", action="store_true", help="use the prompt as plain text, without the chat template")
    p.add_argument("--out", "-o", "--output", dest="output", default="explain.html", metavar="FILE",
                   help="the HTML file to write (default: explain.html)")
    p.add_argument("--no-compare", action="store_true", help="skip the plain-decoding run that measures the speed-up")
    add_json_arg(p, "the run's summary")


def build_page_data(engine, prompt_ids: list[int], config, compare: bool, meta: str) -> dict:
    """Run with the trace on (and plain decoding after it, to measure the speed-up: traced too, so
    that both runs pay for the trace alike); the page's data."""
    from dataclasses import replace

    from specdec.decode.engine import Engine
    from specdec.explain.summary import run_summary

    traced = replace(config, trace=True)
    result = engine.generate(prompt_ids, traced)
    plain = Engine(engine.target).generate(prompt_ids, traced) if compare else None
    costs = engine.costs(config.max_gamma) if engine.drafters else None
    return {
        "meta": meta,
        "prompt_text": engine.target.tokenizer.decode(prompt_ids, skip_special_tokens=False),
        "greedy": config.sampling.greedy,
        "text": result.text,
        "rounds": [r.to_dict() for r in result.rounds],
        "summary": run_summary(result.stats, costs, plain.stats if plain else None),
    }


def run(args, console) -> int:
    import json

    from specdec.decode.engine import require_prompt_text
    from specdec.explain.page import render_page

    require_prompt_text(args.prompt)
    output = Path(args.output).expanduser()
    if output.suffix.lower() not in (".html", ".htm"):
        raise SpecdecError(f"--out should be an .html file, got '{output}'")
    if not output.parent.is_dir():
        raise SpecdecError(f"the folder for --out does not exist: {output.parent}")
    config = generation_config(args)
    engine = load_engine(args, console)
    target = engine.target
    prompt_ids = engine.encode(args.prompt, chat=not args.raw)
    prepare_costs(engine, config, console)
    if not args.no_compare:
        warm_up(engine, prompt_ids, config)
    sampling = "greedy" if config.sampling.greedy else f"temperature {config.sampling.temperature}"
    meta = f"{target.name} · drafter {engine.name} · γ {args.gamma} · {sampling} · max {config.max_new_tokens} new tokens"
    with console.status("generating with the trace on" + ("" if args.no_compare else ", then plainly to compare")):
        data = build_page_data(engine, prompt_ids, config, not args.no_compare, meta)
    output.write_text(render_page(data), encoding="utf-8")
    s = data["summary"]
    speedup = f", speed-up {s['speedup']:.2f}×" if s["speedup"] is not None else ""
    console.print(f"{plural(len(data['rounds']) - 1, 'round')}, {plural(s['new_tokens'], 'token')}, MAT {s['mat']:.2f}, "
                  f"α {s['alpha']:.2f}{speedup}; wrote {output}", highlight=False)
    if args.json:
        print(json.dumps({"output": str(output), "summary": s}))
    return 0
