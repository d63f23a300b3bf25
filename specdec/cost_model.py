"""What a target pass and a draft step cost on this machine, measured once and cached.

    T(k)      seconds of one target pass that scores k new tokens after a few hundred cached ones
              (k = 1 is a plain decoding step; a round that drafted γ tokens verifies k = γ + 1)
    D_d(γ)    seconds for drafter d to propose γ tokens, fitted as per_call + per_token · γ
    T(B, N)   seconds of a pass over B rows (sequences of a batch) holding N tokens in all:
              T(N) plus what B separate rows cost beyond one row of B tokens (each row attends to
              its own cache), measured as T(B rows × 1 token) − T(1 row × B tokens) for B = 2..32

The seed formula charges a verification pass the same as a one-token pass; on a CPU it is not (on
the reference machine a pass over 2 tokens costs 1.46 one-token passes, over 8 about 2:
docs/bench/costs-output.txt), so the policy uses the measured curve.

The curve is measured once, at one context length, in a tight loop; a real round also pays for
acceptance, commit and detokenizing, at the request's own context length. In the 30-prompt benchmark
a round verifying 3.3 tokens cost 1.28 plain rounds where the curve said 1.8. So the engine reports
the time of every round it runs (`observe_round`), and `target_pass` scales the measured T(k) by a
running ratio observed / measured for that k (`Calibration`): the shape comes from the
measurement until the run's own rounds say otherwise. Draft costs are calibrated the same way, per
drafter and γ, from the seconds the engine's `propose` calls take (`observe_draft`). Measuring takes a few seconds; the result is cached as JSON under
`$SPECDEC_COSTS_DIR` (default: `<specdec cache>/costs`), keyed by the machine (CPU or GPU model,
threads, torch version), the model (its config and weight files), device, dtype and runtime. Draft
costs are kept by drafter name with the digest of the drafter's own weights (a head, a draft model:
`Drafter.weights_digest`), measured the first time a drafter is used and again when its weights change.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.announce import announce
from specdec.runtime.gguf_convert import cache_root
from specdec.sampling import SamplingParams

COST_CONTEXT = 256  # cached tokens before the timed passes: a typical prompt length
FORMAT_VERSION = 1


@dataclass
class DraftCost:
    per_call: float  # seconds spent once per proposal (a lookup's search, a model's catch-up)
    per_token: float  # seconds per drafted token (one draft-model step)

    def seconds(self, gamma: int) -> float:
        return self.per_call + self.per_token * gamma if gamma else 0.0


CALIBRATION_MEMORY = 0.97  # weight an observed round keeps per later observation of the same k
CALIBRATION_PRIOR = 3.0  # observations' worth of weight the measured curve keeps for each k
RATIO_LIMITS = (0.25, 4.0)  # an observed / measured ratio outside this is clipped (a stall, a page fault)


@dataclass
class Calibration:
    """Running ratio (observed seconds) / (measured seconds) for each size, forgetting slowly. A size
    is the k of a target pass T(k), or the γ of a drafter's proposal D(γ).

    ratio(k) = (Σ_k discounted ratios + CALIBRATION_PRIOR · r̄) / (discounted count_k + CALIBRATION_PRIOR),
    where r̄ is the same running ratio over all sizes (1 before any observation): a size never
    observed takes the overall correction, and a few observations of its own move it towards them."""

    per_size: dict[int, list[float]] = field(default_factory=dict)  # k → [discounted Σ ratio, discounted count]
    overall: list[float] = field(default_factory=lambda: [0.0, 0.0])

    def observe(self, tokens: int, ratio: float) -> None:
        ratio = min(max(ratio, RATIO_LIMITS[0]), RATIO_LIMITS[1])
        for total in (self.per_size.setdefault(tokens, [0.0, 0.0]), self.overall):
            total[0] = total[0] * CALIBRATION_MEMORY + ratio
            total[1] = total[1] * CALIBRATION_MEMORY + 1

    def ratio(self, tokens: int) -> float:
        overall = (self.overall[0] + CALIBRATION_PRIOR) / (self.overall[1] + CALIBRATION_PRIOR)
        ratio_sum, count = self.per_size.get(tokens, (0.0, 0.0))
        return (ratio_sum + CALIBRATION_PRIOR * overall) / (count + CALIBRATION_PRIOR)

    @property
    def observations(self) -> float:
        return self.overall[1]


@dataclass
class CostModel:
    pass_seconds: dict[int, float]  # tokens scored → median seconds of a target pass
    draft_costs: dict[str, DraftCost] = field(default_factory=dict)
    draft_weights: dict[str, str] = field(default_factory=dict)  # drafter name -> the weights its cost was measured with
    row_seconds: dict[int, float] = field(default_factory=dict)  # B → extra seconds of B rows over one (serving)
    key: str = ""
    description: dict = field(default_factory=dict)  # machine, model, when measured
    calibration: Calibration = field(default_factory=Calibration)  # T(k), from real rounds; never cached
    draft_calibration: dict[str, Calibration] = field(default_factory=dict)  # drafter → D(γ)'s; never cached
    calibrate: bool = True  # False: T(k), D(γ) stay as measured, so the policy's choices do not depend on timing

    def target_pass(self, tokens: int) -> float:
        """T(tokens): the measured curve scaled by what real rounds of this size cost (`Calibration`)."""
        return self.measured_pass(tokens) * self.calibration.ratio(tokens)

    def observe_round(self, tokens: int, seconds: float) -> None:
        """A round that verified `tokens` tokens (1: a plain step) took `seconds`, draft excluded."""
        if self.calibrate and seconds > 0:
            self.calibration.observe(tokens, seconds / self.measured_pass(tokens))

    def measured_pass(self, tokens: int) -> float:
        """T(tokens) as measured (not smoothed: on a CPU, GEMM kernels make some sizes genuinely
        cheaper than smaller ones); past the measured sizes, extended linearly."""
        sizes = sorted(self.pass_seconds)
        if tokens in self.pass_seconds:
            return self.pass_seconds[tokens]
        if tokens < sizes[0]:
            return self.pass_seconds[sizes[0]]
        first, last = sizes[0], sizes[-1]
        if tokens > last:  # extrapolate with the mean growth per token over the measured range
            growth = (self.pass_seconds[last] - self.pass_seconds[first]) / (last - first) if last > first else 0.0
            return self.pass_seconds[last] + max(0.0, growth) * (tokens - last)
        below = max(s for s in sizes if s < tokens)
        above = min(s for s in sizes if s > tokens)
        slope = (self.pass_seconds[above] - self.pass_seconds[below]) / (above - below)
        return self.pass_seconds[below] + slope * (tokens - below)

    def observe_draft(self, drafter: str, gamma: int, seconds: float) -> None:
        """`drafter` took `seconds` to propose γ tokens in a real round."""
        measured = self.draft_costs[drafter].seconds(gamma)
        if self.calibrate and seconds > 0 and measured > 0:
            self.draft_calibration.setdefault(drafter, Calibration()).observe(gamma, seconds / measured)

    def draft_seconds(self, drafter: str, gamma: int) -> float:
        """D_drafter(γ): the measured fit scaled by what real proposals of this γ cost."""
        calibration = self.draft_calibration.get(drafter)
        ratio = calibration.ratio(gamma) if calibration else 1.0
        return self.draft_costs[drafter].seconds(gamma) * ratio

    def row_overhead(self, rows: int) -> float:
        """What `rows` separate rows cost beyond one row of as many tokens (0 for one row, or unmeasured)."""
        if rows <= 1 or not self.row_seconds:
            return 0.0
        points = {1: 0.0, **self.row_seconds}
        below = max(b for b in points if b <= rows)
        above = min((b for b in points if b >= rows), default=None)
        if above is None:  # past the measured sizes: the last measured cost per row
            return points[below] / (below - 1) * (rows - 1)
        if above == below:
            return points[below]
        return points[below] + (points[above] - points[below]) * (rows - below) / (above - below)

    def batch_pass(self, rows: int, tokens: int) -> float:
        """T(B, N): a pass over `rows` rows holding `tokens` tokens in all."""
        return self.target_pass(tokens) + self.row_overhead(rows)

    def predicted_speedup(self, drafter: str, gamma: int, expected_tokens: float, verified: int | None = None,
                          rows: int = 1) -> float:
        """Speed-up of the batch's goodput when one of its `rows` rows drafts γ tokens deep, verifies
        `verified` draft tokens (default γ: a chain; a tree verifies all its nodes) and commits
        `expected_tokens`, the others decoding plainly (`policy.py`); one row: over plain decoding."""
        verified = gamma if verified is None else verified
        seconds = self.batch_pass(rows, rows + verified) + self.draft_seconds(drafter, gamma)
        return (expected_tokens + rows - 1) / rows * self.batch_pass(rows, rows) / seconds

    def to_json(self) -> dict:
        return {
            "version": FORMAT_VERSION,
            "key": self.key,
            "description": self.description,
            "pass_seconds": {str(k): v for k, v in sorted(self.pass_seconds.items())},
            "draft_costs": {name: {"per_call": c.per_call, "per_token": c.per_token} for name, c in self.draft_costs.items()},
            "row_seconds": {str(b): v for b, v in sorted(self.row_seconds.items())},
            "draft_weights": dict(sorted(self.draft_weights.items())),
        }

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        return cls(
            pass_seconds={int(k): float(v) for k, v in data["pass_seconds"].items()},
            draft_costs={n: DraftCost(float(c["per_call"]), float(c["per_token"])) for n, c in data["draft_costs"].items()},
            row_seconds={int(b): float(v) for b, v in data.get("row_seconds", {}).items()},
            draft_weights={str(n): str(d) for n, d in data.get("draft_weights", {}).items()},
            key=data["key"],
            description=data.get("description", {}),
        )


def costs_dir() -> Path:
    return Path(os.environ.get("SPECDEC_COSTS_DIR") or cache_root() / "costs")


def machine_description(device: torch.device) -> dict:
    if device.type == "cuda":
        processor = torch.cuda.get_device_name(device)
    else:
        processor = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    processor = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    return {"processor": processor, "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "device": str(device)}


def model_description(model) -> dict:
    """What identifies the model's numbers: its config, the sizes of its weight files, the form its
    linear layers run in and the build of the CPU kernels (a change to them re-measures)."""
    folder = Path(model.folder)
    config = folder / "config.json"
    digest = hashlib.sha256(config.read_bytes() if config.is_file() else b"")
    files = sorted(folder.glob("*.safetensors")) if model.gguf_path is None else [Path(model.gguf_path)]
    for weights in files:
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    from specdec.runtime.kernels import kernels_build_id

    net = model.net
    return {"model": model.name, "config_sha256": digest.hexdigest()[:16], "dtype": str(net.dtype),
            "runtime": type(net).__name__, "weights": model.weights.summary() if model.weights else "as stored",
            "kernels": kernels_build_id() if net.device.type == "cpu" else "none",
            "kv_cache": str(net.cache_dtype()) if hasattr(net, "cache_dtype") else str(net.dtype)}


def cost_key(model) -> tuple[str, dict]:
    description = {"machine": machine_description(model.net.device), "model": model_description(model)}
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:20]
    return key, description


def measure_pass_costs(net, context: int, sizes: list[int], repeats: int) -> dict[int, float]:
    """Median seconds of a pass over `size` new tokens after `context` cached ones, per size."""
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
    return {size: statistics.median(t[1:]) for size, t in times.items()}  # the first sweep is a warm-up


def measure_row_costs(net, context: int, sizes: list[int], repeats: int) -> tuple[dict[int, float], dict[int, float]]:
    """(B → median seconds of a pass over B rows of one token, each after `context` cached ones, minus
    a pass over one row of B tokens: what separate rows cost beyond their tokens; B → median seconds
    of that one row of B tokens, a point of T(N) past the verification sizes)."""
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
    return {size: max(0.0, statistics.median(d)) for size, d in extra.items()}, one_row


def measure_draft_cost(model, drafter, context: int, max_gamma: int, repeats: int) -> DraftCost:
    """Time `drafter` proposing 1 and `max_gamma` tokens after a repetitive synthetic context.

    The context repeats one random block, so that lookup drafters find matches and propose in
    full. A drafter that drafts from the target's own layers gets the target's cache, prefilled."""
    from specdec.drafters.base import Features
    from specdec.runtime.llama import Segment

    net = model.net
    block = torch.randint(0, net.vocab_size, (37,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens = (block * (context // len(block) + 1))[:context]
    max_len = context + max_gamma + 1
    cache = net.new_cache(max_len)
    drafter.begin(tokens, max_len, cache)
    if drafter.wants_features:  # EAGLE, Medusa: the features of every token but the last
        ids = torch.tensor(tokens[:-1], device=net.device)
        out = net.forward_segments(ids, [Segment(cache, len(ids))], return_hidden=True, aux_layers=drafter.feature_layers)
        drafter.accept_features(Features(out[1], out[2] if drafter.feature_layers else {}).for_drafter(drafter))
    else:
        net.forward(torch.tensor([tokens[:-1]], device=net.device), cache)  # every token but the last
    greedy = SamplingParams()
    generator = greedy.generator(net.device)

    def timed(gamma: int) -> float:
        times = []
        for _ in range(repeats + 1):  # the first call of each size is a warm-up (and a catch-up)
            start = time.perf_counter()
            drafter.propose(tokens, gamma, greedy, generator)
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    one, many = timed(1), timed(max_gamma)
    per_token = max(0.0, (many - one) / (max_gamma - 1)) if max_gamma > 1 else 0.0
    return DraftCost(per_call=max(0.0, one - per_token), per_token=per_token)


PROBE_CONTEXT = 32  # cached tokens before the probe's passes (a short prefill: the probe only sizes the work)


def estimate_measuring(net, context: int, pass_sizes: list[int], batch_sizes: list[int], drafters: int,
                       repeats: int) -> float:
    """Seconds the measurements of `load_or_measure` will take, from a probe timed now: a prefill of
    PROBE_CONTEXT tokens, then passes over 1 token (twice: the first warms up) and over the most
    tokens asked for; T(k) is taken as linear between and beyond them. Each measurement prefills
    `context` tokens and runs `repeats` + 1 sweeps (passes over every size; for rows, B rows of one
    token beside one row of B tokens, both priced at T(B)); each drafter to measure adds a prefill
    and its proposals (not priced: a drafter costs less than the target)."""
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

    prefills = (1 if pass_sizes else 0) + (1 if batch_sizes else 0) + drafters
    sweeps = (repeats + 1) * (sum(map(pass_seconds, pass_sizes)) + sum(2 * pass_seconds(b) for b in batch_sizes))
    return prefills * context * prefill_per_token + sweeps


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def covers(costs: CostModel, largest: int) -> bool:
    """Whether T(k) was measured for every k up to `largest`."""
    return all(k in costs.pass_seconds for k in range(1, largest + 1))


def largest_pass(drafters: list, max_gamma: int) -> int:
    """Tokens in the largest verification pass: the last committed one and γ drafts, or a tree's nodes."""
    return 1 + max([max_gamma] + [d.max_nodes for d in drafters])


