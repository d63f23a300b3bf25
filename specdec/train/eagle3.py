"""Training an EAGLE-3 head on self-distilled data (`distill.py`, made with the aux layers).

The training-time test (`unroll.py`): block 0 reads the target's fused features, block d ≥ 1 the
head's own output of block d − 1 one position back, as drafting does; no feature regression. Every
block at position t predicts x_{t+2}, scored against the target's own distribution there: its
logits at f_{t+1} restricted to the draft vocabulary (the target's LM head rows of those ids; the
soft labels of SpecForge), by cross-entropy, block d weighted 0.8^d; only positions whose x_{t+2}
is an answer token count. Logits are computed only at those positions.

Validation on held-out sequences: the greedy chain acceptance (for every start position, how many
drafts in a row equal the target's argmax over its full vocabulary) as α per depth and the chain's
MAT, and at temperature 1 the expected acceptance Σ min(p, q) per depth (q: the head's draft
distribution, p: the target's over its full vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdec.control.theory import expected_tokens_by_position
from specdec.errors import SpecdecError
from specdec.heads.eagle3 import Eagle3Config, Eagle3Head
from specdec.heads.files import load_head, save_head
from specdec.train.distill import META, data_meta
from specdec.train.eagle import chain_acceptance
from specdec.train.loop import (
    DEFAULT_DRAFT_VOCAB,
    Batch,
    data_info,
    default_checkpoint_dir,
    fit,
    native_bfloat16,
    prepare,
    remove_checkpoint,
)
from specdec.train.unroll import unrolled_predictions

STEP_WEIGHT = 0.8  # block d's loss weighs STEP_WEIGHT ** d (EAGLE-3, SpecForge)


class Eagle3Objective:
    """Inputs, predictions and losses of one batch (shared by training and validation)."""

    def __init__(self, head: Eagle3Head, embed: torch.nn.Embedding, head_rows: torch.Tensor,
                 full_head: torch.Tensor, depth: int) -> None:
        self.head, self.embed, self.depth = head, embed, depth
        self.head_rows = head_rows  # [Vd, hidden]: the target's LM head rows of the draft vocabulary, frozen
        self.full_head = full_head  # [V, hidden]: the target's LM head (validation only)
        self.vocab_ids = head.vocab_ids  # [Vd]

    def __call__(self, batch: Batch, train: bool):
        """Training: (loss,). Validation: (loss, per-block correct [B, T'], per-block counted [B, T'],
        per-block Σ min(p, q) summed over counted positions) with T' = T − 2."""
        if batch.aux is None:
            raise SpecdecError("this data has no aux-layer features: make it with `specdec train data` "
                               "(--aux-layers auto) to train an EAGLE-3 head")
        aux = batch.aux[:, :-2]  # [B, T', layers × hidden]: the inputs of the aux layers at t
        with torch.no_grad():
            next_embeds = self.embed(batch.tokens[:, 1:-1]).float()  # [B, T', hidden]: x_{t+1}
        next_features = batch.features[:, 1:-1]  # [B, T', hidden]: f_{t+1}, the target's logits of x_{t+2}
        base = batch.valid[:, 2:] & batch.answer[:, 2:]  # x_{t+2} is a real answer token
        predictions = unrolled_predictions(self.head, aux, next_embeds, self.depth)
        loss = torch.zeros(())
        corrects, counted, overlaps = [], [], []
        for d, predicted in enumerate(predictions):
            mask = base.clone()
            mask[:, :d] = False  # block d at t < d has no chain
            if not mask.any():  # (a batch of short answers: no chain this deep)
                corrects.append(mask)
                counted.append(mask)
                overlaps.append(0.0)
                continue
            logits = self.head.logits(predicted[mask])  # [n, Vd]
            with torch.no_grad():
                target_p = torch.softmax(next_features[mask] @ self.head_rows.T, dim=-1)  # [n, Vd]
            ce = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
            loss = loss + STEP_WEIGHT ** d * ce
            if not train:
                with torch.no_grad():
                    full = next_features[mask] @ self.full_head.T  # [n, V]
                    correct = torch.zeros_like(mask)
                    correct[mask] = self.vocab_ids[logits.argmax(-1)] == full.argmax(-1)
                    p = torch.softmax(full, dim=-1)[:, self.vocab_ids]  # [n, Vd]: the target's mass on the draft vocabulary
                    overlaps.append(float(torch.minimum(p, torch.softmax(logits, -1)).sum()))
                corrects.append(correct)
                counted.append(mask)
        if train:
            return (loss,)
        return loss, corrects, counted, overlaps


