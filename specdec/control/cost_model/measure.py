"""Timing this machine: target passes over k tokens, passes over B rows, each drafter's proposals;
and `load_or_measure`, which reads the cache file (`cache.py`) and measures only what it lacks.

The seed formula charges a verification pass the same as a one-token pass; on a CPU it is not (on
the reference machine a pass over 2 tokens costs 1.46 one-token passes, over 8 about 2:
docs/bench/costs-output.txt), so the policy uses the measured curve. Measuring takes a few seconds;
a drafter's cost is measured the first time it is used and again when its weights change.

Every figure is the median of repeats, sizes interleaved (a sweep over every size, then the next
sweep), so that drift of the machine hits all sizes alike. Target passes are timed after
COST_CONTEXT cached tokens and again after LONG_CONTEXT, where the model's window allows: what
each cached token adds to a pass (`CostModel.per_context`) prices passes at a row's own context.
A measurement is checked before it is kept: where one repeat took OUTLIER (3) times its median or more, or the repeats spread (p90 − p10)
by more than SPREAD_LIMIT (100%) of the median, either by more than OUTLIER_FLOOR (5 ms), the machine
was busy (a compile, another process's threads) and it is measured again, announced, up to
MEASURE_TRIES times; a measurement that never settles is
used for this run but not cached. The spread of each figure is cached beside it (`specdec costs`
shows it). Where real rounds later drift from the table (`CostModel.drift`), `drop_if_drifted`
removes the cached file so that the next start measures again.
"""

from __future__ import annotations

import datetime
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.announce import announce
from specdec.control.cost_model.cache import cost_key, costs_dir, read_cached, write_cached
from specdec.control.cost_model.model import BATCH_SIZES, CostModel, DraftCost, largest_pass
from specdec.sampling import SamplingParams

COST_CONTEXT = 256  # cached tokens before the timed passes: a typical prompt length...
LONG_CONTEXT = 1024  # ...and again after this many, for what each cached token adds to a pass (`per_context`)
MIN_CONTEXT_SPAN = 128  # the two lengths this far apart at least (a model with a short window: one length only)
OUTLIER = 3.0  # a repeat that took this many times its figure's median: the machine was busy...
OUTLIER_FLOOR = 5e-3  # ...by more than this many seconds (a hiccup of a few ms in a tight loop of 1 ms passes,
# or a 20 µs lookup's 60 µs repeat, is no busy machine)
SPREAD_LIMIT = 1.0  # repeats (at least SPREAD_REPEATS) spread (p90 − p10) by more than this share of their
SPREAD_REPEATS = 5  # median, and by more than OUTLIER_FLOOR: busy too
MEASURE_TRIES = 3  # measurements of one kind before a busy one is used uncached


@dataclass
class Timings:
    """A measurement's repeats: label → seconds of each repeat (the warm-up excluded)."""

    samples: dict
    label: Callable[[object], str] = str  # a label in words, for the announcement

    def medians(self) -> dict:
        return {label: statistics.median(times) for label, times in self.samples.items()}

    def spreads(self) -> dict:
        """label → (p90 − p10) / median of its repeats."""
        return {label: spread(times) for label, times in self.samples.items()}

    def busy(self) -> str | None:
        """What says the machine was busy while measuring (the worst outlier or spread), or None."""
        for label, times in self.samples.items():
            median = statistics.median(times)
            if max(times) >= OUTLIER * median and max(times) - median > OUTLIER_FLOOR:
                return f"{self.label(label)} once took {max(times) / median:.1f}× its median"
            if len(times) >= SPREAD_REPEATS and spread(times) > SPREAD_LIMIT and max(times) - min(times) > OUTLIER_FLOOR:
                return f"{self.label(label)}: repeats spread by {spread(times):.0%} of their median"
        return None


def spread(times: list[float]) -> float:
    """(p90 − p10) / median of some repeats (0 for fewer than two)."""
    if len(times) < 2:
        return 0.0
    deciles = statistics.quantiles(times, n=10, method="inclusive")
    return (deciles[-1] - deciles[0]) / statistics.median(times)


