"""The instruction generators of self-distillation: pinned (data folders resume from, and recover
the instructions of, the lists they record), disjoint (a training on data from both keeps each
folder's held-out set unseen), and two-turn conversations over the target's own answers
(`--follow-ups`), on the tiny model through the command line."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.train.distill import answered_instructions, encode_prompts, load_sequences
from specdec.train.holdout import held_out_indices
from specdec.train.instructions import instructions
from specdec.train.instructions_v2 import (
    FAMILIES,
    FOLLOW_UPS,
    follow_up_conversations,
    instructions_v2,
)
from specdec.train.prompt_source import generated_instructions, instructions_source


def digest(texts: list[str]) -> str:
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def test_each_generator_makes_the_list_its_data_records():
    # The shipped head's data was made from the first 10,500 of generator 1 (seed 0); the second
    # generator's data from its first 6,000. A change to either list would silently give a resumed
    # folder other prompts and `--passages`/`--follow-ups` other instructions: change a generator
    # by adding a version (instructions_source), never in place.
    assert digest(instructions(10_500, seed=0)) == "4d72fabf1a894bdb8f90caa2c945e60c57eac0d76ba84fabc77096e9bdbf7744"
    assert digest(instructions_v2(6_000, seed=0)) == "f3cc9dde39c6edcd19d1e7449134905c45ba9a70fb7063c07f651e81f6939b4a"
    assert digest(instructions_v2(6_000, seed=1)) != digest(instructions_v2(6_000, seed=0))  # the pin can fail


def test_the_second_generator_is_varied_and_shares_no_instruction_with_the_first():
    second = instructions_v2(6_000, seed=0)
    assert len(set(second)) == 6_000
    assert not set(second) & set(instructions(10_500, seed=0))
    assert set(instructions(200, seed=0)) & set(instructions(10_500, seed=0))  # control: a list meets itself
    marks = ["Translate German to English: ", "Summarize: ", "Find and fix the bug", "Pretend you are ", "who wrote ",
             "How old is the grandfather?", "Extract the names", "Write an SQL query"]
    assert all(any(mark in text for text in second) for mark in marks)
    german = [t for t in second if t.startswith(("Translate German", "Translate this German", "Please translate"))]
    assert len(german) > 300 and any("ß" in t or "ü" in t or "ä" in t for t in german)  # German text to translate
    assert len(FAMILIES) >= 15


def test_a_data_source_names_its_instructions():
    assert generated_instructions(instructions_source(1, 0), 7) == instructions(7, seed=0)
    assert generated_instructions(instructions_source(2, 5), 7) == instructions_v2(7, seed=5)
    assert generated_instructions("instructions(seed=-3)", 2) == instructions(2, seed=-3)
    for other in ("passages(first: 40, seed=0)", "follow-ups(first: 40, seed=0)", "instructions-v9(seed=0)", ""):
        assert generated_instructions(other, 3) is None


def test_follow_up_conversations_are_repeatable_distinct_turns():
    answered = [(f"question {i}?", f"answer {i}") for i in range(4)]
    made = follow_up_conversations(answered, 30, seed=2)
    assert made == follow_up_conversations(answered, 30, seed=2) != follow_up_conversations(answered, 30, seed=3)
    assert len(set(made)) == 30 and all(t[:2] in answered and t[2] in FOLLOW_UPS for t in made)
    with pytest.raises(ValueError, match="cannot make 100 distinct conversations"):
        follow_up_conversations(answered, 100)


def test_follow_ups_through_the_command_line(tiny_folder, tiny_target, tmp_path, capsys):
    model = tmp_path / "chat-model"  # the tiny model with a chat template (conversations need one)
    shutil.copytree(tiny_folder, model)
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}")
    common = ["--model", str(model), "--max-new-tokens", "64", "--aux-layers", "0,1", "--batch-size", "4"]
    first, turns = tmp_path / "first", tmp_path / "turns"
    assert main(["train", "data", *common, "--data", str(first), "--prompts", "12"]) == 0
    assert json.loads((first / "meta.json").read_text())["prompt_source"] == "instructions-v2(seed=0)"  # the default
    from specdec.runtime import load_model

    chat = load_model(str(model))
    answered = answered_instructions(first, chat, min_tokens=8, ended_only=True)  # what --follow-ups takes
    assert main(["train", "data", *common, "--data", str(turns), "--prompts", "5", "--follow-ups", str(first)]) == 0
    meta = json.loads((turns / "meta.json").read_text())
    assert meta["prompt_source"] == f"follow-ups(first: {len(answered)}, seed=0)" and meta["sequences"] == 5
    expected = encode_prompts(chat.tokenizer, follow_up_conversations(answered, 5, seed=0))
    made = load_sequences(turns)
    assert [s.tokens[:s.answer_start] for s in made] == expected
    question, answer, follow_up = follow_up_conversations(answered, 1, seed=0)[0]
    turns = [{"role": "user", "content": question}, {"role": "assistant", "content": answer},
             {"role": "user", "content": follow_up}]  # the target's answer as its own turn, then the new request
    assert expected[0] == chat.tokenizer.apply_chat_template(turns) != chat.tokenizer.apply_chat_template(turns[::-1])
    capsys.readouterr()
    assert main(["train", "data", *common, "--data", str(tmp_path / "x"), "--passages", str(first),
                 "--follow-ups", str(first)]) == 1
    assert "--passages and --follow-ups each make a data folder of their own" in capsys.readouterr().err
    with pytest.raises(SpecdecError, match="conversations need a model with a chat template"):
        encode_prompts(tiny_target.tokenizer, [("question", "answer", "and?")])  # the tiny model has none


def test_a_folder_keeps_its_generator_and_its_prompts(tiny_folder, tiny_target, tmp_path, capsys):
    common = ["--model", str(tiny_folder), "--max-new-tokens", "8", "--aux-layers", "0,1", "--batch-size", "4"]
    first = tmp_path / "first"
    assert main(["train", "data", *common, "--data", str(first), "--prompts", "6", "--instructions", "1"]) == 0
    assert main(["train", "data", *common, "--data", str(first), "--prompts", "8"]) == 0  # resumed: generator 1 still
    meta = json.loads((first / "meta.json").read_text())
    assert meta["prompt_source"] == "instructions(seed=0)" and meta["sequences"] == 8
    assert [q for q, _ in answered_instructions(first, tiny_target, min_tokens=0, max_temperature=2)] == [
        q for i, q in enumerate(instructions(8, seed=0)) if i not in (held_out_indices(8, 0.05, seed=0))]
    capsys.readouterr()
    assert main(["train", "data", *common, "--data", str(first), "--prompts", "8", "--instructions", "2"]) == 1
    assert "holds data made with other settings" in capsys.readouterr().err
    meta["prompt_digest"] = "0" * 64  # as if the generator had changed since the data was made
    (first / "meta.json").write_text(json.dumps(meta))
    assert main(["train", "data", *common, "--data", str(first), "--prompts", "9"]) == 1
    assert "holds answers to other prompts than 'instructions(seed=0)' makes now" in capsys.readouterr().err
    with pytest.raises(SpecdecError, match="answers other instructions than 'instructions\\(seed=0\\)' makes now"):
        answered_instructions(first, tiny_target)
    assert main(["train", "data", *common, "--data", str(tmp_path / "x"), "--follow-ups", str(first),
                 "--instructions", "1"]) == 1
    assert "--instructions picks the template generator" in capsys.readouterr().err
