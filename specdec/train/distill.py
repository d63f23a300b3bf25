"""Self-distillation data: the target's own answers to instructions, with its features.

For every token of every sequence (the chat-formatted prompt, then the answer) the dataset keeps the
token id, the target's final hidden state at that token (the input of its LM head: the "feature"
EAGLE and Medusa heads read) and, with `aux_layers`, the residual stream entering those layers (what
EAGLE-3 heads read: low, middle and high layers). Each prompt has its temperature (0 = greedy: a
drafter for greedy decoding should learn exactly what the target picks; sampled answers teach the
spread of its distribution) and its own random stream, seeded by its index, so an answer does not
depend on what else was decoded beside it.

Generation keeps `batch_size` rows in every pass (`forward_segments`: one segment and one cache per
sequence, no padding): a row that ends leaves, the next prompt joins in the same pass as the rows
still decoding. Each row computes what it would alone (tested). Data is written in shards of
consecutive prompts as they complete (`shard-NNNNN.safetensors`: tokens int32 [N], features float16
[N, hidden], aux_features float16 [N, layers × hidden] when made, offsets int64 [S + 1],
answer_starts int64 [S], temperatures float32 [S]); a run that is stopped resumes after the last
complete shard and gives the same data as one that was not.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams, logits_to_probs, sample
from specdec.train.holdout import held_out_indices

META = "meta.json"
FLOAT16_MAX = 65504.0


@dataclass
class Sequence:
    tokens: list[int]  # prompt then answer
    features: torch.Tensor  # [len(tokens), hidden] float16: final-norm hidden states
    answer_start: int
    aux_features: torch.Tensor | None = None  # [len(tokens), layers × hidden] float16, or None
    temperature: float = 0.0


@dataclass
class _Row:
    """One prompt being answered."""

    index: int
    prompt: list[int]
    cache: object
    params: SamplingParams
    generator: torch.Generator | None
    tokens: list[int]
    features: list[torch.Tensor]  # [n, hidden] blocks
    aux: list[torch.Tensor]  # [n, layers × hidden] blocks
    ended: bool = False


def prompt_generator(seed: int, index: int, device) -> torch.Generator:
    """Prompt `index`'s own random stream: its answer is the same whatever was decoded beside it."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed * 1_000_003 + index)
    return generator


@torch.inference_mode()
def generate(net, prompts: dict[int, list[int]], max_new_tokens: int, eos_ids: set[int], *, batch_size: int = 32,
             temperatures: dict[int, float] | None = None, seed: int = 0, aux_layers: tuple[int, ...] = (),
             on_done: Callable[[int, Sequence], None] | None = None) -> dict[int, Sequence]:
    """Answer `prompts` ({index: token ids}, decoded in index order), `batch_size` rows per pass, rows
    leaving and joining between passes; every token's features recorded. `on_done(index, sequence)`
    is called as each answer ends. Returns {index: Sequence}."""
    from specdec.runtime.llama import Segment

    device = net.device
    waiting = sorted(prompts)
    waiting.reverse()  # pop() takes the lowest index
    rows: list[_Row] = []
    out: dict[int, Sequence] = {}
    while waiting or rows:
        while waiting and len(rows) < batch_size:
            i = waiting.pop()
            temperature = (temperatures or {}).get(i, 0.0)
            params = SamplingParams(temperature=temperature)
            rows.append(_Row(i, prompts[i], net.new_cache(len(prompts[i]) + max_new_tokens + 1), params,
                             None if params.greedy else prompt_generator(seed, i, device), list(prompts[i]), [], []))
        # a joining row is fed its prompt, a decoding row its last token (also one that ends it: the
        # pass gives that token's features; the row leaves after it)
        fed = [row.prompt if not row.features else row.tokens[-1:] for row in rows]
        ids = torch.tensor([t for f in fed for t in f], device=device)  # [N]
        ends = torch.tensor([len(f) for f in fed]).cumsum(0)
        out_pass = net.forward_segments(ids, [Segment(row.cache, len(f)) for row, f in zip(rows, fed)],
                                        logit_rows=(ends - 1).to(device), return_hidden=True, aux_layers=aux_layers)
        logits, hidden = out_pass[0], out_pass[1]  # [R, V], [N, hidden]
        aux = torch.cat([out_pass[2][layer] for layer in aux_layers], dim=-1) if aux_layers else None  # [N, l × hidden]
        start = 0
        still = []
        for r, (row, f) in enumerate(zip(rows, fed)):
            rows_of = slice(start, start + len(f))
            start += len(f)
            row.features.append(_half(hidden[rows_of]))
            if aux is not None:
                row.aux.append(_half(aux[rows_of]))
            if row.ended:
                seq = Sequence(row.tokens, torch.cat(row.features), len(row.prompt),
                               torch.cat(row.aux) if row.aux else None, row.params.temperature)
                out[row.index] = seq
                if on_done:
                    on_done(row.index, seq)
                continue
            if row.params.greedy:
                token = int(logits[r].argmax())
            else:
                token = int(sample(logits_to_probs(logits[r:r + 1], row.params), row.generator)[0])
            row.tokens.append(token)
            row.ended = token in eos_ids or len(row.tokens) - len(row.prompt) >= max_new_tokens
            still.append(row)
        rows = still
    return out


