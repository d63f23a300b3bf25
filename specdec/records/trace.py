"""A round-by-round record of a run: what was drafted, how likely it was, what the target kept.

Opt-in (`GenerationConfig(trace=True)`); with it off the engine builds none of this. Each round's
record holds, per drafted token x_i: q_i(x_i) (None for lookup drafters, whose proposal is a point
mass: q = 1), p_i(x_i) under the sampling settings, the probability the rule accepted it with
(min(1, p/q) in a chain), the uniform draw u it was tested against (sampling only; greedy accepts
while x_i is the argmax), and the verdict; then the token the target added (its correction at a
rejection, drawn from the residual norm(max(0, p − q)), or its bonus after a full acceptance) with
the top of the distribution it came from, and the round's timings.

A token tree round (`trace_tree_round`) lists every candidate the rule tested, in the order it
tested them: along the accepted path each node's children up to the accepted one, then all children
of the node where the walk stopped. A child tested after rejected siblings was accepted with
probability r(x) = p(x) / (1 − Σ p(rejected siblings)) (`verify.tree_sample`), which is what it
records. `specdec explain` renders the records as HTML; the terminal colours of `specdec generate`
come from the same records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache

import torch

from specdec.tree import TokenTree

TOP_ENTRIES = 8  # entries of each distribution kept for the bar charts

# How a committed token came about (the terminal and the explain page colour them apart).
TARGET = "target"  # a plain target step: the prefill's token, or a round with nothing drafted
ACCEPTED = "accepted"  # a drafted token the target accepted (also that token's verdict)
CORRECTED = "corrected"  # the target's replacement for the first rejected draft
BONUS = "bonus"  # the target's extra token after all drafts were accepted

REJECTED, DISCARDED = "rejected", "discarded"  # the other verdicts of a drafted token (ACCEPTED above)


@dataclass
class TokenProb:
    id: int
    text: str
    prob: float


@dataclass
class PositionTrace:
    """One drafted token x_i (a chain's token, or a token tree's tested candidate) and the test it went through."""

    token: int
    text: str
    depth: int  # its draft position: 1 for the first token after the committed ones
    q: float | None  # q_i(x_i); None: a point-mass proposal (q = 1; every tree candidate)
    p: float  # p_i(x_i) under the sampling settings (greedy: 1 for the argmax, else 0)
    accept_probability: float  # what the rule accepted it with: min(1, p/q); a tree candidate r(x), see above
    uniform: float | None  # u, accepted when u < accept_probability (sampling only)
    verdict: str  # ACCEPTED, REJECTED (the first that failed), DISCARDED (after a rejection: never tested)
    target_top: list[TokenProb]  # the target's most probable tokens at this position
    draft_top: list[TokenProb]  # the draft's (empty for a point-mass proposal)
    node: int | None = None  # a tree candidate's node index (TreeTrace); None in a chain
    # a tree candidate tested after rejected siblings: the top of the r (p without them, renormalised)
    # it was tested against; otherwise empty (tested against p)
    residual_top: list[TokenProb] = field(default_factory=list)


@dataclass
class TreeTrace:
    """A tree round's whole draft (its `positions` are the candidates the rule tested)."""

    tokens: list[int]  # node i's token
    texts: list[str]
    parents: list[int]  # node i's parent node, −1 for a child of the last committed token
    path: list[int]  # the accepted nodes, root to leaf


@dataclass
class RoundTrace:
    index: int  # 0 = the prefill
    drafter: str | None  # None: a plain step (the prefill, or a round with nothing drafted)
    gamma: int  # draft length the policy asked for
    reason: str  # why the policy chose it
    positions: list[PositionTrace]
    accepted: int
    drafted: int  # draft positions: a chain's length, a tree's depth (as GenerationStats counts them)
    verified_tokens: int  # draft tokens the pass verified: a chain's length, a tree's node count
    next_token: int  # the target's own token: correction, bonus or plain step
    next_text: str
    next_kind: str  # CORRECTED, BONUS or TARGET
    next_from: str  # "residual" (norm(max(0, p − q)) at a rejection; a tree: p without the rejected children) or "target" (p)
    next_top: list[TokenProb]  # the top of the distribution the next token came from
    committed: list[int] = field(default_factory=list)  # what the round committed (an end of sequence, a stop or the budget can cut it)
    texts: list[str] = field(default_factory=list)  # the text each committed token added to the output (may be "")
    tail: str = ""  # the last round only: text held back until the end (a partial stop string, a split character)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    tree: TreeTrace | None = None  # a tree round's whole draft

    def to_dict(self) -> dict:
        return {**asdict(self), "kinds": self.kinds()}

    def kinds(self) -> list[str]:
        """How each committed token came about: "accepted" drafts, then the target's own token."""
        return ([ACCEPTED] * self.accepted + [self.next_kind])[:len(self.committed)]


def top_entries(probs: torch.Tensor, tokenizer, k: int = TOP_ENTRIES) -> list[list[TokenProb]]:
    """probs [R, V] → per row the k most probable tokens (zero-probability entries left out); one
    top-k call and one transfer to Python for all rows."""
    values, ids = torch.topk(probs.float(), min(k, probs.shape[-1]), dim=-1)  # [R, k]
    return [[TokenProb(i, token_text(tokenizer, i), v) for v, i in zip(row_values, row_ids) if v > 0]
            for row_values, row_ids in zip(values.tolist(), ids.tolist())]


