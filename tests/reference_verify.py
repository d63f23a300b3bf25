"""The sampling rules of specdec/decode/verify.py written as plain loops, one row, position and child at a
time, consuming the random draws in the same order: tests/test_verify.py and tests/test_tree.py check the
vectorised rules equal to them, bit for bit."""

from __future__ import annotations

import torch

from specdec.decode.verify import tree_children_table
from specdec.sampling import sample
from specdec.tree import TokenTree


def speculative_sample_reference(
    draft_tokens: torch.Tensor,  # [B, γ]
    p: torch.Tensor,  # [B, γ+1, V]
    q: torch.Tensor | None,  # [B, γ, V] or None
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rule as `speculative_sample`, one row and one position at a time.

    It consumes the generator in the same order (all uniforms first, then one `sample` call over
    the stacked residuals) so that, seeded alike, both return identical tensors.
    """
    batch, gamma = draft_tokens.shape
    uniforms = torch.rand(batch, gamma, generator=generator, device=p.device)
    counts, residuals = [], []
    for b in range(batch):
        n = 0
        residual = p[b, gamma].clone()  # bonus: all accepted
        for i in range(gamma):
            x = int(draft_tokens[b, i])
            q_x = 1.0 if q is None else float(q[b, i, x])
            if float(uniforms[b, i]) * q_x < float(p[b, i, x]):
                n += 1
                continue
            q_i = torch.zeros_like(p[b, i]) if q is None else q[b, i]
            if q is None:
                q_i[x] = 1.0
            residual = torch.clamp(p[b, i] - q_i, min=0)
            residual = residual / residual.sum() if residual.sum() > 0 else p[b, i].clone()
            break
        counts.append(n)
        residuals.append(residual)
    next_token = sample(torch.stack(residuals), generator)
    return torch.tensor(counts, device=p.device), next_token


def tree_sample_reference(tree: TokenTree, p: torch.Tensor,
                          generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`tree_sample` one row and one child at a time, consuming the same draws."""
    batch = p.shape[0]
    kids = tree_children_table(tree, "cpu").tolist()
    max_depth = max(tree.depths(), default=0)
    uniforms = torch.rand(max_depth + 1, len(kids[0]), batch, generator=generator, device=p.device)
    paths, finals = [], []
    for b in range(batch):
        at, path = 0, []
        for depth in range(max_depth + 1):
            r = p[b, at].clone()
            chosen = None
            for j, child in enumerate(kids[at]):
                if child < 0:
                    break
                x = tree.tokens[child - 1]
                if float(uniforms[depth, j, b]) < float(r[x]):
                    chosen = child
                    break
                r[x] = 0.0
                r = r / r.sum().clamp(min=1e-30)
            if chosen is None:
                finals.append(r)
                break
            path.append(chosen - 1)
            at = chosen
        paths.append(path + [-1] * (max(1, max_depth) - len(path)))
    next_token = sample(torch.stack(finals), generator)
    return torch.tensor(paths, device=p.device), next_token
