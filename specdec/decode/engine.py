"""The engine: a target model, its drafters and their cost model; requests decoded by `decode/batch.py`.

`Engine.stream` runs one request as a batch of one (`Batch`, whose rounds are plan → draft →
verify → accept → commit → record); the server puts many requests' rows in one batch
(`serve/scheduler.py`). Plain decoding is the same loop with no drafter (γ = 0 every round), so the
baseline shares every line of code except drafting.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from specdec.decode.batch import Batch, Row, StreamEvent
from specdec.decode.text import Piece
from specdec.decode.prefix_cache import PrefixCache
from specdec.control.cost_model import BATCH_SIZES, CostModel, covers, drop_if_drifted, largest_pass, load_or_measure
from specdec.drafters.base import Drafter
from specdec.errors import ConfigError, ContextLengthError, SpecdecError
from specdec.control.policy import AdaptivePolicy, DrafterTraits, FixedPolicy
from specdec.runtime.loading import LanguageModel
from specdec.sampling import SamplingParams
from specdec.records.stats import GenerationStats
from specdec.records.trace import RoundTrace

AUTO = "auto"  # GenerationConfig.gamma: chosen each round by the adaptive policy


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 256
    gamma: int | str = AUTO  # tokens drafted per round, or "auto": chosen each round by the policy
    max_gamma: int = 8  # the largest γ the adaptive policy considers
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    trace: bool = False  # record every round (specdec.records.trace) in StreamEvent.rounds; off: nothing is built

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
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    rounds: list[RoundTrace] = field(default_factory=list)  # with config.trace: every round, the prefill first


def require_prompt_text(prompt: str) -> None:
    """Refuse an empty or blank prompt with a clear error (the CLI calls it before loading a model)."""
    if not prompt or not prompt.strip():
        raise SpecdecError("the prompt is empty; give some text to continue")


class Engine:
    """Generates from a target model, speculatively when given drafters, plainly without.

    With one drafter and a fixed γ every round drafts γ tokens. With γ = "auto" or several drafters
    the adaptive policy (`control/policy.py`) chooses each round's drafter and γ from the cost model, which
    is measured on first use (or read from its cache) unless one is given. With a `prefix_cache` a
    request starts from the longest beginning of its prompt that an earlier one computed, and leaves
    its own for the next (a conversation's turns: `decode/prefix_cache.py`)."""

    def __init__(self, target: LanguageModel, drafter: Drafter | list[Drafter] | None = None,
                 cost_model: CostModel | None = None, prefix_cache: PrefixCache | None = None) -> None:
        self.target = target
        self.prefix_cache = prefix_cache
        self.drafters: list[Drafter] = list(drafter) if isinstance(drafter, (list, tuple)) else [drafter] if drafter else []
        names = [d.name for d in self.drafters]
        if len(set(names)) != len(names):
            raise ConfigError(f"drafter names must differ, got {names}")
        self.name = names[0] if len(names) == 1 else f"auto({','.join(names)})" if names else "none"
        self.cost_model = cost_model
        self.may_measure = True  # False (a server, once prepared): a cost the model lacks is an error, not a pause
        self._last_policy: dict[tuple, AdaptivePolicy] = {}  # per (max γ, fixed γ, temperature): the latest request's policy

    def needs_costs(self, config: GenerationConfig) -> bool:
        """Whether this config runs the adaptive policy, which needs the cost model."""
        return bool(self.drafters) and (config.gamma == AUTO or len(self.drafters) > 1)

    def costs(self, max_gamma: int, max_batch: int = 1) -> CostModel:
        """The cost model for this target and these drafters (measured now if not cached: seconds);
        with `max_batch` > 1 also the cost of passes over that many rows (a server's batches)."""
        missing_rows = self.cost_model is not None and any(
            b not in self.cost_model.row_seconds for b in BATCH_SIZES if b <= max_batch)
        if (self.cost_model is None or not covers(self.cost_model, largest_pass(self.drafters, max_gamma))
                or any(d.name not in self.cost_model.draft_costs for d in self.drafters) or missing_rows):
            if not self.may_measure:
                raise ConfigError(f"this needs pass costs up to γ = {max_gamma} with {self.name}, which were not "
                                  "measured when the engine was prepared; ask for a smaller γ")
            # what is known (and what rounds have calibrated) is kept; only what is missing is measured
            self.cost_model = load_or_measure(self.target, self.drafters, max_gamma, max_batch=max_batch,
                                              known=self.cost_model)
        return self.cost_model

    def policy(self, config: GenerationConfig) -> FixedPolicy | AdaptivePolicy:
        """The policy for one request; an adaptive one starts from what the previous request with the
        same settings learned (`AdaptivePolicy.continue_from`)."""
        if not self.needs_costs(config):
            return FixedPolicy(config.gamma)
        fixed = None if config.gamma == AUTO else config.gamma
        max_gamma = fixed or config.max_gamma
        costs = self.costs(max_gamma)
        drop_if_drifted(costs)  # real rounds say the table is wrong: the next start measures it again
        policy = AdaptivePolicy(costs, [DrafterTraits.of(d) for d in self.drafters], config.max_gamma, fixed)
        key = (config.max_gamma, fixed, config.sampling.temperature)  # acceptance differs by temperature
        if key in self._last_policy:
            policy.continue_from(self._last_policy[key])
        self._last_policy[key] = policy
        return policy

    @contextmanager
    def learning_held(self) -> Iterator[None]:
        """Runs inside see the same drafter memory: what drafters that learn from answers (suffix)
        would learn is kept aside until the block ends (a second run of one prompt would otherwise
        draft from the first run's answer)."""
        for drafter in self.drafters:
            drafter.hold_learning()
        try:
            yield
        finally:
            for drafter in self.drafters:
                drafter.release_learning()

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

    def row(self, prompt_ids: list[int], config: GenerationConfig = GenerationConfig()) -> Row:
        """One request, ready to join a batch: its own drafter instances, policy and cache."""
        prompt_ids = self.check_prompt(prompt_ids)
        policy = self.policy(config) if self.drafters else None
        return Row(self.target, prompt_ids, config, [d.for_request() for d in self.drafters], policy, name=self.name,
                   cost_model=self.cost_model, prefix_cache=self.prefix_cache)

    def stream(self, prompt_ids: list[int], config: GenerationConfig = GenerationConfig()) -> Iterator[StreamEvent]:
        """Yield the committed tokens round by round; the last event has done=True and final stats."""
        batch = Batch(self.target)
        batch.add(self.row(prompt_ids, config))
        while batch.rows:
            for _, event in batch.step():
                if event.error is not None:
                    raise event.error
                yield event

    def check_prompt(self, prompt_ids: list[int]) -> list[int]:
        if not prompt_ids:
            raise SpecdecError("the prompt is empty; give some text to continue")
        if len(prompt_ids) >= self.target.max_context:  # first: cheap, and a server's huge prompt ends here
            raise ContextLengthError(
                f"the prompt is {len(prompt_ids)} tokens, but the model's context holds "
                f"{self.target.max_context} (and at least one new token); shorten the prompt"
            )
        prompt_ids = [int(t) for t in prompt_ids]
        vocab = self.target.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise SpecdecError(f"prompt token ids must lie in [0, {vocab}); got {min(prompt_ids)}..{max(prompt_ids)}")
        return prompt_ids