BATCH_SIZES = (2, 4, 8, 16, 32)  # rows at which T(B, N)'s per-row cost is measured


def best_batch(costs: CostModel, largest: int = max(BATCH_SIZES), share: float = 0.95) -> int:
    """The default bound on rows decoded together: the fewest measured rows whose plain decoding
    reaches `share` of the best measured throughput (B / T(B, B)); more rows would add latency to
    every row for little more throughput."""
    sizes = [1] + [b for b in sorted(costs.row_seconds) if b <= largest]
    throughput = {b: b / costs.batch_pass(b, b) for b in sizes}
    best = max(throughput.values())
    return min(b for b in sizes if throughput[b] >= share * best)


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
    if costs is None and cache and not remeasure and path.is_file():
        try:
            data = json.loads(path.read_text())
            if data.get("version") == FORMAT_VERSION and data.get("key") == key:
                costs = CostModel.from_json(data)
        except (OSError, ValueError, KeyError, TypeError):
            costs = None  # unreadable or from another version: measure again and overwrite
    changed = False
    context = min(COST_CONTEXT, model.max_context - largest - 1)
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
        seconds = estimate_measuring(model.net, context, pass_sizes, row_sizes, len(new_drafters), repeats)
        announce(f"measuring this machine's costs once: about {_duration(seconds)}"
                 + (f" and the drafting of {', '.join(new_drafters)}" if new_drafters else "")
                 + f" (cached in {path}; later starts read it)")
    if costs is None:
        announce(f"measuring this machine's costs of target passes over 1..{largest} tokens")
        measured_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        costs = CostModel(measure_pass_costs(model.net, context, list(range(1, largest + 1)), repeats), key=key,
                          description={**description, "context": context, "measured_at": measured_at})
        changed = True
    elif pass_sizes:
        announce(f"measuring this machine's costs of target passes over {pass_sizes[0]}..{pass_sizes[-1]} tokens "
                 f"(added to {path})")
        costs.pass_seconds.update(measure_pass_costs(model.net, context, pass_sizes, repeats))
        changed = True
    if row_sizes:
        announce(f"measuring this machine's costs of passes over {', '.join(map(str, batch_sizes))} rows")
        overheads, one_row = measure_row_costs(model.net, context, batch_sizes, repeats)
        costs.row_seconds.update(overheads)
        costs.pass_seconds.update({n: t for n, t in one_row.items() if n not in costs.pass_seconds})
        changed = True
    for drafter in drafters:
        if drafter.name not in costs.draft_costs:
            announce(f"measuring this machine's costs of drafting with {drafter.name}")
            costs.draft_costs[drafter.name] = measure_draft_cost(model, drafter, context, max_gamma, repeats)
            digest = drafter.weights_digest()
            if digest is not None:
                costs.draft_weights[drafter.name] = digest
            changed = True
    if cache and changed:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(costs.to_json(), indent=1))
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs a measurement next time
    return costs
