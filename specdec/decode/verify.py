"""Verification of a chain or a tree of drafted tokens: pure functions, no model calls.

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
mismatch (or after the last draft). Ties go to the lowest id (as `torch.argmax`; `sampling.argmax`).

`verify_round` is the engine's entry: one row's round, chain or tree, greedy or sampled, to a `Verdict`.
The functions below it take a batch of independent rounds (B rows; the engine passes B = 1, the statistical
tests pass B = 200,000). `speculative_sample` is the fast path; tests/reference_verify.py holds a
plain loop with the same random draws, tested equal to it. `point_mass_sample` is the engine's rule for
one row's point-mass chain at T > 0: the same draws and results as `speculative_sample` over the whole
p, but it computes p only at the positions the test reaches (at T = 1 most lookup drafts are rejected
at the first, and the processed p of the others was most of the round's acceptance time).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.sampling import SamplingParams, argmax, logits_to_probs, sample
from specdec.tree import TokenTree


@dataclass
class Verdict:
    """What one row's round keeps: the accepted drafts and the target's own next token."""

    path: list[int]  # the accepted drafts' indices in the draft (a chain: 0..n-1; a tree: its nodes, root down)
    next_token: int  # the recovered token, or the bonus token where `full`
    full: bool  # every draft position was accepted (a chain's whole draft, a tree's walk down to a leaf)
    p: torch.Tensor | None  # [k+1, V] the target's distributions as the sampled rule computed them (None:
    # greedy, or a point mass whose p was computed only where the test reached)


def verify_round(draft_tokens: list[int],
                 q: torch.Tensor | None,  # [k, V] the drafter's distributions; None: a lookup's point mass
                 tree: TokenTree | None,  # the draft's tree (None: a chain)
                 logits: torch.Tensor,  # [k+1, V] (a tree: [N+1, V]) the pass over the last committed token and the draft
                 params: SamplingParams,
                 generator: torch.Generator,
                 details: dict | None = None,  # given: what the sampling rule drew (for traces)
                 ) -> Verdict:
    """One row's round, by the rule that fits it: greedy or sampled, a chain or a tree, a drafter's
    distribution or a lookup's point mass (at T > 0 its p computed only where the test reaches)."""
    if tree is not None:
        return _verify_tree_round(tree, logits, params, generator, details)
    p = None
    if not params.greedy and q is None and draft_tokens:
        num_accepted, next_token = point_mass_sample(draft_tokens, logits, params, generator, details)
    else:
        draft_ids = torch.tensor([draft_tokens], device=logits.device, dtype=torch.long)  # [1, k]
        if params.greedy:
            num_accepted, next_token = verify_greedy(draft_ids, logits[None])
        else:
            p = logits_to_probs(logits[None], params)  # [1, k+1, V]
            num_accepted, next_token = speculative_sample(draft_ids, p, None if q is None else q[None], generator,
                                                          details)
    n = int(num_accepted)
    return Verdict(list(range(n)), int(next_token), n == len(draft_tokens), None if p is None else p[0])


def _verify_tree_round(tree: TokenTree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
                       details: dict | None) -> Verdict:
    """`verify_round` for a tree: logits [N+1, V]."""
    if params.greedy:
        path, next_token = verify_tree_greedy(tree, logits)
        p = None
    else:
        p = logits_to_probs(logits[None], params)  # [1, N+1, V]
        walked, next_token = tree_sample(tree, p, generator, details)
        path = [node for node in walked[0].tolist() if node >= 0]
        p = p[0]
    full = not tree.children(path[-1] if path else -1)  # the walk reached a leaf
    return Verdict(path, int(next_token), full, p)


def verify_greedy(
    draft_tokens: torch.Tensor,  # [B, γ] long
    target_logits: torch.Tensor,  # [B, γ+1, V] (logits or probabilities: only the argmax is used)
) -> tuple[torch.Tensor, torch.Tensor]:  # (num_accepted [B], next_token [B])
    target_choice = argmax(target_logits)  # [B, γ+1]
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
    if gamma == 0:  # a plain round: the next token is drawn from p_1 (the residual's arithmetic would be
        next_token = sample(p[:, 0], generator)  # a third of the round's sampling time, for nothing)
        if details is not None:
            details.update(uniforms=draft_tokens.new_zeros(batch, 0, dtype=p.dtype), residual=p[:, 0])
        return torch.zeros(batch, dtype=torch.long, device=p.device), next_token
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
    at = num_accepted.clamp(max=gamma - 1)  # [B]
    if q is None:
        q_next = torch.nn.functional.one_hot(draft_tokens[rows, at], p.shape[-1]).to(p.dtype)
    else:
        q_next = q[rows, at]  # [B, V]
    q_next = q_next * rejected[:, None]  # the bonus position has no draft: residual = p
    residual = _normalised((p_next - q_next).clamp(min=0), p_next)  # [B, V]
    next_token = sample(residual, generator)  # [B]
    if details is not None:
        details.update(uniforms=uniforms, residual=residual)
    return num_accepted, next_token


