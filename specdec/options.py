"""What the model commands share: their options, the objects those become, and the loading.

`generate`, `chat`, `explain`, `costs`, `serve` and `bench` take the same model options; this module
defines them once, turns them into the library's config objects, and loads the target and drafters
with a message on the console (the console goes to standard error under `--json`, see cli.main).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from specdec.drafters.spec import drafter_help, parse_drafter_spec


def gamma_arg(text: str) -> int | str:
    if text == "auto":
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"gamma must be 'auto' or a whole number >= 1, got '{text}'")


def whole_number(text: str) -> int:
    """An argparse type: a count that must be at least 1 (clients, requests, prompts)."""
    if text.strip().isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"takes a whole number >= 1, got '{text}'")


def add_target_args(p: argparse.ArgumentParser) -> None:
    """The target model and the drafter: what every model command loads."""
    add_load_args(p)
    p.add_argument("--drafter", default="ngram", help=drafter_help())
    p.add_argument("--max-gamma", type=int, default=8, help="the largest γ the adaptive policy tries (default: 8)")


def add_load_args(p: argparse.ArgumentParser) -> None:
    """How the target loads: every model command's, `bench` included (whose drafters repeat)."""
    p.add_argument("--model", default="smollm2-135m", help="built-in name, Hugging Face folder or .gguf file (default: smollm2-135m)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default: cpu)")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (default: float32)")
    p.add_argument("--runtime", default="lean", help="lean | transformers (default: lean)")
    p.add_argument("--weights", default="auto",
                   help="auto | float32 | bfloat16 | int8 | int4: the linear layers' form (default: auto, a GGUF's "
                        "blocks as stored, every common type (Q4_0 … Q8_0, K-quants) on the CPU; a float checkpoint "
                        "stays float; the others quantize or dequantize at load)")
    p.add_argument("--chat-template", metavar="NAME|FILE", default=None,
                   help="the chat template for a model file that has none (or to replace its own): chatml, gemma, or "
                        "a Jinja file (default: the model's own)")
    add_kv_cache_arg(p)
    add_no_compile_arg(p)
    add_threads_arg(p)


def cores_available() -> int:
    """The CPU cores this process may run on (its affinity: a container's or `taskset`'s share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=whole_number, default=None,
                   help="CPU threads for the model's passes (specdec's kernels and PyTorch's) and for llama.cpp beside "
                        f"them (default: the cores this process may use, {cores_available()} here)")


def apply_threads(threads: int | None, warn=None) -> int:
    """Run the passes on `threads` threads (None: every core this process may use); returns the count.
    More threads than cores is allowed, and said: they wait for each other at the end of every loop,
    which makes a pass several times slower (`warn(message)`)."""
    import torch

    cores = cores_available()
    count = threads or cores
    if count > cores and warn is not None:
        warn(f"--threads {count} is more than the {cores} cores this process may use: the threads will wait for "
             "each other, and every pass will be slower")
    torch.set_num_threads(count)
    return count


def add_kv_cache_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-cache", default="auto",
                   help="auto | float16 | float32: what the KV cache holds (default: auto, float16 where specdec's CPU kernels run the "
                        "attention: half the memory and bytes read per token, every row the same bits alone or batched; "
                        "float32 asks for the wider cache)")


def add_no_compile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-compile", action="store_true",
                   help="neither build nor use specdec's C++ CPU kernels (built once per machine, about a minute): "
                        "float32 weights and PyTorch's operators, which are slower and not batch-invariant")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """The target options and the generation settings."""
    add_target_args(p)
    p.add_argument("--gamma", type=gamma_arg, default="auto",
                   help="tokens drafted per round: a whole number >= 1, or auto (chosen each round from measured costs and acceptance; default)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1 = off")
    p.add_argument("--seed", type=int, default=None, help="fixes the random draws: the same seed repeats a sampled run")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def add_json_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true",
                   help=f"print {what} as one JSON line on standard output; tables and messages go to standard error")


def generation_config(args):
    from specdec.decode.engine import GenerationConfig
    from specdec.sampling import SamplingParams

    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    return GenerationConfig(max_new_tokens=args.max_new_tokens, gamma=args.gamma, max_gamma=args.max_gamma,
                            sampling=sampling, stop=tuple(args.stop))


def load_target(args, console):
    """The target model from the load options (add_load_args), with `--chat-template` applied."""
    from specdec.runtime import load_model
    from specdec.runtime.chat_templates import read_chat_template

    template = read_chat_template(args.chat_template) if args.chat_template else None  # a bad one fails first
    with console.status(f"loading {args.model}"):
        target = load_model(args.model, device=args.device, dtype=args.dtype, runtime=args.runtime, weights=args.weights,
                            kv_cache=args.kv_cache)
    if template is not None:
        target.tokenizer.chat_template = template
    return target


def load_engine(args, console):
    """The target and its drafters from the options, in an `Engine`."""
    from specdec.drafters.build import build_drafters
    from specdec.decode.engine import Engine

    choice = parse_drafter_spec(args.drafter)  # a misspelled drafter fails before the model loads
    target = load_target(args, console)
    with console.status(f"loading the drafter {args.drafter}"):
        drafters = build_drafters(choice, target, device=args.device, dtype=args.dtype, runtime=args.runtime)
    return Engine(target, drafters)


def prepare_costs(engine, config, console) -> None:
    """Read the cost model now, with a spinner, if the adaptive policy will need it (measuring it the
    first time announces itself: see cost_model.load_or_measure)."""
    if engine.needs_costs(config):
        with console.status("reading the cost model"):
            engine.costs(config.max_gamma)


def warm_up(engine, prompt_ids: list[int], config) -> None:
    """A few tokens of speculative and of plain decoding, so that neither timed run pays first-call costs."""
    from specdec.decode.engine import Engine

    short = replace(config, max_new_tokens=4, trace=False)
    engine.generate(prompt_ids, short)
    Engine(engine.target).generate(prompt_ids, short)
