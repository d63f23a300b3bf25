"""What every head's training shares: batches of distilled sequences, the optimiser and its
checkpoints (safetensors + JSON: resumable, nothing pickled), a progress bar.

Checkpoints live apart from the output folder, which receives only the finished head or model: by
default in `$SPECDEC_CHECKPOINTS_DIR` (default `<specdec cache>/checkpoints`), in a folder named
after the output folder's absolute path, so that the same command resumes a stopped run. They are
deleted once the result is written."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.errors import SpecdecError
from specdec.cache_dir import cache_root
from specdec.train.distill import Sequence, load_sequences
from specdec.train.holdout import split

CHECKPOINT_WEIGHTS, CHECKPOINT_STATE = "checkpoint.safetensors", "checkpoint.json"


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, T] ids (right-padded with 0)
    features: torch.Tensor  # [B, T, hidden] float32, the target's f_t
    valid: torch.Tensor  # [B, T] bool: a real token
    answer: torch.Tensor  # [B, T] bool: a token of the answer (the target's own output)
    aux: torch.Tensor | None = None  # [B, T, layers × hidden] float32: the inputs of the aux layers (EAGLE-3)


DEFAULT_DRAFT_VOCAB = 8192  # tokens a head drafts over by default: the most frequent answer tokens


@dataclass
class Prepared:
    train: list[Sequence]
    validation: list[Sequence]
    vocab_ids: torch.Tensor  # [Vd] the draft vocabulary (target ids, ascending)
    coverage: float  # share of the training answers' tokens inside it
    head_rows: torch.Tensor  # [Vd, hidden] float32: the target's LM head rows of those ids (frozen)


def load_split(data_dir: Path | list[Path], out_dir: Path, validation_share: float,
               seed: int) -> tuple[list[Sequence], list[Sequence]]:
    """What every training starts from: the output folder made, torch seeded, the data split (each
    folder of a list on its own, so a folder's held-out sequences stay the same beside others)."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    train_seqs, val_seqs = [], []
    for folder in data_dir if isinstance(data_dir, list) else [data_dir]:
        train_part, val_part = split(load_sequences(folder), validation_share, seed)
        train_seqs += train_part
        val_seqs += val_part
    return train_seqs, val_seqs


def prepare(target, data_dir: Path | list[Path], out_dir: Path, draft_vocab: int, validation_share: float, seed: int,
            keep_ids: torch.Tensor | None = None) -> Prepared:
    """What every head's training starts from: `load_split`, the draft vocabulary (the most frequent
    answer tokens; a head trained further keeps its own, `keep_ids` [Vd'], and grows it to
    `draft_vocab` with the most frequent of the others) and its LM head rows."""
    train_seqs, val_seqs = load_split(data_dir, out_dir, validation_share, seed)
    vocab_ids, coverage = draft_vocabulary(train_seqs, draft_vocab, list(target.eos_token_ids),
                                           [] if keep_ids is None else keep_ids.tolist())
    return Prepared(train_seqs, val_seqs, vocab_ids, coverage, target.net.lm_head_weight()[vocab_ids].float().clone())


def draft_vocabulary(sequences: list[Sequence], size: int, always: list[int],
                     keep: list[int] = ()) -> tuple[torch.Tensor, float]:
    """`keep` (all of it), `always` (e.g. end-of-sequence) while there is room, then the most frequent
    answer tokens up to `size`: the draft vocabulary [size] (ascending target ids), and the share of
    answer tokens it covers."""
    counts = Counter(t for s in sequences for t in s.tokens[s.answer_start:])
    chosen = list(dict.fromkeys([*keep, *(t for t in always if t is not None)]))[:max(size, len(keep))]
    inside = set(chosen)
    chosen += [t for t, _ in counts.most_common() if t not in inside][: size - len(chosen)]
    total = sum(counts.values())
    covered = sum(counts[t] for t in chosen) / total if total else 0.0
    return torch.tensor(sorted(chosen)), covered


def draft_index(vocab_ids: torch.Tensor, vocab_size: int, missing: int) -> torch.Tensor:
    """[V]: each target id's index in the draft vocabulary, `missing` for ids outside it (labels to ignore)."""
    index = torch.full((vocab_size,), missing, dtype=torch.long)
    index[vocab_ids] = torch.arange(len(vocab_ids))
    return index


def data_info(target, data_dir: Path | list[Path], data: Prepared) -> dict:
    """What head.json records about the data a head was trained on."""
    return {"target": target.name, "data": [str(d) for d in data_dir] if isinstance(data_dir, list) else str(data_dir),
            "sequences": {"train": len(data.train), "validation": len(data.validation)},
            "draft_vocab_coverage": round(data.coverage, 4)}


def batches(sequences: list[Sequence], batch_tokens: int, max_len: int, seed: int | None) -> list[Batch]:
    """`batch_groups`, collated (all at once: for small sets, e.g. validation)."""
    return [collate([sequences[i] for i in group], max_len)
            for group in batch_groups(sequences, batch_tokens, max_len, seed)]


def batch_groups(sequences: list[Sequence], batch_tokens: int, max_len: int, seed: int | None) -> list[list[int]]:
    """Sequences (cut to max_len) grouped into batches of about `batch_tokens` tokens (indices);
    shuffled when seeded, sequences of similar length together (less padding)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].tokens))
    groups, current, longest = [], [], 0
    for i in order:
        length = min(len(sequences[i].tokens), max_len)
        if current and max(longest, length) * (len(current) + 1) > batch_tokens:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        groups.append(current)
    if seed is not None:
        random.Random(seed).shuffle(groups)
    return groups


def collate(sequences: list[Sequence], max_len: int) -> Batch:
    length = min(max(len(s.tokens) for s in sequences), max_len)
    hidden = sequences[0].features.shape[1]
    tokens = torch.zeros(len(sequences), length, dtype=torch.long)
    features = torch.zeros(len(sequences), length, hidden)
    valid = torch.zeros(len(sequences), length, dtype=torch.bool)
    answer = torch.zeros(len(sequences), length, dtype=torch.bool)
    with_aux = all(s.aux_features is not None for s in sequences)
    aux = torch.zeros(len(sequences), length, sequences[0].aux_features.shape[1]) if with_aux else None
    for b, s in enumerate(sequences):
        n = min(len(s.tokens), length)
        tokens[b, :n] = torch.tensor(s.tokens[:n])
        features[b, :n] = s.features[:n].float()
        if aux is not None:
            aux[b, :n] = s.aux_features[:n].float()
        valid[b, :n] = True
        answer[b, s.answer_start:n] = True
    return Batch(tokens, features, valid, answer, aux)


def answered_within(sequences: list[Sequence], max_len: int, log=print) -> list[Sequence]:
    """The sequences with an answer token inside their first `max_len` tokens (what training cuts them
    to); the others, whose prompts fill the window, are left out, and said so."""
    kept = [s for s in sequences if s.answer_start < min(len(s.tokens), max_len)]
    if len(kept) < len(sequences):
        log(f"{len(sequences) - len(kept)} of {len(sequences)} sequences left out: their prompts fill --max-len {max_len} "
            "(raise it to train on them)")
    return kept


def learning_rate(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def default_checkpoint_dir(out_dir: Path) -> Path:
    """Where a training that writes to `out_dir` keeps its checkpoints unless told otherwise."""
    out = Path(out_dir).expanduser().resolve()
    root = Path(os.environ.get("SPECDEC_CHECKPOINTS_DIR") or cache_root() / "checkpoints")
    return root / f"{out.name}-{hashlib.sha256(str(out).encode()).hexdigest()[:12]}"


def save_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """The model, AdamW's moments and the loop's position, so that a stopped run resumes exactly."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if torch.is_tensor(value):
                    tensors[f"optim.{names[id(p)]}.{key}"] = value.detach().contiguous()
    tmp = folder / (CHECKPOINT_WEIGHTS + ".tmp")
    save_file(tensors, str(tmp))
    tmp.replace(folder / CHECKPOINT_WEIGHTS)
    (folder / CHECKPOINT_STATE).write_text(json.dumps(state, indent=1))


def load_checkpoint(folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    """Restore what `save_checkpoint` wrote; None when there is no checkpoint."""
    if not (folder / CHECKPOINT_WEIGHTS).is_file() or not (folder / CHECKPOINT_STATE).is_file():
        return None
    tensors = load_file(str(folder / CHECKPOINT_WEIGHTS))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    params = dict(model.named_parameters())
    for key, value in tensors.items():
        if key.startswith("optim."):
            name, _, slot = key[6:].rpartition(".")
            optimizer.state[params[name]][slot] = value
    return json.loads((folder / CHECKPOINT_STATE).read_text())


def remove_checkpoint(folder: Path) -> None:
    """Delete what `save_checkpoint` wrote (call it once the trained result is written), and the
    folder if that leaves it empty."""
    for name in (CHECKPOINT_WEIGHTS, CHECKPOINT_WEIGHTS + ".tmp", CHECKPOINT_STATE):
        (folder / name).unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def native_bfloat16(device: torch.device | str = "cpu") -> bool:
    """Whether bfloat16 matrix products run natively here: a CUDA device, or a CPU with AVX-512 BF16
    (or AMX). Elsewhere (AVX2) they are emulated and slower than float32."""
    if torch.device(device).type == "cuda":
        return True
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def fit(model: torch.nn.Module, objective: Callable, validate: Callable, train_seqs: list[Sequence],
        val_seqs: list[Sequence], checkpoint_dir: Path, *, epochs: int, lr: float, batch_tokens: int, max_len: int,
        seed: int, checkpoint_every: int, progress=None, log=print, mixed_precision: bool = False) -> dict:
    """AdamW with warm-up and cosine decay over `epochs` of `train_seqs`; `objective(batch, train=True)`
    returns (loss, ...); `validate(batches)` a dict, logged after each epoch (in float32). With
    `mixed_precision` the training steps' products run in bfloat16 (autocast; weights, optimiser and
    losses stay float32). Checkpoints to, and resumes from, `checkpoint_dir` (left there: the caller
    removes it once the result is written). Returns {"history": [...], "seconds_this_run": ...}."""
    device = next(model.parameters()).device
    train_seqs, val_seqs = answered_within(train_seqs, max_len, log), answered_within(val_seqs, max_len, log)
    if not train_seqs:
        raise SpecdecError(f"no training sequence has answer tokens within its first {max_len} tokens: raise --max-len")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    val_batches = batches(val_seqs, batch_tokens, max_len, seed=None)
    steps_per_epoch = len(batch_groups(train_seqs, batch_tokens, max_len, seed=None))
    total = steps_per_epoch * epochs
    state = load_checkpoint(checkpoint_dir, model, optimizer) or {"step": 0, "history": []}
    if state["step"]:
        log(f"resuming at step {state['step']} of {total}")
    started = time.perf_counter()
    step = state["step"]
    for epoch in range(step // steps_per_epoch, epochs):
        epoch_groups = batch_groups(train_seqs, batch_tokens, max_len, seed=seed + epoch)  # collated step by step
        for index in range(step - epoch * steps_per_epoch, len(epoch_groups)):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, total, lr, warmup=max(1, total // 50))
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed_precision):
                loss = objective(collate([train_seqs[i] for i in epoch_groups[index]], max_len), train=True)[0]
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            step += 1
            if progress:
                progress(step, total, loss.item())
            if step % checkpoint_every == 0:
                save_checkpoint(checkpoint_dir, model, optimizer, {**state, "step": step})
        model.eval()
        with torch.no_grad():
            result = validate(val_batches)
        model.train()
        result.update(epoch=epoch + 1, step=step)
        state["history"].append(result)
        log(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v}" for k, v in result.items() if k not in ("epoch", "step")))
        save_checkpoint(checkpoint_dir, model, optimizer, {**state, "step": step})
    return {"history": state["history"], "seconds_this_run": round(time.perf_counter() - started, 1)}
