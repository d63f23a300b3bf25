"""Training-time drafting: the head's chain of d predictions for every start position, in parallel.

At inference the head first reads true pairs (f_t, x_{t+1}) and then, for each drafted token, its own
predicted feature. A head trained only on true features sees, from the second drafted token on,
inputs it never saw in training. So training runs the chain: block 0 is the true pairs; block d
(d ≥ 1) at position t reads the prediction block d − 1 made at t − 1, with the true token x_{t+1},
and attends to what a draft d steps after the last true pair would see: the true pairs up to
t − d and its own chain (block d' at t − (d − d') for 1 ≤ d' ≤ d). Every block predicts f_{t+1},
hence x_{t+2}. (EAGLE-3 calls this training-time test.) Tokens are teacher-forced: along a chain
they equal the drafted ones exactly while every earlier draft was right, which is the only case in
which a later draft can be accepted.
"""

from __future__ import annotations

import torch


class GrowingCache:
    """Keys and values of the blocks already run (with their gradients), for the next block to attend to."""

    length = 0

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = keys if self.keys is None else torch.cat((self.keys, keys), dim=2)  # [B, Hkv, S, D]
        self.values = values if self.values is None else torch.cat((self.values, values), dim=2)
        return self.keys, self.values


def chain_mask(length: int, depth: int, device) -> torch.Tensor:
    """[T, (depth + 1) T] bool: what block `depth`'s item t may see among blocks 0..depth."""
    t = torch.arange(length, device=device)
    blocks = [t[None, :] <= (t[:, None] - depth)]  # true pairs up to t − depth
    for d in range(1, depth + 1):  # its own chain: block d at t − (depth − d)
        blocks.append(t[None, :] == (t[:, None] - (depth - d)))
    return torch.cat(blocks, dim=1)


def unrolled_predictions(head, features: torch.Tensor, next_embeds: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """Predicted features per block: [depth] tensors [B, T, hidden], block d at t predicting f_{t+1}.

    features [B, T, hidden] are the true f_t, next_embeds [B, T, hidden] the embeddings of x_{t+1}.
    Block d's items at t < d have no chain (they are computed, and must be masked out of losses)."""
    batch, length, _ = features.shape
    device = features.device
    positions = torch.arange(length, device=device).expand(batch, length)
    cache = GrowingCache()
    out = [head(features, next_embeds, positions, cache, mask=None, causal=True)]  # block 0
    for d in range(1, depth):
        # block d at t reads block d − 1's prediction at t − 1 (position 0 gets a zero feature; masked out)
        shifted = torch.cat((torch.zeros_like(out[-1][:, :1]), out[-1][:, :-1]), dim=1)
        mask = chain_mask(length, d, device)[None, None]  # [1, 1, T, (d + 1) T]; every item sees itself
        out.append(head(shifted, next_embeds, positions, cache, mask=mask, causal=False))
    return out