def _half(x: torch.Tensor) -> torch.Tensor:
    """float16 for storage; a value it cannot hold is an error, never an inf in the data."""
    if x.abs().max() > FLOAT16_MAX:
        raise SpecdecError(f"a hidden state reaches {float(x.abs().max()):.0f}, beyond float16's range: "
                           "this model's features cannot be stored in float16")
    return x.half()


def save_shard(path: Path, sequences: list[Sequence]) -> None:
    lengths = torch.tensor([len(s.tokens) for s in sequences])
    tensors = {
        "tokens": torch.tensor([t for s in sequences for t in s.tokens], dtype=torch.int32),
        "features": torch.cat([s.features for s in sequences]).contiguous(),
        "offsets": torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]),
        "answer_starts": torch.tensor([s.answer_start for s in sequences], dtype=torch.long),
        "temperatures": torch.tensor([s.temperature for s in sequences], dtype=torch.float32),
    }
    if sequences[0].aux_features is not None:
        tensors["aux_features"] = torch.cat([s.aux_features for s in sequences]).contiguous()
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(path)


def shard_paths(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("shard-*.safetensors"))


def load_sequences(folder: Path) -> list[Sequence]:
    """Every sequence of a dataset folder, in order (features are views into each shard's tensors)."""
    out = []
    for path in shard_paths(folder):
        data = load_file(str(path))
        offsets = data["offsets"].tolist()
        aux = data.get("aux_features")
        temperatures = data["temperatures"].tolist() if "temperatures" in data else [0.0] * (len(offsets) - 1)
        for i, start in enumerate(data["answer_starts"].tolist()):
            a, b = offsets[i], offsets[i + 1]
            out.append(Sequence(data["tokens"][a:b].tolist(), data["features"][a:b], start,
                                None if aux is None else aux[a:b], temperatures[i]))
    return out


def encode_prompts(tokenizer, prompts: list[str | tuple[str, ...]]) -> list[list[int]]:
    """Each instruction as the target's chat template formats a user turn (plain text without one);
    a tuple is a conversation (user, assistant, user, …) whose last user turn is to be answered."""
    def messages(prompt):
        turns = (prompt,) if isinstance(prompt, str) else prompt
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]

    if not tokenizer.chat_template:
        if any(not isinstance(p, str) for p in prompts):
            raise SpecdecError("conversations need a model with a chat template; this one takes plain text only")
        return [tokenizer.encode(p) for p in prompts]
    return [tokenizer.apply_chat_template(messages(p)) for p in prompts]


def prompt_digest(prompts: list[str | tuple[str, ...]]) -> str:
    """sha256 of a prompt list (kept in meta.json: a resumed run must answer the same prompts)."""
    return hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode()).hexdigest()


