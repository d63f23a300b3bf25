"""What the server serves: its settings, the loaded target and drafters, an engine per drafter
choice, the line of requests, the KV budget and the metrics. `Service.plan` maps a request's
`speculation` onto the loaded drafters, refusing what cannot be honoured."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from specdec.decode.batch import CACHE_STEP, cache_slots, row_max_len
from specdec.control.cost_model import BATCH_SIZES, best_batch
from specdec.drafters.base import Drafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.decode.engine import AUTO, Engine, GenerationConfig
from specdec.decode.prefix_cache import DEFAULT_MAX_BYTES, PrefixCache
from specdec.runtime.loading import LanguageModel
from specdec.serve.bodies import ApiError
from specdec.serve.memory import cache_bytes_per_slot, default_budget
from specdec.serve.metrics import ServerMetrics
from specdec.serve.scheduler import Scheduler
from specdec.serve.schema import Speculation

MIN_BODY_BYTES = 1 << 20
BODY_BYTES_PER_CONTEXT_TOKEN = 32  # a prompt that fills the context, as JSON text or token ids, with room to spare


@dataclass
class ServeSettings:
    model_id: str
    api_key: str | None = None
    max_pending: int = 16  # requests running or waiting; past it, 429
    default_max_tokens: int = 256  # when a request gives no max_tokens (capped by the context's room)
    gamma: int | str = AUTO  # the default when a request says nothing
    max_gamma: int = 8
    max_body_bytes: int | None = None  # past it, 413; None: BODY_BYTES_PER_CONTEXT_TOKEN × context, at least 1 MiB
    max_batch: int | None = None  # requests decoded together; None: chosen from the measured costs (`best_batch`)
    share_learning: bool = False  # drafters that learn from outputs (suffix) learn from every client's: off by default
    kv_memory: int | None = None  # bytes the rows' KV caches may hold together; None: memory.default_budget at start
    prefix_cache: int | None = None  # bytes of finished requests' caches kept for later prompts that begin alike
    # (0: none; None: a quarter of the KV budget, at most DEFAULT_MAX_BYTES, taken from the rows' share)
    api_docs: bool = False  # serve /docs, /redoc and /openapi.json (FastAPI's pages; /docs loads its scripts from a CDN)


@dataclass
class Service:
    """The loaded target and drafters, an engine per drafter choice, the line of requests, the metrics."""

    target: LanguageModel
    drafters: list[Drafter]
    settings: ServeSettings
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    scheduler: Scheduler | None = None  # made from settings.max_pending when not given
    _engines: dict[tuple[str, ...], Engine] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scheduler is None:
            self.scheduler = Scheduler(self.settings.max_pending, on_change=self.metrics.queue,
                                       max_batch=self.settings.max_batch or 1, on_round=self.metrics.round)
        if not self.settings.share_learning:  # one client's text must not reach another's drafts
            for drafter in self.drafters:
                if isinstance(drafter, SuffixDrafter):
                    drafter.learn_outputs = False
        self.by_name = {d.name: d for d in self.drafters}
        # one for every engine: a prompt reuses what any earlier request computed, whatever its drafters (the
        # readers of features only where the entry kept theirs); its size is set by `prepare`
        self.prefix_cache = PrefixCache() if self.settings.prefix_cache != 0 else None
        self.default = Engine(self.target, self.drafters, prefix_cache=self.prefix_cache)
        self._engines[tuple(self.by_name)] = self.default
        self.max_body_bytes = (self.settings.max_body_bytes if self.settings.max_body_bytes is not None
                               else max(MIN_BODY_BYTES, BODY_BYTES_PER_CONTEXT_TOKEN * self.target.max_context))
        self.stopping = asyncio.Event()  # set when a shutdown's grace period is over
        self.slot_bytes = cache_bytes_per_slot(self.target.net)  # one token's keys and values, every layer
        self.prepared = False  # `prepare` ran: the engines measure nothing more

    def stop_requests(self) -> None:
        """The shutdown's grace period is over: end the requests in flight with an error their clients can read."""
        self.stopping.set()

    def prepare(self) -> None:
        """Measure (or read) the cost model now, so that no request pays for it, and choose the batch
        bound from it when the settings leave it open. From then on nothing is measured while serving:
        requests are held to the prepared bounds (`plan`), and an engine that would still need a cost
        refuses the request instead of pausing every stream to measure it."""
        if self.drafters or self.settings.max_batch is None:
            costs = self.default.costs(self.settings.max_gamma, max_batch=self.settings.max_batch or max(BATCH_SIZES))
            self.scheduler.max_batch = self.settings.max_batch or best_batch(costs)
        budget = self.settings.kv_memory if self.settings.kv_memory is not None else default_budget(self.target.net)
        if self.prefix_cache is not None:
            kept = self.settings.prefix_cache
            if kept is None:
                kept = DEFAULT_MAX_BYTES if budget is None else min(DEFAULT_MAX_BYTES, budget // 4)
            self.prefix_cache.max_bytes = max(kept, 1)
            if budget is not None:
                budget = max(budget - kept, 1)
        self.scheduler.memory_budget = budget
        self.prepared = True
        for engine in self._engines.values():
            engine.may_measure = False

    def cache_bytes(self, engine: Engine, prompt_ids: list[int], config: GenerationConfig) -> tuple[int, int]:
        """The KV cache a request's row holds at its largest (its prompt, max_tokens and a draft) and
        when it joins (one CACHE_STEP of slots, or all it needs if less): the row's cache grows between."""
        max_len = row_max_len(len(prompt_ids), config.max_new_tokens, self.target.max_context)
        largest = cache_slots(max_len, engine.drafters) * self.slot_bytes
        return largest, min(largest, CACHE_STEP * self.slot_bytes)

    def rows_that_fit(self, tokens: int) -> int | None:
        """How many rows of `tokens` tokens each fit the KV budget at once (None: no budget)."""
        budget = self.scheduler.memory_budget
        return None if budget is None else budget // (cache_slots(tokens, self.drafters) * self.slot_bytes)

    def engine(self, names: tuple[str, ...]) -> Engine:
        if names not in self._engines:
            engine = Engine(self.target, [self.by_name[n] for n in names], cost_model=self.default.cost_model,
                            prefix_cache=self.prefix_cache)
            engine.may_measure = not self.prepared
            self._engines[names] = engine
        return self._engines[names]

    def plan(self, spec: Speculation | None) -> tuple[Engine, int | str, int]:
        """A request's speculation settings → (engine, γ, max γ), refusing what cannot be honoured."""
        spec = spec or Speculation()
        gamma = spec.gamma if spec.gamma is not None else self.settings.gamma
        max_gamma = spec.max_gamma if spec.max_gamma is not None else self.settings.max_gamma
        bound = self.settings.max_gamma  # what the server measured its costs for at start
        for name, value in (("gamma", spec.gamma), ("max_gamma", spec.max_gamma)):
            if isinstance(value, int) and value > bound:
                raise ApiError(400, f"speculation.{name} {value} is more than this server's bound of {bound} draft "
                                    f"tokens per round (its --max-gamma); send at most {bound}",
                               param=f"speculation.{name}")
        if not spec.enabled or spec.drafter == "none":
            if spec.gamma is not None or spec.max_gamma is not None or (spec.drafter not in (None, "none")):
                raise ApiError(400, "speculation.enabled is false: leave out drafter, gamma and max_gamma", param="speculation")
            return self.engine(()), 1, max_gamma
        if spec.drafter in (None, "auto"):
            names = tuple(self.by_name)
        elif spec.drafter in self.by_name:
            names = (spec.drafter,)
        else:
            raise ApiError(400, f"speculation.drafter '{spec.drafter}' is not loaded on this server; choose one of: "
                                f"{', '.join(['auto', 'none', *self.by_name])} (start the server with --drafter to load others)",
                           param="speculation.drafter")
        if not names and (spec.gamma is not None or spec.max_gamma is not None):
            raise ApiError(400, "this server runs without a drafter: leave out speculation.gamma and max_gamma",
                           param="speculation")
        if spec.max_gamma is not None and gamma != AUTO:
            source = "" if spec.gamma is not None else ", the server's default"
            raise ApiError(400, f"speculation.max_gamma only applies with gamma 'auto', and this request's gamma is "
                                f"{gamma}{source}: leave max_gamma out, or send gamma 'auto'", param="speculation.max_gamma")
        return self.engine(names), gamma, max_gamma
