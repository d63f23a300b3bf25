"""Self-distillation data: the target's own answers to generated instructions, with its features.

For every token of every sequence (the chat-formatted prompt, then the answer) the dataset keeps the
token id and the target's final hidden state at that token (the input of its LM head: the "feature"
EAGLE and Medusa heads read). Answers are greedy by default: a drafter for greedy decoding should
learn exactly what the target picks.

Generation is batched: prompts of similar length are left-padded into one batch and decoded in
lock step, each row seeing only its own slots (`slot_mask`) at its own RoPE positions, so each row
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
                   params: SamplingParams = SamplingParams(), generator: torch.Generator | None = None,
                   pad_id: int = 0) -> list[Sequence]:
    """Decode a batch of prompts together (left-padded), recording every token's feature."""
    batch = len(prompts)
    width = max(map(len, prompts))
    device = net.device
    pads = [width - len(p) for p in prompts]
    ids = torch.tensor([[pad_id] * pad + p for pad, p in zip(pads, prompts)], device=device)  # [B, width]
    pad_t = torch.tensor(pads, device=device)[:, None]  # [B, 1]
    max_len = width + max_new_tokens + 1
    slots = torch.arange(max_len, device=device)[None]  # [1, max_len]
    slot_mask = slots >= pad_t  # [B, max_len]: padding slots are never seen
    positions = (slots - pad_t).clamp(min=0)  # [B, max_len]: each row counts from its first real token
    cache = net.new_cache(max_len, batch_size=batch)
    logits, hidden = net.forward(ids, cache, positions=positions[:, :width], slot_mask=slot_mask, return_hidden=True)
    tokens = [list(p) for p in prompts]
    features = [[hidden[b, pads[b]:].half()] for b in range(batch)]  # per row, [n, hidden] blocks
    active = [True] * batch
    for step in range(max_new_tokens):
        last = logits[:, -1]  # [B, V]
        next_ids = last.argmax(-1) if params.greedy else sample(logits_to_probs(last, params), generator)  # [B]
        fed = active.copy()  # rows whose new token is part of their sequence
        for b in range(batch):
            if fed[b]:
                token = int(next_ids[b])
                tokens[b].append(token)
                if token in eos_ids or step + 1 == max_new_tokens:
                    active[b] = False
        # every row is fed (a finished row repeats its token; nothing of it is kept): the pass gives
        # the features of the tokens just appended
        at = cache.length
        logits, hidden = net.forward(next_ids[:, None], cache, positions=positions[:, at:at + 1],
                                     slot_mask=slot_mask, return_hidden=True)
        for b in range(batch):
            if fed[b]:
                features[b].append(hidden[b].half())
        if not any(active):
            break
    return [Sequence(tokens[b], torch.cat(features[b]), len(prompts[b])) for b in range(batch)]


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
        by_length = sorted(chunk, key=lambda i: len(encoded[i]))  # similar lengths share a batch: less padding
        results: dict[int, Sequence] = {}
        for b in range(0, len(by_length), batch_size):
            rows = by_length[b:b + batch_size]
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
