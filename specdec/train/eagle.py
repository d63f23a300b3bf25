"""Training an EAGLE head on self-distilled data (`distill.py`).

Loss per block of the unrolled chain (`unroll.py`): SmoothL1 between the predicted and the true
feature f_{t+1}, plus 0.1 × cross-entropy of the draft distribution (the target's LM head rows of
the draft vocabulary applied to the prediction) against x_{t+2}, the target's own (greedy) next
token; only positions whose x_{t+2} belongs to an answer count. The inputs' true features get
uniform noise (±`noise`), as in EAGLE, so the head tolerates its own imprecise predictions.

Validation: the greedy chain acceptance the head would get on held-out sequences — for every start
position, how many of its drafts in a row equal the target's tokens (depth-d drafts from the same
unrolled pass) — reported as α per depth (conditional) and the MAT a chain of `depth` would reach.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.control.theory import expected_tokens_by_position
from specdec.heads.eagle import EagleConfig, EagleHead
from specdec.heads.files import save_head
from specdec.train.loop import (
    Batch,
    data_info,
    default_checkpoint_dir,
    draft_index,
    fit,
    prepare,
    remove_checkpoint,
)
from specdec.train.unroll import unrolled_predictions

CE_WEIGHT = 0.1
IGNORE = -100


class EagleObjective:
    """Inputs, predictions and losses of one batch (shared by training and validation)."""

    def __init__(self, head: EagleHead, embed: torch.nn.Embedding, head_rows: torch.Tensor, vocab_size: int,
                 depth: int, noise: float) -> None:
        self.head, self.embed, self.head_rows = head, embed, head_rows  # head_rows: [Vd, hidden], frozen
        self.depth, self.noise = depth, noise
        self.to_draft = draft_index(head.vocab_ids, vocab_size, IGNORE)  # [V] target id → draft index

    def __call__(self, batch: Batch, train: bool) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
        """(loss, per-block correct [B, T'] bool, per-block counted [B, T'] bool) with T' = T − 2."""
        features = batch.features[:, :-2]  # [B, T', hidden]: f_t
        if train and self.noise:
            features = features + (torch.rand_like(features) * 2 - 1) * self.noise
        with torch.no_grad():
            next_embeds = self.embed(batch.tokens[:, 1:-1]).float()  # [B, T', hidden]: x_{t+1}
        target_features = batch.features[:, 1:-1]  # [B, T', hidden]: f_{t+1}
        labels = self.to_draft[batch.tokens[:, 2:]]  # [B, T']: x_{t+2} in the draft vocabulary
        base = batch.valid[:, 2:] & batch.answer[:, 2:]  # x_{t+2} is a real answer token
        predictions = unrolled_predictions(self.head, features, next_embeds, self.depth)
        loss = torch.zeros(())
        corrects, counted = [], []
        for d, predicted in enumerate(predictions):
            mask = base.clone()
            mask[:, :d] = False  # block d at t < d has no chain
            logits = predicted @ self.head_rows.T  # [B, T', Vd]
            n = mask.sum().clamp(min=1)
            regression = (F.smooth_l1_loss(predicted, target_features, reduction="none").mean(-1) * mask).sum() / n
            ce_labels = labels.masked_fill(~mask, IGNORE)
            ce = F.cross_entropy(logits.flatten(0, 1), ce_labels.flatten(), ignore_index=IGNORE, reduction="sum") / n
            loss = loss + regression + CE_WEIGHT * ce
            corrects.append((logits.argmax(-1) == labels) & mask)
            counted.append(mask)
        return loss / len(predictions), corrects, counted


def chain_acceptance(corrects: list[torch.Tensor], counted: list[torch.Tensor]) -> tuple[list[int], list[int]]:
    """For chains starting at every t: (chains reaching depth d, chains accepted through depth d), per d.
    The chain from t has its depth-d draft at block d, position t + d."""
    depth = len(corrects)
    length = corrects[0].shape[1]
    reached, accepted = [0] * depth, [0] * depth
    alive = torch.ones_like(corrects[0][:, : length])
    for d in range(depth):
        c = torch.zeros_like(alive)
        m = torch.zeros_like(alive)
        c[:, : length - d] = corrects[d][:, d:]
        m[:, : length - d] = counted[d][:, d:]
        alive = alive & m
        reached[d] += int(alive.sum())
        alive = alive & c
        accepted[d] += int(alive.sum())
    return reached, accepted


def validate(objective: EagleObjective, val_batches: list[Batch]) -> dict:
    losses, reached, accepted = [], None, None
    for batch in val_batches:
        loss, corrects, counted = objective(batch, train=False)
        losses.append(float(loss))
        r, a = chain_acceptance(corrects, counted)
        reached = r if reached is None else [x + y for x, y in zip(reached, r)]
        accepted = a if accepted is None else [x + y for x, y in zip(accepted, a)]
    alphas = [a / r if r else 0.0 for a, r in zip(accepted, reached)]
    return {"loss": round(sum(losses) / max(1, len(losses)), 4), "alpha_per_depth": [round(a, 4) for a in alphas],
            "chain_mat": round(expected_tokens_by_position(alphas), 3)}


def train_eagle(target, data_dir: Path, out_dir: Path, *, draft_vocab: int = 8192, depth: int = 3, epochs: int = 4,
                lr: float = 1e-3, batch_tokens: int = 4096, max_len: int = 384, noise: float = 0.1,
                validation_share: float = 0.05, seed: int = 0, checkpoint_every: int = 50,
                checkpoint_dir: Path | None = None, progress=None, log=print) -> dict:
    """Train (or resume training) an EAGLE head for `target` on the data in `data_dir`; the head is
    written to `out_dir` (head.safetensors + head.json), the checkpoints to `checkpoint_dir`
    (default: `default_checkpoint_dir(out_dir)`), deleted once the head is written."""
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(out_dir)
    data = prepare(target, data_dir, out_dir, draft_vocab, validation_share, seed)
    net = target.net
    config = EagleConfig.for_target(net.config, len(data.vocab_ids))
    head = EagleHead(config).float()
    head.vocab_ids.copy_(data.vocab_ids)
    objective = EagleObjective(head, net.embed, data.head_rows, net.vocab_size, depth, noise)
    result = fit(head, objective, lambda val: validate(objective, val), data.train, data.validation, checkpoint_dir, epochs=epochs,
                 lr=lr, batch_tokens=batch_tokens, max_len=max_len, seed=seed, checkpoint_every=checkpoint_every,
                 progress=progress, log=log)
    info = {**data_info(target, data_dir, data), "depth": depth, "epochs": epochs, "lr": lr,
            "batch_tokens": batch_tokens, "noise": noise, "seed": seed, **result}
    save_head(out_dir, "eagle", config.to_dict(), head.state_dict(), info, target.net)
    remove_checkpoint(checkpoint_dir)
    return info