def validate(objective: Eagle3Objective, val_batches: list[Batch]) -> dict:
    losses, reached, accepted, overlap, positions = [], None, None, None, None
    for batch in val_batches:
        loss, corrects, counted, overlaps = objective(batch, train=False)
        losses.append(float(loss))
        r, a = chain_acceptance(corrects, counted)
        n = [int(m.sum()) for m in counted]
        reached = r if reached is None else [x + y for x, y in zip(reached, r)]
        accepted = a if accepted is None else [x + y for x, y in zip(accepted, a)]
        overlap = overlaps if overlap is None else [x + y for x, y in zip(overlap, overlaps)]
        positions = n if positions is None else [x + y for x, y in zip(positions, n)]
    alphas = [a / r if r else 0.0 for a, r in zip(accepted, reached)]
    return {"loss": round(sum(losses) / max(1, len(losses)), 4), "alpha_per_depth": [round(a, 4) for a in alphas],
            "chain_mat": round(expected_tokens_by_position(alphas), 3),
            "alpha_t1_per_depth": [round(o / n, 4) if n else 0.0 for o, n in zip(overlap, positions)]}


def train_eagle3(target, data_dir: Path, out_dir: Path, *, draft_vocab: int | None = None, depth: int = 3, epochs: int = 2,
                 lr: float = 1e-3, batch_tokens: int = 4096, max_len: int = 384, validation_share: float = 0.02,
                 seed: int = 0, checkpoint_every: int = 50, checkpoint_dir: Path | None = None, progress=None,
                 log=print, mixed_precision: bool | None = None, init: Path | None = None,
                 more_data: list[Path] = ()) -> dict:
    """Train (or resume training) an EAGLE-3 head for `target` on the data in `data_dir` and
    `more_data` (made with the same aux layers); the head is written to `out_dir` (head.safetensors
    + head.json), the checkpoints to `checkpoint_dir` (default: `default_checkpoint_dir(out_dir)`),
    deleted once the head is written. `mixed_precision` (default: where bfloat16 is native,
    `native_bfloat16`): bfloat16 products in the training steps, 1.8× faster on an AVX-512 BF16 CPU
    (measured: 690 vs 390 tokens/s). `init`: a trained head folder to start from instead of random
    weights (more epochs, or new data); it must read the data's layers, and keeps all of its draft
    vocabulary. `draft_vocab`: its size (default 8192; with `init`, the head's, or larger: the head's
    vocabulary, all kept, grown to that size by the most frequent answer tokens it lacks, their LM
    head rows started by `grown_lm_head`)."""
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(out_dir)
    folders = [Path(data_dir), *map(Path, more_data)]
    if len({folder.resolve() for folder in folders}) < len(folders):
        raise SpecdecError("--more-data names a data folder twice (or --data's): each folder once")
    for folder in folders[1:]:
        if data_meta(folder, target) is None:
            raise SpecdecError(f"--more-data {folder}: no self-distillation data there (make it with "
                               f"`specdec train data --data {folder}`)")
    source = folders if more_data else data_dir  # (one folder: head.json records its path as before)
    start = load_head(init, "eagle3", target) if init is not None else None
    kept_ids = None if start is None else vocabulary_of(start[1])
    if kept_ids is not None and draft_vocab is not None and draft_vocab < len(kept_ids):
        raise SpecdecError(f"--init {init} drafts over its own {len(kept_ids)}-token vocabulary, which --draft-vocab "
                           f"{draft_vocab} cannot hold: drop --draft-vocab (or give a larger one to grow it), or "
                           "start from scratch")
    draft_vocab = draft_vocab or (DEFAULT_DRAFT_VOCAB if kept_ids is None else len(kept_ids))
    data = prepare(target, source, out_dir, draft_vocab, validation_share, seed, kept_ids)
    aux_layers = data_aux_layers(folders, data.train)
    net = target.net
    config = Eagle3Config.for_target(net.config, len(data.vocab_ids), aux_layers)
    head = Eagle3Head(config).float()
    head.set_vocabulary(data.vocab_ids)
    if start is not None:
        start_from(head, init, *start, target_rows=data.head_rows)
    objective = Eagle3Objective(head, net.embed, data.head_rows, net.lm_head_weight().float(), depth)
    if mixed_precision is None:
        mixed_precision = native_bfloat16(net.device)
    result = fit(head, objective, lambda val: validate(objective, val), data.train, data.validation, checkpoint_dir,
                 epochs=epochs, lr=lr, batch_tokens=batch_tokens, max_len=max_len, seed=seed,
                 checkpoint_every=checkpoint_every, progress=progress, log=log, mixed_precision=mixed_precision)
    info = {**data_info(target, source, data), "depth": depth, "epochs": epochs, "lr": lr,
            **({"init": str(init)} if init is not None else {}), "max_len": max_len,
            "batch_tokens": batch_tokens, "seed": seed, "mixed_precision": mixed_precision, **result}
    save_head(out_dir, "eagle3", config.to_dict(), head.state_dict(), info, target.net)
    remove_checkpoint(checkpoint_dir)
    return info


