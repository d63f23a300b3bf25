"""How a data folder records which generator made its prompts (meta.json's `prompt_source`), and
the prompts recovered from that record. Above both generators (`instructions`, `instructions_v2`),
which know nothing of each other's versions."""

from __future__ import annotations

import re

from specdec.train.instructions import instructions
from specdec.train.instructions_v2 import instructions_v2

GENERATORS = {1: instructions, 2: instructions_v2}  # generator version → instructions(count, seed=)
SOURCE_PREFIXES = {1: "instructions(seed=", 2: "instructions-v2(seed="}  # generator version → prompt_source


def instructions_source(version: int, seed: int) -> str:
    """How data made from generator `version` records its prompts (meta.json's prompt_source)."""
    return f"{SOURCE_PREFIXES[version]}{seed})"


def source_generator(source: str) -> tuple[int, int] | None:
    """(generator version, seed) of a prompt_source written by `instructions_source`; None for
    prompts made another way (passages, conversations)."""
    match = re.fullmatch(r"(.*seed=)(-?\d+)\)", source)
    version = next((v for v, prefix in SOURCE_PREFIXES.items() if match and match.group(1) == prefix), None)
    return None if version is None else (version, int(match.group(2)))


def generated_instructions(source: str, count: int) -> list[str] | None:
    """The first `count` instructions a prompt_source written by `instructions_source` names; None
    for prompts made another way."""
    made = source_generator(source)
    if made is None:
        return None
    version, seed = made
    return GENERATORS[version](count, seed=seed)
