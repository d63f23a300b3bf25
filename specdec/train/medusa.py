"""Training Medusa heads on self-distilled data (`distill.py`).

Head k at token t learns x_{t+k+1}, the target's own token k + 1 places ahead, by cross-entropy over
the draft vocabulary, weighted 0.8^(k−1) (later heads are harder and matter less, as in Medusa);
only labels inside an answer count. The target stays frozen; its features come from the data.

Validation: per head the top-1 accuracy, and the conditional rate of a chain of first choices
(head k right given heads 1..k−1 were), with the MAT such a chain reaches.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.control.theory import expected_tokens_by_position
from specdec.heads.files import save_head
from specdec.heads.medusa import MedusaConfig, MedusaHeads
from specdec.train.eagle import IGNORE
from specdec.train.loop import (
    Batch,
    data_info,
    default_checkpoint_dir,
    draft_index,
    fit,
    prepare,
    remove_checkpoint,
)

HEAD_DECAY = 0.8


class MedusaObjective:
    def __init__(self, heads: MedusaHeads, head_rows: torch.Tensor, vocab_size: int) -> None:
        self.heads, self.head_rows = heads, head_rows  # head_rows: [Vd, hidden], frozen
        self.to_draft = draft_index(heads.vocab_ids, vocab_size, IGNORE)  # [V] target id → draft index

    def __call__(self, batch: Batch, train: bool) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """(loss, per head correct [B, T] bool, per head counted [B, T] bool)."""
        guesses = self.heads(batch.features)  # [K, B, T, hidden]
        loss = torch.zeros(())
        corrects, counted = [], []
        length = batch.tokens.shape[1]
        for k, guess in enumerate(guesses, start=1):
            labels = torch.full_like(batch.tokens, IGNORE)  # [B, T]: x_{t+k+1}
            mask = torch.zeros_like(batch.valid)
            if length > k + 1:
                labels[:, : length - k - 1] = self.to_draft[batch.tokens[:, k + 1:]]
                mask[:, : length - k - 1] = batch.valid[:, k + 1:] & batch.answer[:, k + 1:]
            logits = guess @ self.head_rows.T  # [B, T, Vd]
            n = mask.sum().clamp(min=1)
            ce = F.cross_entropy(logits.flatten(0, 1), labels.masked_fill(~mask, IGNORE).flatten(),
                                 ignore_index=IGNORE, reduction="sum") / n
            loss = loss + HEAD_DECAY ** (k - 1) * ce
            corrects.append((logits.argmax(-1) == labels) & mask)
            counted.append(mask)
        return loss, corrects, counted


def validate(objective: MedusaObjective, val_batches: list[Batch]) -> dict:
    heads = objective.heads.config.num_heads
    right, seen, reached, accepted = [0] * heads, [0] * heads, [0] * heads, [0] * heads
    for batch in val_batches:
        _, corrects, counted = objective(batch, train=False)
        alive = torch.ones_like(corrects[0])
        for k in range(heads):
            right[k] += int(corrects[k].sum())
            seen[k] += int(counted[k].sum())
            alive = alive & counted[k]
            reached[k] += int(alive.sum())
            alive = alive & corrects[k]
            accepted[k] += int(alive.sum())
    alphas = [a / r if r else 0.0 for a, r in zip(accepted, reached)]
    return {"top1_per_head": [round(r / s, 4) if s else 0.0 for r, s in zip(right, seen)],
            "alpha_per_depth": [round(a, 4) for a in alphas], "chain_mat": round(expected_tokens_by_position(alphas), 3)}


def train_medusa(target, data_dir: Path, out_dir: Path, *, num_heads: int = 4, draft_vocab: int = 8192, epochs: int = 4,
                 lr: float = 1e-3, batch_tokens: int = 4096, max_len: int = 384, validation_share: float = 0.05,
                 seed: int = 0, checkpoint_every: int = 50, checkpoint_dir: Path | None = None, progress=None,
                 log=print) -> dict:
    """Train (or resume training) Medusa heads for `target` on the data in `data_dir`, written to `out_dir`;
    checkpoints as in `train_eagle`."""
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(out_dir)
    data = prepare(target, data_dir, out_dir, draft_vocab, validation_share, seed)
    config = MedusaConfig(target.net.config.hidden_size, target.vocab_size, num_heads, len(data.vocab_ids))
    heads = MedusaHeads(config).float()
    heads.vocab_ids.copy_(data.vocab_ids)
    objective = MedusaObjective(heads, data.head_rows, target.vocab_size)
    result = fit(heads, objective, lambda val: validate(objective, val), data.train, data.validation, checkpoint_dir, epochs=epochs,
                 lr=lr, batch_tokens=batch_tokens, max_len=max_len, seed=seed, checkpoint_every=checkpoint_every,
                 progress=progress, log=log)
    info = {**data_info(target, data_dir, data), "epochs": epochs, "lr": lr, "batch_tokens": batch_tokens,
            "seed": seed, **result}
    save_head(out_dir, "medusa", config.to_dict(), heads.state_dict(), info, target.net)
    remove_checkpoint(checkpoint_dir)
    return info