@lru_cache(maxsize=1 << 17)
def token_text(tokenizer, token_id: int) -> str:
    """One token's text (cached: a round shows dozens of tokens, and decoding each costs more than the rest of the trace)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


def trace_round(index: int, drafter: str | None, gamma: int, reason: str, draft_tokens: list[int],
                q: torch.Tensor | None, p: torch.Tensor, shown: torch.Tensor, greedy: bool, accepted: int,
                next_token: int, next_kind: str, tokenizer, uniforms: torch.Tensor | None = None,
                residual: torch.Tensor | None = None) -> RoundTrace:
    """One chain round's record (the prefill and a plain step: a chain of none).

    q [k, V] (None: point mass), p [k+1, V] the distributions the rule used (greedy: one-hot
    argmax), shown [k+1, V] what the charts show (p itself, or the softmax of the logits when
    greedy), uniforms [k] the draws (sampling), residual [V] the distribution the next token was
    drawn from at a rejection.
    """
    k = len(draft_tokens)
    from_residual = residual is not None and accepted < k and not greedy
    next_dist = residual if from_residual else shown[accepted]
    target_tops = top_entries(torch.cat([shown[:k], next_dist[None]]), tokenizer)  # k positions, then the next token's
    draft_tops = top_entries(q[:k], tokenizer) if q is not None and k else [[] for _ in range(k)]
    p_drafts = p[torch.arange(k), torch.tensor(draft_tokens, dtype=torch.long)].tolist() if k else []
    q_drafts = q[torch.arange(k), torch.tensor(draft_tokens, dtype=torch.long)].tolist() if q is not None and k else [None] * k
    u_drafts = uniforms[:k].tolist() if uniforms is not None and not greedy else [None] * k
    positions = []
    for i, x in enumerate(draft_tokens):
        p_x, q_x = p_drafts[i], q_drafts[i]
        q_used = 1.0 if q_x is None else q_x  # a point-mass proposal has q(x) = 1
        ratio = 1.0 if q_used <= 0 else p_x / q_used
        verdict = ACCEPTED if i < accepted else REJECTED if i == accepted else DISCARDED
        positions.append(PositionTrace(
            token=x, text=token_text(tokenizer, x), depth=i + 1, q=q_x, p=p_x, accept_probability=min(1.0, ratio),
            uniform=u_drafts[i], verdict=verdict, target_top=target_tops[i], draft_top=draft_tops[i]))
    return RoundTrace(index=index, drafter=drafter, gamma=gamma, reason=reason, positions=positions, accepted=accepted,
                      drafted=k, verified_tokens=k, next_token=next_token, next_text=token_text(tokenizer, next_token),
                      next_kind=next_kind, next_from="residual" if from_residual else "target", next_top=target_tops[k])


def tested_candidates(tree: TokenTree, path: list[int]) -> list[int]:
    """The nodes the tree rule tested, in order (greedy and sampling alike): at the root and at each
    accepted node its children up to the accepted one, then every child of the node where the walk stopped."""
    tested, at = [], -1
    for accepted in [*path, None]:
        for child in tree.children(at):
            tested.append(child)
            if child == accepted:
                break
        at = accepted
    return tested


def trace_tree_round(index: int, drafter: str, gamma: int, reason: str, tree: TokenTree, path: list[int],
                     p: torch.Tensor, shown: torch.Tensor, greedy: bool, next_token: int, next_kind: str, tokenizer,
                     details: dict) -> RoundTrace:
    """A token tree round's record: its tested candidates as positions, its whole tree.

    p [N+1, V] the distributions the rule used at the root and at each node (greedy: one-hot argmax),
    shown [N+1, V] what the charts show, path the accepted nodes, details what `tree_sample` recorded
    for this round (its row: accept_probabilities [N], uniforms [N], tested_against [N, V], residual
    [V]; empty when greedy).
    """
    tested = tested_candidates(tree, path)
    depths = tree.depths()
    parent_inputs = [tree.parents[node] + 1 for node in tested]  # p's row for each tested node
    tokens = [tree.tokens[node] for node in tested]
    stop = path[-1] if path else -1  # the node where the walk stopped (-1: the root)
    from_residual = not greedy and bool(tree.children(stop))  # its children were all rejected
    next_dist = details["residual"] if from_residual else shown[stop + 1]  # [V]
    target_tops = top_entries(torch.cat([shown[parent_inputs], next_dist[None]]), tokenizer)  # tested nodes, then next
    p_tested = p[parent_inputs, tokens].tolist() if tested else []
    # sampling: a child other than its parent's first was tested against r, after its earlier siblings were rejected
    after_siblings = [] if greedy else [node for node in tested if node != tree.children(tree.parents[node])[0]]
    residual_tops = (dict(zip(after_siblings, top_entries(details["tested_against"][after_siblings], tokenizer)))
                     if after_siblings else {})
    if greedy:  # accepted when it is the argmax: p (one-hot) is the probability, no draw
        accept_probabilities, uniforms = p_tested, [None] * len(tested)
    else:
        accept_probabilities = details["accept_probabilities"][tested].tolist()
        uniforms = details["uniforms"][tested].tolist()
    on_path = set(path)
    positions = [PositionTrace(
        token=x, text=token_text(tokenizer, x), depth=depths[node], q=None, p=p_tested[i],
        accept_probability=accept_probabilities[i], uniform=uniforms[i],
        verdict=ACCEPTED if node in on_path else REJECTED, target_top=target_tops[i], draft_top=[], node=node,
        residual_top=residual_tops.get(node, [])) for i, (node, x) in enumerate(zip(tested, tokens))]
    return RoundTrace(index=index, drafter=drafter, gamma=gamma, reason=reason, positions=positions, accepted=len(path),
                      drafted=max(depths, default=0), verified_tokens=len(tree), next_token=next_token,
                      next_text=token_text(tokenizer, next_token), next_kind=next_kind,
                      next_from="residual" if from_residual else "target", next_top=target_tops[-1],
                      tree=TreeTrace(list(tree.tokens), [token_text(tokenizer, t) for t in tree.tokens], list(tree.parents),
                                     list(path)))