def vocabulary_of(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """[Vd] the target ids of a saved head's draft vocabulary (from its d2t offsets)."""
    offsets = weights["d2t"]
    return torch.arange(len(offsets)) + offsets


def start_from(head: Eagle3Head, folder: Path, meta: dict, weights: dict[str, torch.Tensor],
               target_rows: torch.Tensor) -> None:
    """Load a trained head's weights (`load_head` of `folder`) into `head`, whose vocabulary is set:
    the same as the trained head's, or grown from it (`grown_lm_head`); refusing one of another shape.
    target_rows: the target's LM head rows of `head`'s vocabulary [Vd, hidden]."""
    theirs, ours = Eagle3Config(**meta["config"]).to_dict(), head.config.to_dict()
    differ = {name: (theirs[name], ours[name]) for name in ours if theirs.get(name) != ours[name] and name != "draft_vocab"}
    if differ:
        raise SpecdecError(f"--init {folder}: its head differs from what this target and data give "
                           f"(theirs, ours): {differ}; start from scratch, or make the data with its --aux-layers")
    loaded = {name: tensor.float() if tensor.is_floating_point() else tensor for name, tensor in weights.items()}
    old_ids, new_ids = vocabulary_of(weights), head.vocab_ids
    loaded["lm_head.weight"] = grown_lm_head(loaded["lm_head.weight"], old_ids, new_ids, target_rows)
    loaded["d2t"], loaded["t2d"] = head.d2t.clone(), head.t2d.clone()  # the vocabulary set on `head`
    head.load_state_dict(loaded)


def grown_lm_head(rows: torch.Tensor, old_ids: torch.Tensor, new_ids: torch.Tensor,
                  target_rows: torch.Tensor) -> torch.Tensor:
    """A trained head's LM head rows [Vd', hidden] over `old_ids` [Vd'] carried over to the vocabulary
    `new_ids` [Vd] ⊇ old_ids (both ascending target ids): its own rows where it has them; for the new
    tokens, their target LM head rows (target_rows [Vd, hidden], the target's rows of new_ids) through
    the linear map that best takes the target's rows of the old tokens to the head's (least squares),
    so a new token starts where the head's geometry puts tokens like it. The same vocabulary gives
    the rows back unchanged."""
    at = torch.searchsorted(new_ids, old_ids)  # [Vd'] where each old token lies in the new vocabulary
    if not bool((new_ids[at.clamp(max=len(new_ids) - 1)] == old_ids).all()):
        raise ValueError("the new draft vocabulary must hold every token of the old one")
    if len(new_ids) == len(old_ids):
        return rows.clone()
    source = target_rows.detach().cpu().double()  # [Vd, hidden]
    mapping = torch.linalg.lstsq(source[at], rows.double().cpu()).solution  # [hidden, hidden]
    grown = (source @ mapping).float()  # [Vd, hidden]
    grown[at] = rows.cpu()
    return grown


def data_aux_layers(folders: list[Path], sequences) -> tuple[int, ...]:
    """The aux layers the data was made with (each folder's meta.json; all alike), checked against
    its features."""
    made = {Path(f): tuple(json.loads((Path(f) / META).read_text()).get("aux_layers") or ()) for f in folders}
    layers = made[Path(folders[0])]
    if not layers or sequences[0].aux_features is None:
        raise SpecdecError(f"{folders[0]} has no aux-layer features: make the data with `specdec train data` "
                           "(--aux-layers auto) to train an EAGLE-3 head")
    for folder, theirs in made.items():
        if theirs != layers:
            raise SpecdecError(f"{folder} was made with aux layers {list(theirs)}, {folders[0]} with {list(layers)}: "
                               "train on data made with the same --aux-layers")
    return layers
