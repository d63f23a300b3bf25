"""Which sequences a training holds out for validation: a seeded shuffle, the first share of it.

The data side (`distill.answered_instructions`) leaves the same sequences out of the data it makes
from answers, so both sides use these functions and neither imports the other.
"""

from __future__ import annotations

import random
from typing import TypeVar

T = TypeVar("T")


def split(items: list[T], validation_share: float, seed: int) -> tuple[list[T], list[T]]:
    """(train, validation): the held-out share of `items` (at least one of two or more) goes to validation."""
    order = shuffled(len(items), seed)
    n_val = held_out_count(len(order), validation_share)
    return [items[i] for i in order[n_val:]], [items[i] for i in order[:n_val]]


def shuffled(count: int, seed: int) -> list[int]:
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order


def held_out_count(count: int, validation_share: float) -> int:
    return max(1, int(count * validation_share)) if count > 1 else 0


def held_out_indices(count: int, validation_share: float, seed: int) -> set[int]:
    """The indices `split` holds out of `count` sequences (a larger share holds out a superset)."""
    return set(shuffled(count, seed)[:held_out_count(count, validation_share)])
