"""The decode loop over a batch of requests: rows join and leave between rounds.

A `Row` is one request: its prompt, cache, drafters (its own instances), policy, sampling settings
and random generator, and what it has committed. A `Batch` runs rounds over all its rows at once;
the single request (`Engine.stream`) is a batch of one. A round has six steps:

    1. plan:    each decoding row's policy picks its drafter and γ (0: the row just decodes), knowing
                how many rows share the pass (`control/policy.py`: speculation fades as the batch fills);
    2. draft:   each row's drafter proposes up to γ tokens after the row's committed ones;
    3. verify:  ONE target pass over every row's segment (`LlamaModel.forward_segments`): a decoding
                row's last committed token and drafts (a chain, or a token tree with its mask), or
                the next chunk of a joining row's prompt (`PREFILL_CHUNK` tokens; while other rows
                decode, at most PREFILL_CHUNK in all, fewer where such rounds grow long, so a long
                prompt never stalls them for its whole length);
    4. accept:  per row, `verify.py` keeps the longest acceptable prefix and picks one more token;
    5. commit:  the row's cache keeps what was accepted (a chain rollback only moves its length, a
                tree compacts); tokens are committed one at a time, so an end-of-sequence token, a
                stop string or the token budget inside a round ends the output exactly where plain
                decoding would;
    6. record:  the row's policy sees how many were accepted, the cost model how long the pass took;
                its statistics, trace and text pieces go out as one `StreamEvent` per row.

Each row's logits are bit for bit those it would get alone (the runtime's segments are batch-
invariant with the quantized linears; other linears agree up to rounding), and it draws from its own
generator. So a greedy row's output is the output of the same request run alone, and so is a seeded
row's when its drafts do not depend on the batch (a fixed γ, or no drafter); with γ = auto the
policy weighs the batch's size, the drafts change, and a seeded row gives another sample of the
same law. Invariant between
rounds: a decoding row's cache holds every committed token but the last, fed at the start of its
next segment.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdec.control.cost_model import CostModel
from specdec.drafters.base import Draft, Drafter, Features, feature_layers
from specdec.errors import SpecdecError
from specdec.control.policy import FixedPolicy, AdaptivePolicy, RoundPlan
from specdec.decode.prefix_cache import PrefixCache, joined
from specdec.decode.text import Piece, TextAssembler
from specdec.runtime.kv_cache import StaticKVCache
from specdec.runtime.llama import Segment
from specdec.runtime.tokenizer import IncrementalDetokenizer
from specdec.sampling import SamplingParams, argmax, logits_to_probs, sample
from specdec.records.stats import GenerationStats
from specdec.records.trace import ACCEPTED, BONUS, CORRECTED, TARGET, RoundTrace, trace_round, trace_tree_round
from specdec.tree import TokenTree, kept_slots, tree_inputs
from specdec.decode.verify import Verdict, verify_round

PLAIN_ROUND = RoundPlan(None, 0, 1.0, "no drafter")
PREFILL = RoundPlan(None, 0, 1.0, "the prefill: one pass over the prompt gives the first token")
PREFILL_CHUNK = 64  # prompt tokens per row per pass (chunks do not change a bit: the kernels are invariant)
MIN_PREFILL_CHUNK = 8  # the least prompt tokens a round beside decoding rows carries
SHARED_ROUND_SECONDS = 0.3  # a round that carries a prompt chunk beside decoding rows aims to stay under this,
# or under twice a round of the decoding rows alone where that is longer (a large model's rows)
CACHE_STEP = 256  # a row's cache holds a multiple of this many slots


def row_max_len(prompt_len: int, max_new_tokens: int, max_context: int) -> int:
    """A row's longest sequence: its prompt and the new tokens asked for, within the model's context."""
    return min(prompt_len + max_new_tokens, max_context)


def cache_slots(max_len: int, drafters: list[Drafter]) -> int:
    """The slots of a row's target cache: its longest sequence and the largest tree beyond it, in steps
    of CACHE_STEP (a server's rows then free and take blocks of a few sizes, which the allocator
    reuses, instead of fragmenting memory with every request's own size)."""
    room = max_len + max((d.max_nodes for d in drafters), default=0)
    return -(-room // CACHE_STEP) * CACHE_STEP


@dataclass
class StreamEvent:
    pieces: list[Piece]  # what the prefill or this round committed, in order
    stats: GenerationStats  # the run's statistics so far (one object, updated as the run goes)
    done: bool = False
    rounds: list[RoundTrace] = field(default_factory=list)  # with config.trace: the records of these rounds
    error: Exception | None = None  # the row failed (and left the batch): its drafting, pass or commit raised this


@dataclass
class Work:
    """A row's part of one pass: its segment, and where its rows and logits lie in the pass."""

    ids: list[int]  # [T_b] the segment's tokens
    segment: Segment
    logit_rows: int  # how many of its last rows need logits (a prefill chunk: 1 if last, else 0)
    prefill: bool = False  # a chunk of the prompt


class Row:
    """One request in the loop. Built by `Engine.row`; `Batch` calls its steps.

    It is given what it reads: the `target` model, the `drafters` (its own instances) and `policy`,
    the `name` its statistics report (the engine's), the `cost_model` its rounds' and proposals'
    times go to (None: they are not timed), and the `prefix_cache` it starts from and adds to when
    it ends (None: none; decode/prefix_cache.py)."""

    def __init__(self, target, prompt_ids: list[int], config, drafters: list[Drafter],
                 policy: FixedPolicy | AdaptivePolicy | None, *, name: str, cost_model: CostModel | None,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.target, self.config, self.params = target, config, config.sampling
        self.cost_model = cost_model
        self.generator = self.params.generator(target.net.device)
        self.prompt_ids = list(prompt_ids)
        self.max_len = row_max_len(len(prompt_ids), config.max_new_tokens, target.max_context)
        self.token_budget = self.max_len - len(prompt_ids)
        self.stop_ids = set() if config.ignore_eos else set(target.eos_token_ids)
        self.drafters = drafters
        self.readers = [d for d in drafters if d.wants_features]  # EAGLE, Medusa: read features
        self.policy = policy
        self.stats = GenerationStats(drafter=name, prompt_tokens=len(prompt_ids))
        self.assembler = TextAssembler(IncrementalDetokenizer(target.tokenizer), config.stop)
        self.tokens = list(prompt_ids)
        self.generated = 0
        self.done = False
        self.full_slots = cache_slots(self.max_len, drafters)  # the most its target cache ever holds
        # slots a decoding round may add (or an early-exit drafter write): the last committed token and the
        # largest draft, chain or tree
        fixed = config.gamma if isinstance(config.gamma, int) else 0
        self.round_slots = 1 + max(config.max_gamma, fixed, max((d.max_nodes for d in drafters), default=0))
        self.cache = target.net.new_cache(self._slots_for(min(len(prompt_ids), PREFILL_CHUNK)))  # grows with the row
        self.prefill_end = len(prompt_ids)  # the cache is filled by prefill up to here (after a preemption: the
        # committed tokens but the last)
        self.features_given = 0  # tokens whose features the readers (and kept_features) hold
        for drafter in drafters:
            drafter.begin(self.prompt_ids, self.max_len, self.cache)
        self.prefix_cache = prefix_cache if isinstance(self.cache, StaticKVCache) else None  # the lean runtime's
        self.kept_features: list[Features] = []  # the readers' features of the cache's tokens, for the prefix cache
        if self.prefix_cache is not None:
            self.stats.reused_prompt_tokens = self._reuse_prefix()
        self.started = time.perf_counter()
        self.pieces: list[Piece] = []  # committed since the last event
        self.rounds: list[RoundTrace] = []
        self.timed_drafters: set[str] = set()  # drafters whose proposals' times now reach the cost model
        # this round's choices (steps 1-2), read by steps 3-6
        self.plan, self.drafter, self.draft, self.draft_seconds = PLAIN_ROUND, None, Draft([]), 0.0
        self.caught_up = 0
        self.committed_len = 0  # the cache's length before this round's pass (step 3)
        self.tree: TokenTree | None = None

    @property
    def prefilling(self) -> bool:
        return self.cache.length < self.prefill_end

    def _slots_for(self, tokens: int) -> int:
        """The cache's size for `tokens` tokens: a multiple of CACHE_STEP, at most the row's whole need."""
        return min(self.full_slots, -(-tokens // CACHE_STEP) * CACHE_STEP)

    def slots_next_round(self) -> int:
        """The slots the target cache must have for this row's next round (the next prompt chunk, or a
        decoding round's largest segment)."""
        if self.prefilling:
            return self._slots_for(min(self.prefill_end, self.cache.length + PREFILL_CHUNK))
        return self._slots_for(self.cache.length + self.round_slots)

    def bytes_next_round(self) -> int:
        """The memory the target cache holds once grown for the next round."""
        return max(self.cache.nbytes, self.slots_next_round() * self.cache.slot_bytes())

    def preempt(self) -> None:
        """Give the target cache's memory back (a server needs it for older requests). When the row is
        in a batch again it fills the cache anew by prefilling its committed tokens but the last (or,
        before its first token, its prompt), without logits and without giving the readers features
        they have: the kernels give every recomputed slot the bits it had, so the output is unchanged."""
        self.cache.release()
        self.prefill_end = len(self.tokens) - 1 if self.generated else len(self.prompt_ids)

    def _reuse_prefix(self) -> int:
        """Start from the longest beginning of the prompt that the prefix cache holds: its slots copied
        into this row's cache, its features to the readers. Returns how many tokens (0: none)."""
        layers = feature_layers(self.readers) if self.readers else None
        length, entry = self.prefix_cache.lookup(self.prompt_ids, layers)
        if not length:
            return 0
        self.cache.grow(self._slots_for(length))
        self.cache.copy_from(entry.cache, length)
        if self.readers:
            self._give_features(entry.features.rows(slice(0, length)))
        return length

    def _keep_prefix(self) -> None:
        """Give the prefix cache this finished row's committed tokens that the cache holds (not past an
        end of sequence inside an accepted draft) and their features."""
        length = min(self.cache.length, len(self.tokens))
        features = joined(self.kept_features).rows(slice(0, length)) if self.readers and self.kept_features else None
        self.prefix_cache.store(self.tokens[:length], self.cache, features)

    # 1. plan and 2. draft
    def plan_and_draft(self, rows: int) -> None:
        """Choose this round's drafter and γ with `rows` rows sharing the pass, and draft."""
        t0 = time.perf_counter()
        self.cache.grow(self.slots_next_round())  # (a drafter on the target's cache drafts into it)
        room = self.token_budget - self.generated - 1  # draft tokens this request can still use
        proposals = {}  # the lookups' proposals, which the policy weighs before choosing
        if self.policy and room > 0:
            for index in self.policy.asks_first:  # (untimed: they are priced by the cost table)
                proposals[index] = self._propose(self.drafters[index], min(self.config.max_gamma, room), timed=False)
        behind = {index: drafter.catch_up_tokens(self.tokens) for index, drafter in enumerate(self.drafters)
                  if index not in proposals}  # what each model drafter would read first: priced in its predictions
        plan = self.policy.choose(rows, proposals, behind, context=self.cache.length) if self.policy else PLAIN_ROUND
        if self.config.trace:
            plan = plan.settled()  # its reason, in words now: observing the round changes what it quotes
        drafter = self.drafters[plan.drafter] if plan.drafter is not None else None
        budget = min(plan.gamma, room)
        self.caught_up = 0  # committed tokens the drafter read first (what the rounds it sat out left it)
        if plan.proposal is not None:
            draft = plan.proposal  # the tokens of a lookup's proposal worth verifying
        elif drafter and budget > 0:
            early = self.policy.keep_drafting(plan, rows) if drafter.stops_early else None
            self.caught_up = drafter.catch_up_tokens(self.tokens)
            draft = self._propose(drafter, budget, early, behind=self.caught_up)
        else:
            draft = Draft([])
        self.plan, self.drafter, self.draft = plan, drafter, draft
        self.draft_seconds = time.perf_counter() - t0

    # 3. verify: the row's segment of the pass
    def work(self, prefill_budget: int | None) -> Work | None:
        """This round's segment: the next prompt chunk (at most `prefill_budget` tokens), or the last
        committed token and the draft. None: no room for a chunk this round."""
        device = self.target.net.device
        if self.prefilling:
            start = self.cache.length
            end = min(self.prefill_end, start + prefill_budget)
            if end <= start:
                return None
            self._reserve(end - start)  # checked per row here, before the pass that all rows share
            first_token = end == self.prefill_end and not self.generated  # (a recomputed cache needs no logits)
            return Work(self.tokens[start:end], Segment(self.cache, end - start), int(first_token), True)
        self.committed_len = self.cache.length
        if self.draft.parents is None:
            ids = [self.tokens[-1], *self.draft.tokens]  # [k + 1]
            self._reserve(len(ids))
            return Work(ids, Segment(self.cache, len(ids)), len(ids))
        self.tree = TokenTree(self.draft.tokens, self.draft.parents)
        ids, positions, mask = tree_inputs(self.tree, self.tokens[-1], self.committed_len, device)  # [1, N+1], ...
        self._reserve(ids.shape[1])
        return Work(ids[0].tolist(), Segment(self.cache, ids.shape[1], positions[0], mask), ids.shape[1])

    def _reserve(self, tokens: int) -> None:
        """Room for `tokens` more in the target cache: it grows if need be, within the row's whole need
        (past that, `reserve` says so)."""
        self.cache.grow(self._slots_for(self.cache.length + tokens))
        self.cache.reserve(tokens)

    # 4. accept, 5. commit, 6. record
    def finish_prefill(self, logits: torch.Tensor | None, features: Features | None) -> None:
        """After a prompt chunk: its features to the drafters that read them; after the last chunk
        (logits [1, V]) the first new token, streamed at once (time to first token)."""
        if self.readers:  # every prompt token is committed: its feature goes to the readers (once)
            start = self.cache.length - features.final.shape[0]  # the chunk's first slot
            if self.cache.length > self.features_given:
                self._give_features(features.rows(slice(self.features_given - start, None)))
        if logits is None:
            return
        first = _pick(logits, self.params, self.generator)
        self.stats.target_passes = 1
        self.stats.prefill_seconds = time.perf_counter() - self.started
        pieces = self._commit([first], [TARGET])
        if self.config.trace:
            self.rounds.append(self._trace(0, PREFILL, Draft([]), logits, None, [], first, TARGET, pieces, {},
                                           self.stats.prefill_seconds, 0.0))

    def accept(self, logits: torch.Tensor, features: Features | None, pass_seconds: float) -> None:
        """logits [k+1, V] (a tree: [N+1, V]) and the features of the row's segment's k+1 tokens (or None)."""
        t1 = time.perf_counter()
        draft = self.draft
        details = {} if self.config.trace else None  # the draws and the residual, for the trace
        verdict = verify_round(draft.tokens, draft.q, self.tree, logits, self.params, self.generator, details)
        kept = self._keep_accepted(verdict.path)
        if self.readers:  # their features are now those of committed tokens
            self._give_features(features.rows(kept))
        n = len(verdict.path)
        kinds = [ACCEPTED] * n + [TARGET if not draft.tokens else BONUS if verdict.full else CORRECTED]
        pieces = self._commit([draft.tokens[i] for i in verdict.path] + [verdict.next_token], kinds)
        self._record(verdict, kinds, pieces, logits, details, pass_seconds + time.perf_counter() - t1)

    def _keep_accepted(self, path: list[int]) -> slice | list[int]:
        """The cache keeps the last committed token and the accepted drafts (a chain: its length moves
        back; a tree: its accepted nodes' slots are compacted). Returns their rows in the segment."""
        if self.tree is None:
            self.cache.truncate(self.committed_len + 1 + len(path))
            return slice(0, len(path) + 1)
        self.cache.compact(kept_slots(self.committed_len, path))
        self.tree = None
        return [0, *(i + 1 for i in path)]

    def _give_features(self, features: Features) -> None:
        """The features of newly committed tokens to the drafters that read them (and the prefix cache)."""
        self.features_given += features.final.shape[0]
        for reader in self.readers:
            reader.accept_features(features.for_drafter(reader))
        if self.prefix_cache is not None:
            self.kept_features.append(features)

    def _record(self, verdict: Verdict, kinds: list[str], pieces: list[Piece], logits: torch.Tensor,
                details: dict | None, verify_seconds: float) -> None:
        """6. record: the policy's feedback, the statistics and (asked for) the round's trace."""
        draft, n = self.draft, len(verdict.path)
        depth = draft.depth  # draft positions: a chain's length, a tree's depth ("drafted")
        if self.policy:
            self.policy.observe(self.plan, depth, n, draft.match_length, draft.confidence, self.caught_up,
                                source=draft.source)
        drafter = self.drafter
        self.stats.record_round(depth, n, verified_tokens=len(draft), drafter=drafter.name if drafter else "plain",
                                gamma=self.plan.gamma, committed=len(pieces), draft_seconds=self.draft_seconds,
                                verify_seconds=verify_seconds)
        if self.config.trace:
            self.rounds.append(self._trace(self.stats.rounds, self.plan, draft, logits, verdict.p, verdict.path,
                                           verdict.next_token, kinds[-1], pieces, details, self.draft_seconds,
                                           verify_seconds))

    def _commit(self, new_tokens: list[int], kinds: list[str]) -> list[Piece]:
        """Append tokens one at a time; stop at end-of-sequence, a stop string or the budget."""
        pieces = []
        for token, kind in zip(new_tokens, kinds):
            self.tokens.append(token)
            self.generated += 1
            text = "" if token in self.stop_ids else self.assembler.push(token)
            pieces.append(Piece(text, [token], kind))
            if token in self.stop_ids or self.assembler.stopped:
                self.stats.finish_reason, self.done = "stop", True
                break
            if self.generated >= self.token_budget:
                self.stats.finish_reason, self.done = "length", True
                break
        self.pieces += pieces
        return pieces

    def event(self) -> StreamEvent | None:
        """What this row committed since its last event (None: nothing yet, a prompt still in chunks)."""
        if not self.done and not self.pieces:
            return None
        stats = self.stats
        if self.done:
            stats.decisions = self.policy.decisions if self.policy else []
            tail = self.assembler.finish()
            if tail:
                self.pieces.append(Piece(tail, [], TARGET))
                if self.rounds:
                    self.rounds[-1].tail = tail
            for drafter in self.drafters:
                drafter.finish(self.tokens, len(self.prompt_ids))
            if self.prefix_cache is not None:
                self._keep_prefix()
        stats.new_tokens = self.generated
        stats.total_seconds = time.perf_counter() - self.started
        event = StreamEvent(self.pieces, stats, done=self.done, rounds=self.rounds)
        self.pieces, self.rounds = [], []
        return event

    def _trace(self, index: int, plan: RoundPlan, draft: Draft, logits: torch.Tensor, p: torch.Tensor | None,
               accepted_nodes: list[int], next_token: int, next_kind: str, pieces: list[Piece], details: dict,
               draft_seconds: float, verify_seconds: float) -> RoundTrace:
        """The record of one round; logits [k+1, V] of its pass over the last committed token and the
        draft's k tokens or tree nodes (the prefill: [1, V]), p [k+1, V] as the acceptance rule computed
        it (None where the rule did not: greedy rounds and the prefill), accepted_nodes the accepted
        drafts' indices, details what the sampling rule recorded (batch row 0 is this round)."""
        params = self.params
        if p is None:
            p = logits_to_probs(logits, params)  # [k+1, V] (greedy: one-hot argmax)
        shown = torch.softmax(logits.float(), -1) if params.greedy else p  # [k+1, V], what the charts show
        name, tokenizer = self.drafter.name if self.drafter else None, self.target.tokenizer
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

    def _propose(self, drafter: Drafter, budget: int, keep_drafting=None, behind: int | None = None,
                 timed: bool = True) -> Draft:
        """The drafter's proposal of up to `budget` tokens, checked, its time given to the cost model
        (`behind`: its `catch_up_tokens`, when the caller has them already). Not `timed`: a lookup the
        policy asks before choosing every round (recording its time took 9 µs a round, a fifth of the
        planning of `auto` on the 135M model)."""
        committed_len = self.cache.length
        if behind is None:
            behind = drafter.catch_up_tokens(self.tokens)
        proposing = time.perf_counter()
        draft = drafter.propose(self.tokens, budget, self.params, self.generator,
                                **({"keep_drafting": keep_drafting} if keep_drafting else {}))
        costs = self.cost_model
        if timed and costs is not None and drafter.name in self.timed_drafters:  # a first call also warms up
            drafted = len(draft) if drafter.stops_early else budget  # a chain that stopped early drafted fewer
            costs.observe_draft(drafter.name, drafted, time.perf_counter() - proposing, behind)
        self.timed_drafters.add(drafter.name)
        self._check_draft(drafter, draft, budget, self.cache.length == committed_len)
        return draft

    def _check_draft(self, drafter: Drafter, draft: Draft, budget: int, cache_untouched: bool) -> None:
        tokens = draft.tokens
        ids_valid = not tokens or (min(tokens) >= 0 and max(tokens) < self.target.vocab_size)
        nodes_fit = draft.parents is None or len(draft) <= drafter.max_nodes
        if draft.depth > max(budget, 0) or not nodes_fit or not ids_valid or not cache_untouched:
            raise RuntimeError(
                f"drafter {drafter.name} broke its contract: {draft.depth} tokens deep for a budget of {budget}, "
                f"{len(draft)} nodes within its max_nodes: {nodes_fit}, ids within the vocabulary: {ids_valid}, "
                f"target cache length restored: {cache_untouched}"
            )


class Batch:
    """Rows decoded together: `add` a row between rounds, `step` runs one round over all of them and
    returns each row's event; a row that is done (or `remove`d) leaves."""

    def __init__(self, target) -> None:
        self.target = target
        self.rows: list[Row] = []
        self.last_round: tuple[int, list[int]] = (0, [])  # rows in the latest pass; draft tokens each decoding row verified
        # prompt tokens a round carries beside decoding rows: halved when such a round took longer than
        # SHARED_ROUND_SECONDS (a chunk's attention grows with the prompt's length), doubled again when
        # one took less than half of it, within MIN_PREFILL_CHUNK..PREFILL_CHUNK
        self.shared_prefill = PREFILL_CHUNK
        self.decoding_seconds = 0.0  # the latest pass of decoding rows alone

    def add(self, row: Row) -> None:
        if row.target is not self.target:
            raise SpecdecError("every row of a batch decodes with the batch's target model")
        self.rows.append(row)

    def remove(self, row: Row) -> None:
        if row in self.rows:
            self.rows.remove(row)

    def step(self) -> list[tuple[Row, StreamEvent]]:
        """One round over every row; returns (row, event) for the rows that have something to say. A
        row whose drafting, pass or commit raises leaves the batch with an event carrying the error;
        the other rows' round goes on as if it had not been there."""
        rows = self.rows
        failed: dict[Row, Exception] = {}
        decoding = [row for row in rows if not row.prefilling]
        for row in decoding:  # 1. plan, 2. draft
            _guarded(failed, row, row.plan_and_draft, len(rows))
        # 3. verify: one pass; prompts in chunks of PREFILL_CHUNK tokens (attention over a whole long
        # prompt at once costs more than over its chunks), all of them in one round while nobody
        # decodes, `shared_prefill` tokens in all while others do (their rounds stay short)
        budget = self.shared_prefill if decoding else None
        works: list[tuple[Row, Work]] = []
        for row in rows:
            if row in failed:
                continue
            work = _guarded(failed, row, row.work, (PREFILL_CHUNK if budget is None else budget) if row.prefilling else None)
            if work is not None:
                works.append((row, work))
                if row.prefilling and budget is not None:
                    budget -= len(work.ids)
        started = time.perf_counter()
        results = self._pass(works, failed)
        pass_seconds = time.perf_counter() - started
        if decoding and any(work.prefill for _, work in works):
            self._tune_shared_prefill(pass_seconds)
        elif decoding:
            self.decoding_seconds = pass_seconds
        # 4. accept, 5. commit, 6. record
        for (row, work), (row_logits, row_features) in zip(works, results):
            if row in failed:
                continue
            if work.prefill:
                _guarded(failed, row, row.finish_prefill, row_logits if work.logit_rows else None, row_features)
            else:
                _guarded(failed, row, row.accept, row_logits, row_features, pass_seconds)
        if len(works) == 1 and not works[0][1].prefill and not failed:  # a row alone: its round is a T(k)
            costs = works[0][0].cost_model
            if costs is not None:  # what the round cost (pass, acceptance, commit) corrects T(k) for the policy
                costs.observe_round(len(works[0][1].ids), time.perf_counter() - started, works[0][0].committed_len)
        self.last_round = (len(rows), [len(row.draft) for row, work in works if not work.prefill and row not in failed])
        events = []
        for row in list(rows):
            event = _guarded(failed, row, row.event) if row not in failed else None
            if row in failed:  # (making its event may have failed too)
                event = StreamEvent([], row.stats, done=True, error=failed[row])
            if event is not None:
                events.append((row, event))
            if row.done or row in failed:
                self.rows.remove(row)
        return events

    def _tune_shared_prefill(self, seconds: float) -> None:
        """After a pass that carried a prompt chunk beside decoding rows, taking `seconds`."""
        target = max(SHARED_ROUND_SECONDS, 2 * self.decoding_seconds)
        if seconds > target:
            self.shared_prefill = max(MIN_PREFILL_CHUNK, self.shared_prefill // 2)
        elif seconds < target / 2:
            self.shared_prefill = min(PREFILL_CHUNK, self.shared_prefill * 2)

    def _pass(self, works: list[tuple[Row, Work]], failed: dict[Row, Exception]) -> list[tuple]:
        """The round's target pass over every row's work → (logits [logit_rows, V], features or None)
        per work. If the shared pass raises, each row's work runs alone, so that only the rows whose
        own work fails are marked in `failed` (a failed pass leaves every cache's length as it was)."""
        if not works:
            return []
        try:
            return self._forward(works)
        except Exception as exc:
            if len(works) == 1:
                failed[works[0][0]] = exc
                return [(None, None)]
        results = []
        for row, work in works:
            result = _guarded(failed, row, self._forward, [(row, work)])
            results.append(result[0] if result is not None else (None, None))
        return results

    def _forward(self, works: list[tuple[Row, Work]]) -> list[tuple]:
        net = self.target.net
        device = net.device
        ids = torch.tensor([t for _, work in works for t in work.ids], device=device)  # [N]
        ends = torch.tensor([len(work.ids) for _, work in works]).cumsum(0).tolist()
        logit_rows = torch.tensor([end - k for (_, work), end in zip(works, ends)
                                   for k in range(work.logit_rows, 0, -1)], device=device, dtype=torch.long)  # [M]
        wants_hidden = any(row.readers for row, _ in works)
        aux_layers = feature_layers([d for row, _ in works for d in row.readers])
        out = net.forward_segments(ids, [work.segment for _, work in works], logit_rows=logit_rows,
                                   return_hidden=wants_hidden, aux_layers=aux_layers)
        logits = out[0] if wants_hidden else out  # [M, V]
        features = Features(out[1], out[2] if aux_layers else {}) if wants_hidden else None  # [N, ...]
        results, first_row, first_logit = [], 0, 0
        for (_, work), end in zip(works, ends):
            results.append((logits[first_logit:first_logit + work.logit_rows],
                            None if features is None else features.rows(slice(first_row, end))))
            first_row, first_logit = end, first_logit + work.logit_rows
        return results


def _guarded(failed: dict, row: Row, step, *args):
    """Run one row's step; an exception marks the row failed (its other steps this round are skipped)."""
    try:
        return step(*args)
    except Exception as exc:
        failed[row] = exc
        return None


def _pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """logits [1, V] -> one token id: argmax when greedy, else a draw from the processed p."""
    if params.greedy:
        return int(argmax(logits))
    return int(sample(logits_to_probs(logits, params), generator))
