"""The protocol every drafter follows.

A drafter proposes up to `max_tokens` tokens to follow `tokens` (the prompt and everything committed
so far). It returns a `Draft`: the token ids and, for drafters that sample, q — the distribution each
token was drawn from, after the same temperature / top-k / top-p transform as the target. Drafters
that look tokens up (n-gram, suffix) return q = None: a point-mass proposal.

A drafter may instead propose a token tree (`Draft.parents`, see tree.py): up to `max_tokens`
deep, with at most `max_nodes` nodes (a capability of the drafter, see `Drafter`; the engine reserves
that much room in the target's cache). Tree nodes are candidates fixed before verification (q = None).

Drafters never change the target model, and leave its cache's length as they found it. A drafter
with a model of its own owns that model's cache and keeps it in step with `tokens` itself.
"""

from __future__ import annotations

import copy
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.sampling import SamplingParams, argmax, logits_to_probs, sample
from specdec.tree import TokenTree

REQUEST = "request"  # a lookup's match found in the request's own text (its prompt and what was committed)
CORPUS = "corpus"  # ...in other texts: documents given to the drafter, its own earlier outputs


@dataclass
class Draft:
    tokens: list[int]  # [k] proposed ids, k <= max_tokens (k = 0: nothing to propose this round)
    q: torch.Tensor | None = None  # [k, V] float32 draft probabilities; None = point mass
    match_length: int = 0  # lookup drafters: how many context tokens the match behind the proposal covers
    source: str = REQUEST  # lookup drafters: the text the match was found in (REQUEST, or CORPUS: earlier texts)
    alternative: Draft | None = None  # a lookup that matched in both texts: the other one's proposal (weighed too)
    parents: list[int] | None = None  # a token tree: node i hangs under parents[i] (-1: the root); None: a chain
    confidence: list[float] | None = None  # [k] a model's chain: the top probability of its distribution at each position

    def __len__(self) -> int:
        return len(self.tokens)

    def choices(self) -> list[Draft]:
        """This proposal and its alternative, if any: what a lookup offers the policy this round."""
        return [self] if self.alternative is None else [self, self.alternative]

    @property
    def depth(self) -> int:
        """Tokens along the longest path (a chain: its length)."""
        return len(self.tokens) if self.parents is None else max(TokenTree(self.tokens, self.parents).depths(), default=0)

    def prefix(self, k: int) -> Draft:
        """The first k tokens of a chain (any prefix of a proposal is itself a valid proposal)."""
        if self.parents is not None:
            raise ValueError("a token tree has no prefix; verify it whole")
        return Draft(self.tokens[:k], None if self.q is None else self.q[:k], self.match_length,
                     source=self.source, confidence=None if self.confidence is None else self.confidence[:k])