def point_mass_sample(
    draft_tokens: list[int],  # γ ≥ 1 tokens of one row's point-mass proposal (q = None)
    logits: torch.Tensor,  # [γ+1, V] the target's logits at the row's positions
    params: SamplingParams,  # not greedy
    generator: torch.Generator,
    details: dict | None = None,  # as in `speculative_sample`
) -> tuple[int, int]:  # (num_accepted, next_token)
    """`speculative_sample(tensor([draft_tokens]), logits_to_probs(logits[None], params), None, ...)`:
    the same uniforms (all γ first), the same residual and draw, so seeded alike the same tokens; p_i
    is computed only for the positions the test reaches (one row of `logits_to_probs` each: the
    transform is row by row)."""
    gamma = len(draft_tokens)
    uniforms = torch.rand(1, gamma, generator=generator, device=logits.device)  # [1, γ]
    bounds = uniforms[0].tolist()
    for i, token in enumerate(draft_tokens):
        p_i = logits_to_probs(logits[i:i + 1], params)  # [1, V]
        if bounds[i] < float(p_i[0, token]):  # u < p/q with q = 1
            continue
        residual = p_i.clone()
        residual[0, token] = 0.0  # max(0, p_i − one-hot(x_i)): p_i without x_i
        num_accepted, residual = i, _normalised(residual, p_i)
        break
    else:  # every draft accepted: the bonus position, residual = p
        p_last = logits_to_probs(logits[gamma:], params)  # [1, V]
        num_accepted, residual = gamma, _normalised(p_last, p_last)
    if details is not None:
        details.update(uniforms=uniforms, residual=residual)
    return num_accepted, int(sample(residual, generator))


def _normalised(residual: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """norm(residual) [B, V], row by row; p [B, V] where a row has no mass. A rejection implies p != q,
    so the mass is positive; the guard only catches float round-off."""
    mass = residual.sum(-1, keepdim=True)  # [B, 1]
    return torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)


# --- token trees ---------------------------------------------------------------------------------
#
# A tree round scores the root (the last committed token) and N draft nodes in one pass; p[:, j] is
# the target's distribution for the children of input j (0: the root, i + 1: node i).
#
# Greedy: from the root, move to the child holding argmax p while there is one; emit argmax p at the
# node where the walk stops.
#
# Sampling (multi-candidate speculative sampling, as in SpecInfer, with point-mass candidates): at
# the current node, with r = p at that node, test its children c_1, c_2, ... in order: accept c_j
# with probability r(c_j); if it is rejected, set r(c_j) = 0 and renormalise r, and test the next
# child. So c_j, tested after c_1..c_{j-1} were rejected, is accepted with probability
# r(c_j) = p(c_j) / (1 − Σ_{i<j} p(c_i)), not p(c_j) (the trace records r(c_j)). If a child is
# accepted, move to it and start again with p there; if none is, emit a token drawn from the final r.
# Why it is exact: testing c_1 with probability r(c_1) and otherwise drawing
# from r without c_1 is a way of drawing from r (P(c_1) = r(c_1); P(x ≠ c_1) = (1 − r(c_1)) · r(x) /
# (1 − r(c_1)) = r(x)), and by induction so is the whole sequence of tests; so each emitted token
# (accepted child or final draw) follows p at its context, whatever candidates the drafter chose, as
# long as its choice does not depend on this round's random draws. Children are candidates fixed
# before the pass (the drafter's top-k), i.e. point masses: q is not needed. With q-sampled
# candidates the min(1, p/q) test would accept more often; it is not used for trees here.