def distill(target, prompts: list[str | tuple[str, ...]], out_dir: Path, *, max_new_tokens: int = 192, batch_size: int = 32,
            shard_size: int = 128, temperatures: tuple[float, ...] = (0.0,), seed: int = 0,
            aux_layers: tuple[int, ...] = (), prompt_source: str = "", progress=None) -> dict:
    """Write the target's answers to `prompts` (with features) under `out_dir`; resume what exists.

    Prompt i is answered at temperatures[i % len(temperatures)]. `progress(done, total, answer_tokens,
    seconds)` is called as answers end (answer tokens and seconds of this run). Returns the dataset's
    meta data (with the throughput of this run)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path = out_dir / META
    meta = {"target": target.name, "prompts": len(prompts), "prompt_source": prompt_source,
            "max_new_tokens": max_new_tokens, "temperatures": list(temperatures), "seed": seed,
            "aux_layers": list(aux_layers), "hidden_size": target.net.config.hidden_size,
            "vocab_size": target.vocab_size, "shard_size": shard_size}
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())
        differs = {k: (old.get(k), v) for k, v in meta.items() if k != "prompts" and old.get(k) != v}
        if differs:
            raise SpecdecError(f"{out_dir} holds data made with other settings {differs}; use another --data folder")
        if "prompt_digest" in old and len(prompts) >= old["prompts"] and prompt_digest(prompts[:old["prompts"]]) != old["prompt_digest"]:
            raise SpecdecError(f"{out_dir} holds answers to other prompts than {prompt_source!r} makes now (its generator "
                               "changed since); use another --data folder")
    meta["prompt_digest"] = prompt_digest(prompts)
    meta_path.write_text(json.dumps(meta, indent=1))
    encoded = encode_prompts(target.tokenizer, prompts)
    shards_done = len(shard_paths(out_dir))
    first = stored_sequences(out_dir)  # the last shard may be short: a run asked for fewer prompts then
    todo = {i: encoded[i] for i in range(first, len(encoded))}
    started = time.perf_counter()
    finished: dict[int, Sequence] = {}
    counts = {"answers": 0, "answer_tokens": 0, "next_shard": shards_done}

    def on_done(index: int, seq: Sequence) -> None:
        finished[index] = seq
        counts["answers"] += 1
        counts["answer_tokens"] += len(seq.tokens) - seq.answer_start
        while True:  # write every shard whose prompts have all ended, in order
            k = counts["next_shard"]
            start = first + (k - shards_done) * shard_size
            members = range(start, min(start + shard_size, len(encoded)))
            if not members or any(i not in finished for i in members):
                break
            save_shard(out_dir / f"shard-{k:05d}.safetensors", [finished.pop(i) for i in members])
            counts["next_shard"] = k + 1
        if progress:
            progress(first + counts["answers"], len(encoded), counts["answer_tokens"], time.perf_counter() - started)

    if progress:
        progress(min(first, len(encoded)), len(encoded), 0, 0.0)
    generate(target.net, todo, max_new_tokens, set(target.eos_token_ids), batch_size=batch_size,
             temperatures={i: temperatures[i % len(temperatures)] for i in todo}, seed=seed, aux_layers=aux_layers,
             on_done=on_done)
    seconds = time.perf_counter() - started
    sequences = load_sequences(out_dir)
    meta.update(sequences=len(sequences), tokens=sum(len(s.tokens) for s in sequences),
                answer_tokens=sum(len(s.tokens) - s.answer_start for s in sequences),
                generated_this_run=len(todo), answer_tokens_this_run=counts["answer_tokens"],
                seconds_this_run=round(seconds, 1),
                answer_tokens_per_second=round(counts["answer_tokens"] / seconds, 1) if todo and seconds else None)
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def stored_sequences(folder: Path) -> int:
    """How many sequences a data folder's shards hold (read from their headers)."""
    from safetensors import safe_open

    total = 0
    for path in shard_paths(folder):
        with safe_open(str(path), framework="pt") as shard:
            total += shard.get_slice("answer_starts").get_shape()[0]
    return total