class Drafter(ABC):
    """What every drafter is: a name, `begin`, `propose`, and capabilities with defaults that the
    engine, the policy and the cost model read (a plain chain drafter overrides none of them)."""

    name: str
    max_nodes: int = 0  # a tree drafter: the most nodes one proposal holds (the engine reserves that much cache); 0: chains
    wants_features: bool = False  # True: the engine hands over the target's features (`accept_features`)
    feature_layers: tuple[int, ...] = ()  # which: () the final-norm hidden states, else the inputs of these layers
    stops_early: bool = False  # `propose` takes keep_drafting: a chain asks, token by token, whether to go on
    looks_up: bool = False  # proposes chains that followed a match in a text (with its match_length), no model
    # call: the adaptive policy asks it every round before choosing, if it is free (`AdaptivePolicy.asks_first`)

    @abstractmethod
    def begin(self, prompt_ids: list[int], max_len: int, target_cache=None) -> None:
        """Start a new request. `max_len` bounds the length of `tokens` in later calls.

        `target_cache` is the target's cache for this request. Only a drafter built from the target
        itself (early exit) uses it, and it must leave its length as it found it."""

    @abstractmethod
    def propose(
        self, tokens: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        """Propose up to `max_tokens` ids to follow `tokens` (a drafter that `stops_early` also takes
        `keep_drafting`, see `draft_chain`)."""

    def weights_digest(self) -> str | None:
        """What the drafter's cost depends on beyond its name and the target: a digest of its own weights
        (a head, a draft model), so that a changed head is measured anew; None for drafters without weights."""
        return None

    def for_request(self) -> Drafter:
        """A drafter for one request, beside others in a batch: it shares what is read-only (weights, a
        corpus) and has per-request state of its own, which `begin` sets up. The default, a shallow
        copy, suits every drafter whose `begin` replaces all of its per-request state."""
        return copy.copy(self)

    def finish(self, tokens: list[int], prompt_length: int) -> None:
        """The request ended: `tokens` is its prompt (the first `prompt_length`) and its output. A
        drafter that learns from outputs learns here; the default does nothing."""

    def hold_learning(self) -> None:
        """Keep what `finish` would learn aside until `release_learning`, so that every request in
        between sees the same memory (the bench runs a prompt's repeats and temperatures so: a repeat
        must not draft from the answer it gave the time before). The default learns nothing anyway."""

    def release_learning(self) -> None:
        """Learn what was held since `hold_learning`, in order, and learn as requests end again."""

    def catch_up_tokens(self, tokens: list[int]) -> int:
        """Committed tokens before the last that this drafter's next proposal after `tokens` reads
        first, because it has not read them yet (a model with a cache of its own, after rounds it did
        not draft: the cost model prices them, `DraftCost.per_catch_up`); 0 for drafters that read
        nothing of the past, or keep up every round."""
        return 0

    def verified_tokens(self, gamma: int) -> int:
        """Draft tokens the target verifies when this drafter drafts γ deep: γ for a chain, the
        number of nodes within depth γ for a tree (what a verification pass costs)."""
        return gamma

    def accept_features(self, hidden: torch.Tensor) -> None:  # hidden: [n, features] of the next n committed tokens
        """Only for `wants_features` drafters: the target's features of newly committed tokens
        (`Features.for_drafter`)."""
        raise NotImplementedError(f"{self.name} does not read the target's features")


@dataclass
class Features:
    """The target's hidden states of some tokens of a pass: the final-norm ones, and the inputs of
    the layers that EAGLE-3 heads read."""

    final: torch.Tensor  # [n, hidden]
    aux: dict[int, torch.Tensor]  # layer -> [n, hidden]

    def rows(self, index) -> Features:
        return Features(self.final[index], {layer: x[index] for layer, x in self.aux.items()})

    def for_drafter(self, drafter: Drafter) -> torch.Tensor:  # [n, hidden] or [n, layers × hidden]
        if not drafter.feature_layers:
            return self.final
        return torch.cat([self.aux[layer] for layer in drafter.feature_layers], dim=-1)


def feature_layers(drafters: list[Drafter]) -> tuple[int, ...]:
    """Every layer whose input some of `drafters` read, ascending (what a pass must capture)."""
    return tuple(sorted({layer for d in drafters if d.wants_features for layer in d.feature_layers}))


def full_vocabulary_logits(draft_logits: torch.Tensor, vocab_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A head's logits over its reduced draft vocabulary [n, Vd] → over the target's [n, V] (float32,
    -inf outside the draft vocabulary, so sampling never proposes those tokens)."""
    logits = torch.full((draft_logits.shape[0], vocab_size), float("-inf"), device=draft_logits.device)  # [n, V]
    logits[:, vocab_ids] = draft_logits.float()
    return logits


def draft_chain(
    next_logits: Callable[[list[int]], torch.Tensor],
    feed: list[int],
    max_tokens: int,
    params: SamplingParams,
    generator: torch.Generator,
    vocab_ids: torch.Tensor | None = None,
    vocab_size: int = 0,
    keep_drafting: Callable[[list[float]], bool] | None = None,
) -> Draft:
    """Draft `max_tokens` tokens one at a time from a model.

    `next_logits(ids)` feeds `ids` to the draft network and returns the logits [V] after the last
    of them; with `vocab_ids` [Vd] (a head's draft vocabulary, of a target with `vocab_size` tokens)
    the logits over that vocabulary [Vd], mapped to target ids here (a greedy step then never builds
    a [V] row). It is called with `feed` first, then with each drafted token but the last. Tokens
    are the argmax when greedy, else drawn from q, the draft's distribution under the target's
    transform. With `keep_drafting`, the largest probability of the draft's distribution at each
    position is its confidence there (greedy: the drafted token's; sampled: not the drawn token's,
    which says less about acceptance), and drafting stops early once `keep_drafting(confidences so
    far)` says so (a confident chain goes on, an unsure one stops; the decision depends only on
    the tokens drafted before, so any such prefix is verified exactly).
    """
    drafted: list[int] = []
    probs: list[torch.Tensor] = []
    confidence: list[float] = []
    logits = next_logits(feed)  # [V] or [Vd]
    for i in range(max_tokens):
        if params.greedy:  # (greedy verification reads no q)
            index = int(argmax(logits))
            token = index if vocab_ids is None else int(vocab_ids[index])
            if keep_drafting is not None:
                confidence.append(float(torch.softmax(logits.float(), -1)[index]))
        else:
            if vocab_ids is not None:
                logits = full_vocabulary_logits(logits[None], vocab_ids, vocab_size)[0]  # [V]
            q = logits_to_probs(logits, params)  # [V]
            token = int(sample(q[None], generator))
            probs.append(q)
            if keep_drafting is not None:
                confidence.append(float(q.max()))
        drafted.append(token)
        if i + 1 < max_tokens and (keep_drafting is None or keep_drafting(confidence)):
            logits = next_logits([token])
        else:
            break
    return Draft(drafted, None if params.greedy else torch.stack(probs),  # q: [k, V]
                 confidence=confidence if keep_drafting is not None else None)


def module_digest(module: torch.nn.Module) -> str:
    """A digest of a module's parameters and buffers (names, shapes, dtypes, bytes): 12 hex digits."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:12]
