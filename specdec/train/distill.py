"""Self-distillation data: the target's own answers to generated instructions, with its features.

For every token of every sequence (the chat-formatted prompt, then the answer) the dataset keeps the
token id and the target's final hidden state at that token (the input of its LM head: the "feature"
EAGLE and Medusa heads read). Answers are greedy by default: a drafter for greedy decoding should
learn exactly what the target picks.

Generation is batched: the prompts of a batch share every pass (`forward_segments`: one segment
and one cache per sequence, no padding), and a sequence leaves the pass when it ends; each row
computes what a batch of one would (tested). Data is written in shards as they fill
(`shard-NNNNN.safetensors`: tokens int32 [N], features float16 [N, hidden], offsets int64 [S + 1],
answer_starts int64 [S]); a run that is stopped resumes after the last complete shard.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, logits_to_probs, sample

META = "meta.json"


@dataclass
class Sequence:
    tokens: list[int]  # prompt then answer
    features: torch.Tensor  # [len(tokens), hidden] float16
    answer_start: int


@torch.inference_mode()
def generate_batch(net, prompts: list[list[int]], max_new_tokens: int, eos_ids: set[int],
                   params: SamplingParams = SamplingParams(), generator: torch.Generator | None = None) -> list[Sequence]:
    """Decode a batch of prompts together, recording every token's feature."""
    from specdec.runtime.llama import Segment

    device = net.device
    caches = [net.new_cache(len(p) + max_new_tokens + 1) for p in prompts]
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    ids = torch.tensor([t for p in prompts for t in p], device=device)  # [N]: the prompts one after another
    logits, hidden = net.forward_segments(ids, [Segment(c, len(p)) for c, p in zip(caches, prompts)],
                                          logit_rows=lengths.cumsum(0) - 1, return_hidden=True)  # [B, V], [N, hidden]
    tokens = [list(p) for p in prompts]
    features = [[block.half()] for block in hidden.split(lengths.tolist())]  # per row, [n, hidden] blocks
    active = list(range(len(prompts)))  # rows still generating, in the order of `logits`' rows
    for step in range(max_new_tokens):
        next_ids = logits.argmax(-1) if params.greedy else sample(logits_to_probs(logits, params), generator)  # [A]
        for b, token in zip(active, next_ids.tolist()):
            tokens[b].append(token)
        # every row is fed its new token (also one that ends it): the pass gives the features of the
        # tokens just appended; rows that ended leave after it
        logits, hidden = net.forward_segments(next_ids, [Segment(caches[b], 1) for b in active],
                                              return_hidden=True)  # [A, V], [A, hidden]
        for i, b in enumerate(active):
            features[b].append(hidden[i:i + 1].half())
        still = [i for i, b in enumerate(active) if tokens[b][-1] not in eos_ids and step + 1 < max_new_tokens]
        active = [active[i] for i in still]
        logits = logits[still]
        if not active:
            break
    return [Sequence(tokens[b], torch.cat(features[b]), len(prompts[b])) for b in range(len(prompts))]


def save_shard(path: Path, sequences: list[Sequence]) -> None:
    lengths = torch.tensor([len(s.tokens) for s in sequences])
    tensors = {
        "tokens": torch.tensor([t for s in sequences for t in s.tokens], dtype=torch.int32),
        "features": torch.cat([s.features for s in sequences]).contiguous(),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        "answer_starts": torch.tensor([s.answer_start for s in sequences], dtype=torch.long),
    }
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)


def load_sequences(folder: Path) -> list[Sequence]:
    """Every sequence of a dataset folder, in order."""
    out = []
    for path in sorted(Path(folder).glob("shard-*.safetensors")):
        data = load_file(str(path))
        offsets = data["offsets"].tolist()
        for i, start in enumerate(data["answer_starts"].tolist()):
            a, b = offsets[i], offsets[i + 1]
            out.append(Sequence(data["tokens"][a:b].tolist(), data["features"][a:b], start))
    return out


def distill(target, prompts: list[str], out_dir: Path, *, max_new_tokens: int = 192, batch_size: int = 16,
            shard_size: int = 128, params: SamplingParams = SamplingParams(), progress=None) -> dict:
    """Write the target's answers to `prompts` (with features) under `out_dir`; resume what exists.

    `progress(done, total)` is called after each batch. Returns the dataset's meta data."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path = out_dir / META
    meta = {"target": target.name, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "temperature": params.temperature, "hidden_size": target.net.config.hidden_size,
            "vocab_size": target.vocab_size, "shard_size": shard_size}
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        differs = {k: (old.get(k), v) for k, v in meta.items() if k != "prompts" and old.get(k) != v}
        if differs:
            raise SpecdecError(f"{out_dir} holds data made with other settings {differs}; use another --data folder")
    meta_path.write_text(json.dumps(meta, indent=1))
    tokenizer = target.tokenizer
    encoded = [tokenizer.apply_chat_template([{"role": "user", "content": p}]) if tokenizer.chat_template
               else tokenizer.encode(p) for p in prompts]
    done = len(list(out_dir.glob("shard-*.safetensors"))) * shard_size
    generator = params.generator(target.net.device)
    eos = set(target.eos_token_ids)
    started = time.perf_counter()
    if progress:
        progress(min(done, len(encoded)), len(encoded))
    for shard_start in range(done, len(encoded), shard_size):
        chunk = list(range(shard_start, min(shard_start + shard_size, len(encoded))))
        results: dict[int, Sequence] = {}
        for b in range(0, len(chunk), batch_size):
            rows = chunk[b:b + batch_size]
            for i, seq in zip(rows, generate_batch(target.net, [encoded[i] for i in rows], max_new_tokens, eos,
                                                    params, generator)):
                results[i] = seq
            if progress:
                progress(shard_start + len(results), len(encoded))
        save_shard(out_dir / f"shard-{shard_start // shard_size:05d}.safetensors", [results[i] for i in chunk])
    sequences = load_sequences(out_dir)
    meta.update(sequences=len(sequences), tokens=sum(len(s.tokens) for s in sequences),
                answer_tokens=sum(len(s.tokens) - s.answer_start for s in sequences),
                generated_this_run=max(0, len(encoded) - done),
                seconds_this_run=round(time.perf_counter() - started, 1))
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta
