"""A conversation's turns with and without the prefix cache: the time to each answer's first token.

    python scripts/chat_turns.py --model FILE.gguf --system-tokens 1500 --turns 5 --new-tokens 32

Two engines on one loaded model, one without a prefix cache and one with, hold the same
conversation, turn by turn in turn (who goes first alternates): a system prompt of about
`--system-tokens` tokens (passages from workloads/spec_bench_dev.jsonl's summarization prompts),
then `--turns` user questions (its qa prompts), each turn's prompt the chat template over the whole
history as an OpenAI client resends it. Greedy, plain decoding (no drafter: the prefill is what is
measured), `--new-tokens` per answer. Prints per turn the prompt's tokens, how many the cache gave,
the time to first token of each engine and whether the answers are identical; the last line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dev_texts(category: str) -> list[str]:
    rows = [json.loads(line) for line in (ROOT / "workloads" / "spec_bench_dev.jsonl").read_text().splitlines()]
    return [row["turns"][0] for row in rows if row["category"] == category]


def first_token_seconds(engine, prompt_ids: list[int], config) -> tuple[float, list[int], int]:
    """(seconds to the first committed token, the answer's ids, prompt tokens reused)."""
    began, first, ids, stats = time.perf_counter(), None, [], None
    for event in engine.stream(prompt_ids, config):
        if first is None and any(p.token_ids for p in event.pieces):
            first = time.perf_counter() - began
        ids += [t for p in event.pieces for t in p.token_ids]
        stats = event.stats
    return first, ids, stats.reused_prompt_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--system-tokens", type=int, default=1500)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()

    from specdec.decode.engine import Engine, GenerationConfig
    from specdec.decode.prefix_cache import PrefixCache
    from specdec.runtime import load_model

    target = load_model(args.model)
    tokenizer = target.tokenizer
    system, passages = "", iter(dev_texts("summarization"))
    while len(tokenizer.encode(system)) < args.system_tokens:
        system += next(passages) + "\n\n"
    questions = dev_texts("qa")[:args.turns]
    config = GenerationConfig(max_new_tokens=args.new_tokens, ignore_eos=True)
    engines = {"without": Engine(target), "with": Engine(target, prefix_cache=PrefixCache())}
    Engine(target).generate(tokenizer.encode("Hello"), GenerationConfig(max_new_tokens=4))  # first-call costs
    messages = {name: [{"role": "system", "content": system}] for name in engines}
    rows = []
    print(f"{'turn':>4} {'prompt':>7} {'reused':>7} {'TTFT without':>13} {'TTFT with':>10} identical")
    for turn, question in enumerate(questions, start=1):
        row = {"turn": turn}
        order = list(engines) if turn % 2 else list(reversed(engines))
        answers = {}
        for name in order:
            messages[name].append({"role": "user", "content": question})
            prompt = tokenizer.apply_chat_template(messages[name])
            seconds, ids, reused = first_token_seconds(engines[name], prompt, config)
            answers[name] = ids
            messages[name].append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=True)})
            row[f"ttft_{name}_s"] = round(seconds, 3)
            row["prompt_tokens"] = len(prompt)
            if name == "with":
                row["reused_tokens"] = reused
        row["identical"] = answers["with"] == answers["without"]
        rows.append(row)
        print(f"{turn:>4} {row['prompt_tokens']:>7} {row['reused_tokens']:>7} {row['ttft_without_s']:>12.2f}s "
              f"{row['ttft_with_s']:>9.2f}s {row['identical']}")
    print(json.dumps({"model": args.model, "system_tokens": args.system_tokens, "new_tokens": args.new_tokens,
                      "turns": rows}))


if __name__ == "__main__":
    main()