def checked(what: str, measure: Callable[[], tuple[object, Timings]]) -> tuple[object, Timings, bool]:
    """`measure()` → (result, its timings), repeated (announced) while the timings say the machine was
    busy, at most MEASURE_TRIES times: (the last result, its timings, whether it settled: cache it)."""
    for attempt in range(1, MEASURE_TRIES + 1):
        result, timings = measure()
        trouble = timings.busy()
        if trouble is None:
            return result, timings, True
        then = (f"measuring again ({attempt + 1} of {MEASURE_TRIES})" if attempt < MEASURE_TRIES
                else "using these figures for this run only, not caching them")
        announce(f"the machine looked busy while measuring {what} ({trouble}): {then}")
    return result, timings, False


def measure_pass_costs(net, context: int, sizes: list[int], repeats: int) -> Timings:
    """Seconds of each repeat of a pass over `size` new tokens after `context` cached ones, per size."""
    cache = net.new_cache(context + max(sizes))
    ids = torch.randint(0, net.vocab_size, (1, context + max(sizes)), generator=torch.Generator().manual_seed(0))
    net.forward(ids[:, :context].to(net.device), cache)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(repeats + 1):  # sizes interleaved, so that machine drift hits all alike
        for size in sizes:
            block = ids[:, context : context + size].to(net.device)
            start = time.perf_counter()
            net.forward(block, cache)[0, -1, 0].item()  # .item() waits for an accelerator
            times[size].append(time.perf_counter() - start)
            cache.truncate(context)
    return Timings({size: t[1:] for size, t in times.items()}, lambda k: f"a pass over {k} token{'s' if k != 1 else ''}")  # the first
    # sweep is a warm-up


def measure_row_costs(net, context: int, sizes: list[int], repeats: int) -> tuple[tuple[dict, dict], Timings]:
    """((B → median seconds of a pass over B rows of one token, each after `context` cached ones, minus
    a pass over one row of B tokens: what separate rows cost beyond their tokens; B → median seconds
    of that one row of B tokens, a point of T(N) past the verification sizes), the repeats' timings)."""
    from specdec.runtime.llama import Segment

    ids = torch.randint(0, net.vocab_size, (context + max(sizes),), generator=torch.Generator().manual_seed(0)).to(net.device)
    caches = [net.new_cache(context + max(sizes)) for _ in range(max(sizes))]
    net.forward(ids[None, :context], caches[0])
    for cache in caches[1:]:
        cache.copy_from(caches[0])  # the same context, without prefilling it again
    rows_times: dict[int, list[float]] = {size: [] for size in sizes}  # B rows of one token each
    row_times: dict[int, list[float]] = {size: [] for size in sizes}  # one row of B tokens
    for _ in range(repeats + 1):  # sizes interleaved, so that machine drift hits all alike
        for size in sizes:
            for times, segments in ((rows_times, [Segment(c, 1) for c in caches[:size]]),
                                    (row_times, [Segment(caches[0], size)])):
                start = time.perf_counter()
                net.forward_segments(ids[context:context + size], segments, logit_rows=torch.tensor([0]))[0, 0].item()
                times[size].append(time.perf_counter() - start)
                for cache in caches[:size]:
                    cache.truncate(context)
    # the first sweep warms up; the extra cost of rows is taken sweep by sweep, then its median
    extra = {size: [r - o for r, o in zip(rows_times[size][1:], row_times[size][1:])] for size in sizes}
    one_row = {size: statistics.median(row_times[size][1:]) for size in sizes}
    timings = Timings({**{("rows", b): t[1:] for b, t in rows_times.items()}, **{("row", b): t[1:] for b, t in row_times.items()}},
                      lambda key: f"a pass over {key[1]} rows" if key[0] == "rows" else f"a pass over one row of {key[1]} tokens")
    return ({size: max(0.0, statistics.median(d)) for size, d in extra.items()}, one_row), timings


