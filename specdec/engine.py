"""The decode loop: prefill, then rounds of draft → verify → accept → commit.

    0. choose:  the policy picks the drafter and γ for this round (fixed, or adaptive: `policy.py`);
    1. draft:   the drafter proposes up to γ tokens after the committed ones (with q, or None);
    2. verify:  one target pass over [last committed token, drafts...] gives p for every position;
    3. accept:  `verify.py` keeps the longest acceptable prefix and picks one more token;
    4. commit:  the target cache keeps what was accepted (a chain rollback only moves its length);
                tokens are committed one at a time, so an end-of-sequence token, a stop string or the
                token budget inside a round ends the output exactly where plain decoding would;
    5. record:  the policy sees how many were accepted, the cost model how long the pass took;
                passes, drafted / accepted per position and per drafter, times; the text streams out.

Plain decoding is the same loop with no drafter (γ = 0 every round), so the baseline shares every
line of code except drafting. Invariant between rounds: the target cache holds every committed
token but the last, which is fed at the start of the next pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from specdec.cost_model import CostModel, largest_pass, load_or_measure
from specdec.drafters.base import Draft, Drafter
from specdec.errors import ConfigError, SpecdecError
from specdec.policy import AdaptivePolicy, FixedPolicy, RoundPlan
from specdec.runtime.loading import LanguageModel
from specdec.runtime.tokenizer import IncrementalDetokenizer
from specdec.sampling import SamplingParams, logits_to_probs, sample
from specdec.stats import GenerationStats
from specdec.trace import ACCEPTED, BONUS, CORRECTED, TARGET, RoundTrace, trace_round, trace_tree_round
from specdec.tree import TokenTree, kept_slots, tree_inputs
from specdec.verify import speculative_sample, tree_sample, verify_greedy, verify_tree_greedy

PLAIN_ROUND = RoundPlan(None, 0, 1.0, "no drafter")
PREFILL = RoundPlan(None, 0, 1.0, "the prefill: one pass over the prompt gives the first token")
AUTO = "auto"  # GenerationConfig.gamma: chosen each round by the adaptive policy


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 256
    gamma: int | str = AUTO  # tokens drafted per round, or "auto": chosen each round by the policy
    max_gamma: int = 8  # the largest γ the adaptive policy considers
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    trace: bool = False  # record every round (specdec.trace) in StreamEvent.rounds; off: nothing is built

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be a whole number >= 1, got {self.max_new_tokens}")
        if self.gamma != AUTO and (not isinstance(self.gamma, int) or self.gamma < 1):
            raise ConfigError(f"gamma (tokens drafted per round) must be a whole number >= 1 or 'auto', got {self.gamma!r}")
        if not isinstance(self.max_gamma, int) or not 1 <= self.max_gamma <= 16:
            raise ConfigError(f"max_gamma must be a whole number in [1, 16], got {self.max_gamma!r}")
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must not be empty")


@dataclass
class Piece:
    text: str
    token_ids: list[int]
    kind: str  # TARGET, ACCEPTED, CORRECTED or BONUS


@dataclass
class StreamEvent:
    pieces: list[Piece]  # what the prefill or this round committed, in order
    stats: GenerationStats  # the run's statistics so far (one object, updated as the run goes)
    done: bool = False
    rounds: list[RoundTrace] = field(default_factory=list)  # with config.trace: the records of these rounds


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    rounds: list[RoundTrace] = field(default_factory=list)  # with config.trace: every round, the prefill first


class TextAssembler:
    """Committed ids → text pieces, cut at the first stop string, holding back a possible prefix of one."""

    def __init__(self, detokenizer: IncrementalDetokenizer, stop: tuple[str, ...]) -> None:
        self.detokenizer = detokenizer
        self.stop = stop
        self.text = ""  # all text emitted so far
        self.stopped = False

    def push(self, token_id: int) -> str:
        self.detokenizer.push([token_id])
        return self._emit(self.detokenizer.emitted, final=False)

    def finish(self) -> str:
        if self.stopped:
            return ""
        self.detokenizer.flush()
        return self._emit(self.detokenizer.emitted, final=True)

    def _emit(self, full: str, final: bool) -> str:
        if not self.stop:
            piece, self.text = full[len(self.text):], full
            return piece
        search_from = max(0, len(self.text) - max(map(len, self.stop)))
        hits = [i for i in (full.find(s, search_from) for s in self.stop) if i >= 0]
        if hits:
            end = min(hits)
            self.stopped = True
        elif final:
            end = len(full)
        else:
            end = len(full) - _longest_stop_prefix(full, self.stop)
        end = max(end, len(self.text))
        piece, self.text = full[len(self.text):end], full[:end]
        return piece


def _longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


def require_prompt_text(prompt: str) -> None:
    """Refuse an empty or blank prompt with a clear error (the CLI calls it before loading a model)."""
    if not prompt or not prompt.strip():
        raise SpecdecError("the prompt is empty; give some text to continue")


class Engine:
    """Generates from a target model, speculatively when given drafters, plainly without.

    With one drafter and a fixed γ every round drafts γ tokens. With γ = "auto" or several drafters
    the adaptive policy (`policy.py`) chooses each round's drafter and γ from the cost model, which
    is measured on first use (or read from its cache) unless one is given."""

    def __init__(self, target: LanguageModel, drafter: Drafter | list[Drafter] | None = None,
                 cost_model: CostModel | None = None) -> None:
        self.target = target
        self.drafters: list[Drafter] = list(drafter) if isinstance(drafter, (list, tuple)) else [drafter] if drafter else []
        names = [d.name for d in self.drafters]
        if len(set(names)) != len(names):
            raise ConfigError(f"drafter names must differ, got {names}")
        self.name = names[0] if len(names) == 1 else f"auto({','.join(names)})" if names else "none"
        self.cost_model = cost_model
        self._last_policy: dict[tuple, AdaptivePolicy] = {}  # per (max γ, fixed γ): the latest request's policy

    def needs_costs(self, config: GenerationConfig) -> bool:
        """Whether this config runs the adaptive policy, which needs the cost model."""
        return bool(self.drafters) and (config.gamma == AUTO or len(self.drafters) > 1)

    def costs(self, max_gamma: int) -> CostModel:
        """The cost model for this target and these drafters (measured now if not cached: seconds)."""
        if (self.cost_model is None or max(self.cost_model.pass_seconds) < largest_pass(self.drafters, max_gamma)
                or any(d.name not in self.cost_model.draft_costs for d in self.drafters)):
            self.cost_model = load_or_measure(self.target, self.drafters, max_gamma)
        return self.cost_model

    def policy(self, config: GenerationConfig) -> FixedPolicy | AdaptivePolicy:
        """The policy for one request; an adaptive one starts from what the previous request with the
        same settings learned (`AdaptivePolicy.continue_from`)."""
        if not self.needs_costs(config):
            return FixedPolicy(config.gamma)
        fixed = None if config.gamma == AUTO else config.gamma
        max_gamma = fixed or config.max_gamma
        policy = AdaptivePolicy(self.costs(max_gamma), [d.name for d in self.drafters], config.max_gamma, fixed,
                                verified=[d.verified_tokens for d in self.drafters])
        key = (config.max_gamma, fixed)
        if key in self._last_policy:
            policy.continue_from(self._last_policy[key])
        self._last_policy[key] = policy
        return policy

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Prompt text → ids: through the model's chat template (one user turn) or as raw text."""
        require_prompt_text(prompt)
        tokenizer = self.target.tokenizer
        if chat and tokenizer.chat_template:
            return tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        return tokenizer.encode(prompt)

    def generate(self, prompt_ids: list[int], config: GenerationConfig = GenerationConfig()) -> GenerationResult:
        pieces: list[Piece] = []
        rounds: list[RoundTrace] = []
        for event in self.stream(prompt_ids, config):
            pieces.extend(event.pieces)
            rounds.extend(event.rounds)
        return GenerationResult(
            text="".join(p.text for p in pieces),
            token_ids=[t for p in pieces for t in p.token_ids],
            stats=event.stats,
            rounds=rounds,
        )

    def stream(self, prompt_ids: list[int], config: GenerationConfig = GenerationConfig()) -> Iterator[StreamEvent]:
        """Yield the committed tokens round by round; the last event has done=True and final stats."""
        net = self.target.net
        device = net.device
        params = config.sampling
        generator = params.generator(device)
        prompt_ids = self.check_prompt(prompt_ids)
        max_len = min(len(prompt_ids) + config.max_new_tokens, self.target.max_context)
        token_budget = max_len - len(prompt_ids)
        stop_ids = set() if config.ignore_eos else set(self.target.eos_token_ids)
        policy = self.policy(config) if self.drafters else None
        stats = GenerationStats(drafter=self.name, prompt_tokens=len(prompt_ids))
        assembler = TextAssembler(IncrementalDetokenizer(self.target.tokenizer), config.stop)
        tokens = list(prompt_ids)
        generated = 0
        started = time.perf_counter()

        def commit(new_tokens: list[int], kinds: list[str]) -> tuple[list[Piece], bool]:
            """Append tokens one at a time; stop at end-of-sequence, a stop string or the budget."""
            nonlocal generated
            pieces = []
            for token, kind in zip(new_tokens, kinds):
                tokens.append(token)
                generated += 1
                text = "" if token in stop_ids else assembler.push(token)
                pieces.append(Piece(text, [token], kind))
                if token in stop_ids or assembler.stopped:
                    stats.finish_reason = "stop"
                    return pieces, True
                if generated >= token_budget:
                    stats.finish_reason = "length"
                    return pieces, True
            return pieces, False

        # Prefill: one target pass over the prompt gives the first new token.
        cache = net.new_cache(max_len + max((d.max_nodes for d in self.drafters), default=0))
        for drafter in self.drafters:
            drafter.begin(prompt_ids, max_len, cache)
        readers = [d for d in self.drafters if d.wants_features]  # EAGLE, Medusa: read features
        logits, hidden = self._target_pass(torch.tensor([prompt_ids], device=device), cache, readers, last_only=True)
        for reader in readers:  # every prompt token is committed: its feature goes to the drafters that read them
            reader.accept_features(hidden[0])
        first = self._pick(logits[:, -1], params, generator)
        stats.target_passes = 1
        stats.prefill_seconds = time.perf_counter() - started
        pieces, done = commit([first], [TARGET])
        rounds = [self._trace(0, None, PREFILL, Draft([]), logits[0], None, params, [], first, TARGET, pieces, {},
                              stats.prefill_seconds, 0.0)] if config.trace else []
        if not done:  # stream the first token at once: time to first token is the prefill's
            stats.total_seconds = stats.prefill_seconds
            stats.new_tokens = generated
            yield StreamEvent(pieces, stats, rounds=rounds)
            pieces, rounds = [], []

        timed_drafters: set[str] = set()  # drafters whose proposals' times now reach the cost model
        while not done:
            # 0. choose, 1. draft
            t0 = time.perf_counter()
            plan = policy.choose() if policy else PLAIN_ROUND
            drafter = self.drafters[plan.drafter] if plan.drafter is not None else None
            budget = min(plan.gamma, token_budget - generated - 1)
            committed_len = cache.length
            draft = Draft([])
            if drafter and budget > 0:
                proposing = time.perf_counter()
                draft = drafter.propose(tokens, budget, params, generator)
                if self.cost_model is not None and drafter.name in timed_drafters:  # a first call also catches up
                    self.cost_model.observe_draft(drafter.name, budget, time.perf_counter() - proposing)
                timed_drafters.add(drafter.name)
            if drafter:
                self._check_draft(drafter, draft, budget, cache.length == committed_len)
                keep = policy.trim(plan, draft)  # a free drafter's proposal: verify only what pays
                if keep < len(draft):
                    draft = draft.prefix(keep)
            t1 = time.perf_counter()
            details = {} if config.trace else None  # the draws and the residual, for the trace
            p = None
            if draft.parents is None:
                # 2. verify: one pass over the last committed token and the drafts
                block = torch.tensor([[tokens[-1], *draft.tokens]], device=device)  # [1, k+1]
                logits, hidden = self._target_pass(block, cache, readers)  # [1, k+1, V], [1, k+1, hidden] or None
                # 3. accept
                draft_ids = block[:, 1:]  # [1, k]
                if params.greedy:
                    num_accepted, next_token = verify_greedy(draft_ids, logits)
                else:
                    p = logits_to_probs(logits, params)  # [1, k+1, V]
                    q = None if draft.q is None else draft.q[None]  # [1, k, V]
                    num_accepted, next_token = speculative_sample(draft_ids, p, q, generator, details)
                n = int(num_accepted)
                accepted_tokens, full = draft.tokens[:n], n == len(draft)
                # 4. commit: keep the last committed token and the accepted drafts in the cache
                cache.truncate(committed_len + 1 + n)
                kept = slice(0, n + 1)
            else:  # a token tree: the same steps, with a tree mask, a walk down the tree and a compaction
                tree = TokenTree(draft.tokens, draft.parents)
                ids, positions, mask = tree_inputs(tree, tokens[-1], committed_len, device)
                logits, hidden = self._target_pass(ids, cache, readers, positions=positions, tree_mask=mask)
                if params.greedy:
                    path, next_token = verify_tree_greedy(tree, logits[0])
                else:
                    p = logits_to_probs(logits, params)  # [1, N+1, V]
                    walked, next_token = tree_sample(tree, p, generator, details)
                    path = [node for node in walked[0].tolist() if node >= 0]
                n = len(path)
                accepted_tokens = [tree.tokens[i] for i in path]
                full = not tree.children(path[-1] if path else -1)  # the walk reached a leaf
                cache.compact(kept_slots(committed_len, path))
                kept = [0, *(i + 1 for i in path)]
            for reader in readers:  # their features are now those of committed tokens
                reader.accept_features(hidden[0, kept])
            kinds = [ACCEPTED] * n + [TARGET if not draft.tokens else BONUS if full else CORRECTED]
            new_pieces, done = commit(accepted_tokens + [int(next_token)], kinds)
            t2 = time.perf_counter()
            # 5. record
            depth = draft.depth  # draft positions: a chain's length, a tree's depth ("drafted")
            if policy:
                policy.observe(plan, depth, n, draft.match_length)
            if self.cost_model is not None:  # what this round's pass really cost corrects T(k) for the policy
                self.cost_model.observe_round(len(draft) + 1, t2 - t1)
            stats.record_round(depth, n, verified_tokens=len(draft), drafter=drafter.name if drafter else "plain",
                               gamma=plan.gamma, committed=len(new_pieces), draft_seconds=t1 - t0, verify_seconds=t2 - t1)
            if config.trace:
                accepted_nodes = list(range(n)) if draft.parents is None else path
                rounds.append(self._trace(stats.rounds, drafter, plan, draft, logits[0], None if p is None else p[0], params,
                                          accepted_nodes, int(next_token), kinds[-1], new_pieces, details, t1 - t0, t2 - t1))
            pieces += new_pieces
            if not done:
                stats.total_seconds = time.perf_counter() - started
                stats.new_tokens = generated
                yield StreamEvent(pieces, stats, rounds=rounds)
                pieces, rounds = [], []

        stats.decisions = policy.decisions if policy else []
        tail = assembler.finish()
        if tail:
            pieces.append(Piece(tail, [], TARGET))
            if rounds:
                rounds[-1].tail = tail
        stats.new_tokens = generated
        stats.total_seconds = time.perf_counter() - started
        yield StreamEvent(pieces, stats, done=True, rounds=rounds)

    def _target_pass(self, ids: torch.Tensor, cache, readers: list, last_only: bool = False,
                     **tree) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One target pass over ids [1, T] -> logits [1, T, V] ([1, 1, V] when last_only), and the final
        hidden states [1, T, hidden] when drafters read features (else None): the caller hands those
        of committed tokens to the drafters."""
        if not readers:
            return self.target.net.forward(ids, cache, last_only=last_only, **tree), None
        return self.target.net.forward(ids, cache, last_only=last_only, return_hidden=True, **tree)

    def _trace(self, index: int, drafter: Drafter | None, plan: RoundPlan, draft: Draft, logits: torch.Tensor,
               p: torch.Tensor | None, params: SamplingParams, accepted_nodes: list[int], next_token: int,
               next_kind: str, pieces: list[Piece], details: dict, draft_seconds: float,
               verify_seconds: float) -> RoundTrace:
        """The record of one round; logits [k+1, V] of its pass over the last committed token and the
        draft's k tokens or tree nodes (the prefill: [1, V]), p [k+1, V] as the acceptance rule computed
        it (None where the rule did not: greedy rounds and the prefill), accepted_nodes the accepted
        drafts' indices, details what the sampling rule recorded (batch row 0 is this round)."""
        if p is None:
            p = logits_to_probs(logits, params)  # [k+1, V] (greedy: one-hot argmax)
        shown = torch.softmax(logits.float(), -1) if params.greedy else p  # [k+1, V], what the charts show
        name, tokenizer = drafter.name if drafter else None, self.target.tokenizer
        row = {key: value[0] for key, value in details.items()}
        if draft.parents is None:
            record = trace_round(index, name, plan.gamma, plan.reason, draft.tokens, draft.q, p, shown, params.greedy,
                                 len(accepted_nodes), next_token, next_kind, tokenizer, uniforms=row.get("uniforms"),
                                 residual=row.get("residual"))
        else:
            record = trace_tree_round(index, name, plan.gamma, plan.reason, TokenTree(draft.tokens, draft.parents),
                                      accepted_nodes, p, shown, params.greedy, next_token, next_kind, tokenizer, row)
        record.committed = [t for piece in pieces for t in piece.token_ids]
        record.texts = [piece.text for piece in pieces if piece.token_ids]
        record.draft_seconds, record.verify_seconds = draft_seconds, verify_seconds
        return record

    def check_prompt(self, prompt_ids: list[int]) -> list[int]:
        if not prompt_ids:
            raise SpecdecError("the prompt is empty; give some text to continue")
        prompt_ids = [int(t) for t in prompt_ids]
        vocab = self.target.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise SpecdecError(f"prompt token ids must lie in [0, {vocab}); got {min(prompt_ids)}..{max(prompt_ids)}")
        if len(prompt_ids) >= self.target.max_context:
            raise SpecdecError(
                f"the prompt is {len(prompt_ids)} tokens, but the model's context holds "
                f"{self.target.max_context} (and at least one new token); shorten the prompt"
            )
        return prompt_ids

    def _check_draft(self, drafter: Drafter, draft: Draft, budget: int, cache_untouched: bool) -> None:
        vocab = self.target.vocab_size
        ids_valid = all(0 <= t < vocab for t in draft.tokens)
        nodes_fit = draft.parents is None or len(draft) <= drafter.max_nodes
        if draft.depth > max(budget, 0) or not nodes_fit or not ids_valid or not cache_untouched:
            raise RuntimeError(
                f"drafter {drafter.name} broke its contract: {draft.depth} tokens deep for a budget of {budget}, "
                f"{len(draft)} nodes within its max_nodes: {nodes_fit}, ids within the vocabulary: {ids_valid}, "
                f"target cache length restored: {cache_untouched}"
            )

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
        """logits [1, V] -> one token id: argmax when greedy, else a draw from the processed p."""
        if params.greedy:
            return int(logits.argmax(-1))
        return int(sample(logits_to_probs(logits, params), generator))
