"""Verification of a chain of drafted tokens: pure functions, no model calls.

Notation, as in the papers (Leviathan et al. 2022; Chen et al. 2023): **p is the target's**
distribution and **q the draft's**. A round drafts γ tokens x_1..x_γ; the target scores the context
followed by them in one pass and gives p_1..p_{γ+1} (p_i is the target's distribution for the i-th
new position; `p[:, i-1]` in code).

- accepted tokens: the longest prefix of the draft that passes the test below;
- recovered token: at the first rejected position i, a token drawn from the residual
  norm(max(0, p_i − q_i)) — the target's correction;
- bonus token: when all γ drafts are accepted, a token drawn from p_{γ+1};
- output of a round: the accepted tokens followed by one recovered or bonus token ("next token").

Speculative sampling accepts x_i with probability min(1, p_i(x_i) / q_i(x_i)). This makes the output
follow p exactly: P(output x) = min(p(x), q(x)) + P(reject)·residual(x) = p(x). A point-mass
proposal (q = None, from lookup drafters) is the case q_i = one-hot(x_i): accept with probability
p_i(x_i), else draw from p_i with x_i removed, renormalised.

Greedy verification accepts x_i while it equals argmax p_i, then emits argmax p at the first
mismatch (or after the last draft). Ties go to the lowest id (`torch.argmax`).

Each function takes a batch of independent rounds (B rows; the engine passes B = 1, the statistical
tests pass B = 200,000). `speculative_sample` is the fast path; `speculative_sample_reference` is a
plain loop with the same random draws, tested equal to it.
"""

from __future__ import annotations

import torch


def verify_greedy(
    draft_tokens: torch.Tensor,  # [B, γ] long
    target_logits: torch.Tensor,  # [B, γ+1, V] (logits or probabilities: only the argmax is used)
) -> tuple[torch.Tensor, torch.Tensor]:  # (num_accepted [B], next_token [B])
    target_choice = target_logits.argmax(-1)  # [B, γ+1]
    gamma = draft_tokens.shape[1]
    matches = (draft_tokens == target_choice[:, :gamma]).long()  # [B, γ]
    num_accepted = matches.cumprod(dim=1).sum(dim=1)  # [B]
    next_token = target_choice.gather(1, num_accepted[:, None]).squeeze(1)  # [B]
    return num_accepted, next_token


def speculative_sample(
    draft_tokens: torch.Tensor,  # [B, γ] long, x_i drawn from q_i
    p: torch.Tensor,  # [B, γ+1, V] target probabilities
    q: torch.Tensor | None,  # [B, γ, V] draft probabilities; None = point-mass proposal
    generator: torch.Generator,
    details: dict | None = None,  # given: filled with "uniforms" [B, γ] and "residual" [B, V] (for traces)
) -> tuple[torch.Tensor, torch.Tensor]:  # (num_accepted [B], next_token [B])
    batch, gamma = draft_tokens.shape
    rows = torch.arange(batch, device=p.device)
    uniforms = torch.rand(batch, gamma, generator=generator, device=p.device)  # [B, γ]
    p_draft = p[:, :gamma].gather(2, draft_tokens[..., None]).squeeze(2)  # [B, γ]: p_i(x_i)
    q_draft = (
        torch.ones_like(p_draft) if q is None else q.gather(2, draft_tokens[..., None]).squeeze(2)
    )  # [B, γ]: q_i(x_i)
    accepted = uniforms * q_draft < p_draft  # u < p/q, written without dividing by q
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # [B]

    p_next = p[rows, num_accepted]  # [B, V]: p at the first rejected position, or p_{γ+1}
    rejected = num_accepted < gamma  # [B]
    if gamma == 0:
        q_next = torch.zeros_like(p_next)
    else:
        at = num_accepted.clamp(max=gamma - 1)  # [B]
        if q is None:
            q_next = torch.nn.functional.one_hot(draft_tokens[rows, at], p.shape[-1]).to(p.dtype)
        else:
            q_next = q[rows, at]  # [B, V]
        q_next = q_next * rejected[:, None]  # the bonus position has no draft: residual = p
    residual = (p_next - q_next).clamp(min=0)  # [B, V]
    mass = residual.sum(-1, keepdim=True)  # [B, 1]
    # A rejection implies p != q, so mass > 0; the guard only catches float round-off.
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_next)
    next_token = torch.multinomial(residual, 1, generator=generator).squeeze(1)  # [B]
    if details is not None:
        details.update(uniforms=uniforms, residual=residual)
    return num_accepted, next_token


def speculative_sample_reference(
    draft_tokens: torch.Tensor,  # [B, γ]
    p: torch.Tensor,  # [B, γ+1, V]
    q: torch.Tensor | None,  # [B, γ, V] or None
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rule as `speculative_sample`, one row and one position at a time.

    It consumes the generator in the same order (all uniforms first, then one multinomial call over
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
    next_token = torch.multinomial(torch.stack(residuals), 1, generator=generator).squeeze(1)
    return torch.tensor(counts, device=p.device), next_token