def read_answers(folder: Path) -> list[tuple[list[int], float]]:
    """(answer token ids, temperature) of every sequence of a dataset folder, in order, without
    reading its features."""
    from safetensors import safe_open

    out = []
    for path in shard_paths(folder):
        with safe_open(str(path), framework="pt") as shard:
            tokens = shard.get_tensor("tokens").tolist()
            offsets = shard.get_tensor("offsets").tolist()
            starts = shard.get_tensor("answer_starts").tolist()
            names = set(shard.keys())
            temperatures = shard.get_tensor("temperatures").tolist() if "temperatures" in names else [0.0] * len(starts)
        for i, start in enumerate(starts):
            out.append((tokens[offsets[i] + start:offsets[i + 1]], temperatures[i]))
    return out


HELD_OUT_SHARE = 0.05  # the largest validation share a trainer uses (its held-out set includes the smaller ones)


def answered_instructions(folder: Path, target, *, min_tokens: int = 48, max_temperature: float = 0.7,
                          seed: int = 0, ended_only: bool = False) -> list[tuple[str, str]]:
    """(instruction, answer text) of a dataset made from the template instructions by `target`: the
    passages of long-input tasks (`instructions.passage_instructions`) and the first turns of
    follow-up conversations (`instructions_v2.follow_up_conversations`). Answers shorter than
    `min_tokens`, sampled hotter than `max_temperature` or (with `ended_only`) cut off before the
    end token are left out, and so are the sequences a training with this `seed` holds out for
    validation (`holdout.split`, any share up to 5 %): data made from their answers would teach the
    head its own validation answers."""
    from specdec.train.prompt_source import generated_instructions

    folder = Path(folder)
    meta = data_meta(folder, target)
    if meta is None:
        raise SpecdecError(f"{folder} holds no self-distillation data: make it with `specdec train data --data {folder}`")
    source = meta.get("prompt_source", "")
    answers = read_answers(folder)
    questions = generated_instructions(source, len(answers))
    if questions is None:
        raise SpecdecError(f"{folder} was not made from the template instructions ({source!r}): its answers' "
                           "instructions cannot be recovered; use a folder made without --passages or --follow-ups")
    if "prompt_digest" in meta and prompt_digest(questions) != meta["prompt_digest"]:
        raise SpecdecError(f"{folder} answers other instructions than {source!r} makes now (its generator changed "
                           "since): its answers cannot be paired with their instructions")
    held_out = held_out_indices(len(answers), HELD_OUT_SHARE, seed)
    ends = set(target.eos_token_ids)
    return [(question, target.tokenizer.decode(ids, skip_special_tokens=True).strip())
            for i, (question, (ids, temperature)) in enumerate(zip(questions, answers))
            if len(ids) >= min_tokens and temperature <= max_temperature and i not in held_out
            and (not ended_only or ids[-1] in ends)]


def data_meta(folder: Path, target) -> dict | None:
    """A data folder's meta.json, refused if another model made the data (`check_made_by`); None
    where the folder holds none (no meta.json or no shard)."""
    meta_path = Path(folder) / META
    if not meta_path.is_file() or not shard_paths(folder):
        return None
    meta = json.loads(meta_path.read_text())
    check_made_by(folder, meta, target)
    return meta


def check_made_by(folder: Path, meta: dict, target) -> None:
    """Refuse data another model made: its features and token ids mean nothing to this one."""
    config = target.net.config
    theirs = (meta.get("target"), meta.get("hidden_size"), meta.get("vocab_size"))
    if theirs != (target.name, config.hidden_size, target.vocab_size):
        raise SpecdecError(f"{folder} holds data made by {theirs[0]!r} (hidden size {theirs[1]}, vocabulary "
                           f"{theirs[2]}), not by {target.name!r}: make data with this model")