def tree_children_table(tree: TokenTree, device) -> torch.Tensor:
    """[N + 1, M] input index of each input's children (-1 padded), M = the most children of any input."""
    kids: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for i, parent in enumerate(tree.parents):
        kids[parent + 1].append(i + 1)
    width = max(1, max(len(k) for k in kids))
    return torch.tensor([k + [-1] * (width - len(k)) for k in kids], device=device)


def verify_tree_greedy(tree: TokenTree,
                       target_logits: torch.Tensor,  # [N+1, V]
                       ) -> tuple[list[int], int]:  # (accepted node indices, next token)
    choice = argmax(target_logits).tolist()  # [N+1]
    kids = tree_children_table(tree, "cpu").tolist()
    path, at = [], 0
    while True:
        nxt = next((k for k in kids[at] if k >= 0 and tree.tokens[k - 1] == choice[at]), None)
        if nxt is None:
            return path, choice[at]
        path.append(nxt - 1)
        at = nxt


def tree_sample(tree: TokenTree,
                p: torch.Tensor,  # [B, N+1, V] target probabilities (rows: independent rounds, same tree)
                generator: torch.Generator,
                details: dict | None = None,  # given: filled with what each test used (for traces), below
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampling rule above for B rounds at once. Returns (accepted [B, D] node indices along each
    row's path, -1 after its end; next_token [B]). Uniforms are drawn [depth + 1, M, B] up front, so
    a plain loop (tests/reference_verify.py) can consume the same draws.

    `details`, when given, receives per row and node what the node's test used (NaN for nodes the
    row never tested): "accept_probabilities" [B, N], r(x) = p(x) / (1 − Σ p(rejected earlier
    siblings)); "uniforms" [B, N], the draw u (accepted when u < r(x)); "tested_against" [B, N, V],
    r itself; and "residual" [B, V], the r each row's next token was drawn from."""
    batch, inputs, vocab = p.shape
    device = p.device
    kids = tree_children_table(tree, device)  # [N+1, M]
    tokens = torch.tensor([0, *tree.tokens], device=device)  # [N+1]; index 0 (the root) unused
    max_depth = max(tree.depths(), default=0)
    uniforms = torch.rand(max_depth + 1, kids.shape[1], batch, generator=generator, device=device)
    rows = torch.arange(batch, device=device)
    at = torch.zeros(batch, dtype=torch.long, device=device)  # [B] current input index
    accepted = torch.full((batch, max(1, max_depth)), -1, dtype=torch.long, device=device)
    final = torch.zeros(batch, vocab, dtype=p.dtype, device=device)  # [B, V] the r each row emits from
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    if details is not None:
        nan = float("nan")
        accept_probabilities = torch.full((batch, len(tree)), nan, dtype=p.dtype, device=device)  # [B, N]
        tested_uniforms = torch.full((batch, len(tree)), nan, dtype=uniforms.dtype, device=device)  # [B, N]
        tested_against = torch.full((batch, len(tree), vocab), nan, dtype=p.dtype, device=device)  # [B, N, V]
    for depth in range(max_depth + 1):
        r = p[rows, at].clone()  # [B, V]
        moved = torch.zeros_like(alive)
        target = at.clone()
        for j in range(kids.shape[1]):
            child = kids[at, j]  # [B]
            testing = alive & ~moved & (child >= 0)
            x = tokens[child.clamp(min=0)]  # [B]
            if details is not None:  # before the test can remove x from r
                tested_rows, tested_nodes = rows[testing], child[testing] - 1  # [T], [T]
                accept_probabilities[tested_rows, tested_nodes] = r[tested_rows, x[testing]]
                tested_uniforms[tested_rows, tested_nodes] = uniforms[depth, j, testing]
                tested_against[tested_rows, tested_nodes] = r[testing]
            take = testing & (uniforms[depth, j] < r[rows, x])
            moved |= take
            target = torch.where(take, child, target)
            drop = testing & ~take
            r[rows[drop], x[drop]] = 0.0
            r = torch.where(drop[:, None], r / r.sum(-1, keepdim=True).clamp(min=1e-30), r)
        stop = alive & ~moved
        final[stop] = r[stop]
        alive &= moved
        if depth < accepted.shape[1]:
            accepted[:, depth] = torch.where(moved, target - 1, accepted[:, depth])
        at = torch.where(moved, target, at)
        if not bool(alive.any()):
            break
    if details is not None:
        details.update(accept_probabilities=accept_probabilities, uniforms=tested_uniforms,
                       tested_against=tested_against, residual=final)
    return accepted, sample(final, generator)
