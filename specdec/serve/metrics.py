"""Prometheus metrics of the server, in a registry of its own (one per app, so tests don't share)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from specdec.records.stats import GenerationStats

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300)
TOKEN_TIME_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
GAMMA_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 12, 16)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("specdec_requests", "requests answered, by route and HTTP status", ["route", "status"], registry=r)
        self.generated = Counter("specdec_generated_tokens", "tokens generated", registry=r)
        self.prompt_tokens = Counter("specdec_prompt_tokens", "prompt tokens read", registry=r)
        self.target_passes = Counter("specdec_target_passes", "target model passes (prefills included)", registry=r)
        self.drafted = Counter("specdec_drafted_tokens", "draft positions verified by the target (a token tree: its depth)",
                               registry=r)
        self.accepted = Counter("specdec_accepted_tokens", "draft tokens the target accepted", registry=r)
        self.drafted_at = Counter("specdec_drafted_tokens_by_position", "draft positions verified, by position (1 = first)",
                                  ["position"], registry=r)
        self.accepted_at = Counter("specdec_accepted_tokens_by_position", "draft tokens accepted, by draft position",
                                   ["position"], registry=r)
        self.latency = Histogram("specdec_request_seconds", "time from admission to the last token", buckets=LATENCY_BUCKETS, registry=r)
        self.first_token = Histogram("specdec_time_to_first_token_seconds", "time from admission to the first token",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.per_token = Histogram("specdec_time_per_output_token_seconds", "time per token after the first",
                                   buckets=TOKEN_TIME_BUCKETS, registry=r)
        self.running = Gauge("specdec_requests_running", "requests being generated", registry=r)
        self.waiting = Gauge("specdec_queue_length", "requests admitted and waiting for the model", registry=r)
        self.rejected = Counter("specdec_requests_rejected_busy", "requests refused with 429 because the queue was full", registry=r)
        self.cancelled = Counter("specdec_requests_cancelled", "requests whose client went away before the end", registry=r)
        self.batch_rows = Gauge("specdec_batch_rows", "requests decoded together in the latest round", registry=r)
        self.batch_rows_peak = Gauge("specdec_batch_rows_peak", "the most requests decoded together in one round", registry=r)
        self._peak = 0
        self.row_gamma = Histogram("specdec_row_gamma", "draft tokens verified per decoding row and round (0: the row decoded plainly)",
                                   buckets=GAMMA_BUCKETS, registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes and friends

    def queue(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def round(self, rows: int, gammas: list[int]) -> None:
        """A decoding round (the worker thread): rows in its pass, draft tokens each decoding row verified."""
        self.batch_rows.set(rows)
        if rows > self._peak:
            self._peak = rows
            self.batch_rows_peak.set(rows)
        for gamma in gammas:
            self.row_gamma.observe(gamma)

    def finished(self, stats: GenerationStats, seconds: float, first_token_seconds: float | None) -> None:
        self.generated.inc(stats.new_tokens)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.target_passes.inc(stats.target_passes)
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        for position, (drafted, accepted) in enumerate(zip(stats.drafted_per_position, stats.accepted_per_position), 1):
            self.drafted_at.labels(str(position)).inc(drafted)
            self.accepted_at.labels(str(position)).inc(accepted)
        self.latency.observe(seconds)
        if first_token_seconds is not None:
            self.first_token.observe(first_token_seconds)
            if stats.new_tokens > 1:
                self.per_token.observe((seconds - first_token_seconds) / (stats.new_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