CATCH_UP_REPEATS = 3  # fresh starts timed for a model drafter's catch-up cost (each reads the whole context)


def measure_draft_cost(model, drafter, context: int, max_gamma: int, repeats: int) -> tuple[DraftCost, Timings]:
    """Time `drafter` proposing 1 and `max_gamma` tokens after a repetitive synthetic context, and,
    for one that reads committed tokens it has not read yet (`Drafter.catch_up_tokens`), a proposal
    that first reads the whole context: its cost per token read. Each proposal is timed right after
    an untimed one-token target pass, as in real rounds (its weights no longer warm in the caches).

    The context repeats one random block, so that lookup drafters find matches and propose in
    full; they are asked after a context one token longer each call, as in decoding. A drafter that
    drafts from the target's own layers gets the target's cache, prefilled."""
    from specdec.drafters.base import Features
    from specdec.runtime.llama import Segment

    net = model.net
    block = torch.randint(0, net.vocab_size, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens = (block * (context // len(block) + 1))[:context]
    max_len = context + max_gamma + 1
    cache = net.new_cache(max_len)
    drafter.begin(tokens, max_len, cache)
    features = None
    if drafter.wants_features:  # EAGLE, Medusa: the features of every token but the last
        ids = torch.tensor(tokens[:-1], device=net.device)
        out = net.forward_segments(ids, [Segment(cache, len(ids))], return_hidden=True, aux_layers=drafter.feature_layers)
        features = Features(out[1], out[2] if drafter.feature_layers else {}).for_drafter(drafter)
        drafter.accept_features(features)
    else:
        net.forward(torch.tensor([tokens[:-1]], device=net.device), cache)  # every token but the last
    greedy = SamplingParams()
    generator = greedy.generator(net.device)
    between_cache, between_id = net.new_cache(1), torch.zeros(1, 1, dtype=torch.long, device=net.device)

    def target_pass() -> None:  # untimed: in real rounds a target pass runs between two proposals, and
        # on a CPU it evicts the drafter's weights from the caches (an EAGLE-3 head's proposal after one
        # took 1.24× what it took back to back on the default model, docs/bench/draft-cost-after-pass;
        # at the 8B twin the chain ran 1.64× its table)
        net.forward(between_id, between_cache)[0, -1, 0].item()
        between_cache.truncate(0)

    # a lookup is timed as rounds find it, one committed token later each call (an index it keeps
    # grows); a model drafter after the context its cache holds
    grown = (block * ((context + 2 * repeats + 2) // len(block) + 1)) if drafter.looks_up else None
    calls = 0
    samples: dict[int, list[float]] = {}

    def timed(gamma: int) -> float:
        nonlocal calls
        times = []
        for _ in range(repeats + 1):  # the first call of each size is a warm-up (and a catch-up)
            asked = grown[:context + calls] if grown else tokens
            calls += 1
            target_pass()
            start = time.perf_counter()
            drafter.propose(asked, gamma, greedy, generator)
            times.append(time.perf_counter() - start)
        samples[gamma] = times[1:]
        return statistics.median(times[1:])

    one, many = timed(1), timed(max_gamma)
    per_token = max(0.0, (many - one) / (max_gamma - 1)) if max_gamma > 1 else 0.0

    def caught_up() -> float | None:  # a fresh start: the next proposal reads the whole context first
        drafter.begin(tokens, max_len, cache)
        if features is not None:
            drafter.accept_features(features)
        behind = drafter.catch_up_tokens(tokens)
        if not behind:
            return None  # it reads nothing of the past, or keeps up by itself
        target_pass()
        start = time.perf_counter()
        drafter.propose(tokens, 1, greedy, generator)
        return max(0.0, time.perf_counter() - start - one) / behind

    first = caught_up()
    per_catch_up = 0.0 if first is None else statistics.median([first] + [caught_up() for _ in range(CATCH_UP_REPEATS - 1)])
    timings = Timings(samples, lambda gamma: f"{drafter.name} proposing {gamma} {'token' if gamma == 1 else 'tokens'}")
    return DraftCost(per_call=max(0.0, one - per_token), per_token=per_token, per_catch_up=per_catch_up), timings


PROBE_CONTEXT = 32  # cached tokens before the probe's passes (a short prefill: the probe only sizes the work)


def estimate_measuring(net, contexts: list[int], pass_sizes: list[int], batch_sizes: list[int], drafters: int,
                       repeats: int) -> float:
    """Seconds the measurements of `load_or_measure` will take, from a probe timed now: a prefill of
    PROBE_CONTEXT tokens, then passes over 1 token (twice: the first warms up) and over the most
    tokens asked for; T(k) is taken as linear between and beyond them. Each measurement prefills
    `contexts[0]` tokens (the passes: each of `contexts`) and runs `repeats` + 1 sweeps (passes over
    every size, at each context; for rows, B rows of one token beside one row of B tokens, both priced
    at T(B)); each drafter to measure adds a prefill, a one-token pass before each of its proposals and
    catch-ups, and the proposals themselves (not priced: a drafter costs less than the target). What attention adds at the longer context is not priced: an
    estimate for the announcement, short of the time by that much."""
    context = contexts[0]
    largest, probe = max([*pass_sizes, *batch_sizes, 1]), min(PROBE_CONTEXT, context)
    ids = torch.randint(0, net.vocab_size, (1, probe + largest), generator=torch.Generator().manual_seed(2))
    cache = net.new_cache(probe + largest)
    start = time.perf_counter()
    net.forward(ids[:, :probe].to(net.device), cache)
    prefill_per_token = (time.perf_counter() - start) / probe
    timed = {}
    for size in (1, 1, largest):
        block = ids[:, probe:probe + size].to(net.device)
        start = time.perf_counter()
        net.forward(block, cache)[0, -1, 0].item()
        timed[size] = time.perf_counter() - start
        cache.truncate(probe)
    slope = (timed[largest] - timed[1]) / (largest - 1) if largest > 1 else 0.0

    def pass_seconds(k: int) -> float:
        return timed[1] + max(0.0, slope) * (k - 1)

    prefilled = (sum(contexts) if pass_sizes else 0) + ((1 if batch_sizes else 0) + drafters) * context
    sweeps = (repeats + 1) * (len(contexts) * sum(map(pass_seconds, pass_sizes))
                              + sum(2 * pass_seconds(b) for b in batch_sizes))
    between = drafters * (2 * (repeats + 1) + CATCH_UP_REPEATS) * pass_seconds(1)  # the passes before proposals
    return prefilled * prefill_per_token + sweeps + between


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def load_or_measure(model, drafters: list, max_gamma: int, *, remeasure: bool = False,
                    repeats: int = 9, cache: bool = True, max_batch: int = 1, known: CostModel | None = None) -> CostModel:
    """The cost model for `model` on this machine with these drafters: `known` (one in use) or the
    cache's, with whatever it lacks measured now and added (nothing measured is dropped), or all of
    it measured now. Passes are timed for 1 .. max_gamma + 1 tokens, or up to a tree drafter's node
    budget + 1; with `max_batch` > 1 (a server), also the cost of separate rows up to that many."""
    largest = largest_pass(drafters, max_gamma)
    key, description = cost_key(model)
    path = costs_dir() / f"{key}.json"
    costs = None if remeasure else known
    if costs is None and cache and not remeasure:
        costs = read_cached(path, key)
    changed = False
    context = min(COST_CONTEXT, model.max_context - largest - 1)
    long_context = min(LONG_CONTEXT, model.max_context - largest - 1)
    contexts = [context, long_context] if long_context - context >= MIN_CONTEXT_SPAN else [context]
    batch_sizes = [b for b in BATCH_SIZES if b <= max_batch]
    pass_sizes = [k for k in range(1, largest + 1) if costs is None or k not in costs.pass_seconds]
    row_sizes = batch_sizes if costs is None or any(b not in costs.row_seconds for b in batch_sizes) else []
    if costs is not None:  # a drafter whose weights changed since its cost was measured is measured again
        for drafter in drafters:
            digest = drafter.weights_digest()
            if drafter.name in costs.draft_costs and digest is not None and costs.draft_weights.get(drafter.name) != digest:
                announce(f"{drafter.name}'s weights are not the ones its drafting cost was measured with: measuring it again")
                del costs.draft_costs[drafter.name]
                costs.draft_calibration.pop(drafter.name, None)
    new_drafters = [d.name for d in drafters if costs is None or d.name not in costs.draft_costs]
    if pass_sizes or row_sizes or new_drafters:
        seconds = estimate_measuring(model.net, contexts, pass_sizes, row_sizes, len(new_drafters), repeats)
        announce(f"measuring this machine's costs once: about {_duration(seconds)}"
                 + (f" and the drafting of {', '.join(new_drafters)}" if new_drafters else "")
                 + f" (cached in {path}; later starts read it)")
    settled = True  # every measurement settled (not busy): the table may be cached
    if pass_sizes:
        announce(f"measuring this machine's costs of target passes over {pass_sizes[0]}..{pass_sizes[-1]} tokens"
                 + f" after {' and '.join(map(str, contexts))} cached tokens"
                 + (f" (added to {path})" if costs is not None else ""))
        medians = []
        for at in contexts:
            _, timings, ok = checked(f"target passes after {at} cached tokens",
                                     lambda: (None, measure_pass_costs(model.net, at, pass_sizes, repeats)))
            settled &= ok
            medians.append(timings.medians())
            if at == context:
                spreads = timings.spreads()
        if costs is None:
            measured_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            costs = CostModel({}, key=key, description={**description, "context": context, "measured_at": measured_at},
                              context=context)
        costs.pass_seconds.update(medians[0])
        costs.pass_spread.update(spreads)
        if len(contexts) == 2:
            costs.per_context.update({k: (medians[1][k] - medians[0][k]) / (long_context - context) for k in pass_sizes})
        changed = True
    if row_sizes:
        announce(f"measuring this machine's costs of passes over {', '.join(map(str, batch_sizes))} rows")
        (overheads, one_row), _, ok = checked("passes over several rows",
                                              lambda: measure_row_costs(model.net, context, batch_sizes, repeats))
        settled &= ok
        costs.row_seconds.update(overheads)
        costs.pass_seconds.update({n: t for n, t in one_row.items() if n not in costs.pass_seconds})
        changed = True
    for drafter in drafters:
        if drafter.name not in costs.draft_costs:
            announce(f"measuring this machine's costs of drafting with {drafter.name}")
            cost, timings, ok = checked(f"{drafter.name}'s drafting",
                                        lambda: measure_draft_cost(model, drafter, context, max_gamma, repeats))
            settled &= ok
            costs.draft_costs[drafter.name] = cost
            costs.draft_spread[drafter.name] = max(timings.spreads().values())
            digest = drafter.weights_digest()
            if digest is not None:
                costs.draft_weights[drafter.name] = digest
            changed = True
    if cache and changed and settled and not costs.dropped:
        write_cached(path, costs)
    return costs


def drop_if_drifted(costs: CostModel) -> list[str]:
    """Where real rounds have drifted from the table (`CostModel.drift`), remove its cached file, once,
    so that the next start measures again (announced); this run goes on with the table it has.
    Returns what drifted (empty: nothing, or already dropped)."""
    if costs.dropped:
        return []
    drifted = costs.drift()
    if drifted:
        costs.dropped = True
        (costs_dir() / f"{costs.key}.json").unlink(missing_ok=True)
        announce(f"this machine's measured costs no longer describe its rounds ({'; '.join(drifted)}): "
                 "the next start measures them again")
    return drifted
