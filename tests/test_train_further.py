"""Training a head further: long-input instructions made from the target's own answers
(`--passages`), a head started from a trained one (`--init`), and training on several data folders
(`--more-data`), on the tiny model through the command line."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.cli import main
from specdec.drafters import build_drafters
from specdec.decode.engine import Engine, GenerationConfig
from specdec.train.distill import answered_instructions, load_sequences, read_answers
from specdec.train.instructions import passage_instructions
from specdec.train.instructions_v2 import instructions_v2
from specdec.train.eagle3 import grown_lm_head, vocabulary_of
from specdec.train.holdout import held_out_indices
from specdec.train.loop import load_split
from tolerances import max_difference, round_off
from whole_runs import PROMPT

PASSAGES = [(f"question {i}?", f"passage {i} " + "word " * 20) for i in range(5)]


def test_passage_instructions_are_long_inputs_repeatable_and_distinct():
    made = passage_instructions(PASSAGES, 40, seed=3)
    assert made == passage_instructions(PASSAGES, 40, seed=3) and made != passage_instructions(PASSAGES, 40, seed=4)
    assert len(set(made)) == 40
    assert all(any(text in prompt for _, text in PASSAGES) for prompt in made)  # every one carries a passage
    documents = [p for p in made if p.startswith("Answer the question using the documents below.")]
    assert documents and all("Document 2: " in p and "\n\nQuestion: question " in p for p in documents)
    with pytest.raises(ValueError, match="at least 3 passages"):
        passage_instructions(PASSAGES[:2], 5)
    with pytest.raises(ValueError, match="cannot make 10000 distinct"):
        passage_instructions(PASSAGES[:3], 10_000)


def data(folder, out, *extra):
    return ["train", "data", "--model", str(folder), "--data", str(out), "--max-new-tokens", "64", "--aux-layers", "0,1",
            "--batch-size", "4", *extra]


def test_long_inputs_from_passages_then_a_head_trained_further_on_both(tiny_folder, tiny_target, tmp_path, capsys):
    first, long_data = tmp_path / "first", tmp_path / "long"
    assert main(data(tiny_folder, first, "--prompts", "12")) == 0
    passages = answered_instructions(first, tiny_target)
    answers = read_answers(first)
    held_out = held_out_indices(12, 0.05, seed=0)  # what a training on `first` validates on: never a passage
    kept = [i for i, (ids, temperature) in enumerate(answers)
            if len(ids) >= 48 and temperature <= 0.7 and i not in held_out]
    assert len(passages) == len(kept) >= 3 and len(held_out) == 1  # long greedy or T = 0.7 answers only
    questions = instructions_v2(12, seed=0)  # the default generator
    assert [q for q, _ in passages] == [questions[i] for i in kept]  # each with the instruction it answered
    assert passages[0][1] == tiny_target.tokenizer.decode(answers[kept[0]][0]).strip()

    assert main(data(tiny_folder, long_data, "--prompts", "6", "--passages", str(first))) == 0
    meta = json.loads((long_data / "meta.json").read_text())
    assert meta["prompt_source"] == f"passages(first: {len(passages)}, seed=0)" and meta["sequences"] == 6
    made = load_sequences(long_data)
    texts = [tiny_target.tokenizer.decode(s.tokens[:s.answer_start]) for s in made]
    assert all(any(text in prompt for _, text in passages) for prompt in texts)  # the prompts hold the passages
    assert min(s.answer_start for s in made) > min(len(ids) for ids, _ in answers if len(ids) >= 48)  # long inputs

    head, further = tmp_path / "head", tmp_path / "further"
    common = ["--model", str(tiny_folder), "--data", str(first), "--max-new-tokens", "64", "--aux-layers", "0,1",
              "--epochs", "1", "--depth", "2"]
    assert main(["train", "eagle3", *common, "--prompts", "12", "--out", str(head), "--draft-vocab", "48"]) == 0
    capsys.readouterr()
    weights = load_file(str(head / "head.safetensors"))  # marked: a fresh start (same seed) would not carry this
    weights["fc.weight"] = weights["fc.weight"] + 1.0
    save_file(weights, str(head / "head.safetensors"))
    assert main(["train", "eagle3", *common, "--prompts", "12", "--out", str(further), "--init", str(head),
                 "--more-data", str(long_data), "--max-len", "1024"]) == 0
    printed = capsys.readouterr().out
    assert "sequences left out" not in printed  # --max-len 1024 holds every long prompt
    info = json.loads((further / "head.json").read_text())
    assert info["data"] == [str(first), str(long_data)] and info["init"] == str(head) and info["max_len"] == 1024
    assert info["sequences"]["train"] + info["sequences"]["validation"] == 18
    before, after = load_file(str(head / "head.safetensors")), load_file(str(further / "head.safetensors"))
    assert torch.equal(before["d2t"], after["d2t"]) and torch.equal(before["t2d"], after["t2d"])  # its vocabulary kept
    assert not torch.equal(before["fc.weight"], after["fc.weight"])  # trained further, from the head's weights
    moved = (after["fc.weight"].float() - before["fc.weight"].float()).norm() / before["fc.weight"].float().norm()
    assert moved < 0.1, moved  # without the marked start it would be ~1 apart
    shortest_prompt = min(s.answer_start for s in made)
    assert main(["train", "eagle3", *common, "--prompts", "12", "--out", str(tmp_path / "cut"), "--init", str(head),
                 "--more-data", str(long_data), "--max-len", str(shortest_prompt)]) == 0
    printed = capsys.readouterr().out  # every long prompt fills the window: left out, and said so
    assert f"5 of 16 sequences left out: their prompts fill --max-len {shortest_prompt}" in printed
    assert f"1 of 2 sequences left out: their prompts fill --max-len {shortest_prompt}" in printed


@pytest.mark.slow
def test_a_head_trained_further_grows_its_vocabulary(tiny_folder, tiny_target, tmp_path, capsys):
    """--init with a larger --draft-vocab keeps the head's tokens and their rows, adds the most frequent
    answer tokens it lacked (their rows mapped from the target's), and trains on: more of the answers
    covered, and the grown head drafts exactly (greedy identity)."""
    first = tmp_path / "first"
    assert main(data(tiny_folder, first, "--prompts", "12")) == 0
    common = ["--model", str(tiny_folder), "--data", str(first), "--prompts", "12", "--max-new-tokens", "64",
              "--aux-layers", "0,1", "--epochs", "1", "--depth", "2"]
    head, grown = tmp_path / "head", tmp_path / "grown"
    assert main(["train", "eagle3", *common, "--out", str(head), "--draft-vocab", "24"]) == 0
    assert main(["train", "eagle3", *common, "--out", str(grown), "--init", str(head), "--draft-vocab", "40"]) == 0
    capsys.readouterr()
    small, large = json.loads((head / "head.json").read_text()), json.loads((grown / "head.json").read_text())
    assert large["config"]["draft_vocab"] == 40 and large["draft_vocab_coverage"] > small["draft_vocab_coverage"]
    before, after = load_file(str(head / "head.safetensors")), load_file(str(grown / "head.safetensors"))
    old_ids, new_ids = vocabulary_of(before), vocabulary_of(after)
    assert set(old_ids.tolist()) < set(new_ids.tolist())
    trained_on = load_split(first, tmp_path / "split", 0.02, seed=0)[0]  # what the vocabulary is counted on
    answers = Counter(t for s in trained_on for t in s.tokens[s.answer_start:])
    added = set(new_ids.tolist()) - set(old_ids.tolist())
    outside = [count for token, count in answers.items() if token not in set(new_ids.tolist())]
    assert min(answers[t] for t in added) >= max(outside, default=0)  # the most frequent of those it lacked
    spec = Engine(tiny_target, build_drafters(f"eagle3-chain:{grown}", tiny_target))
    config = GenerationConfig(max_new_tokens=40, gamma=3, ignore_eos=True)
    assert spec.generate(PROMPT, config).token_ids == Engine(tiny_target).generate(PROMPT, config).token_ids


def test_grown_lm_head_rows_keep_the_old_and_map_the_new():
    """The old tokens' rows are kept where they land in the new vocabulary; a new token's row is its
    target row through the least-squares map of the old ones: exact when the head's rows are a linear
    image of the target's (the control: rows that are not give a different, inexact map)."""
    torch.manual_seed(0)
    target_rows = torch.randn(50, 8)  # [V, hidden]
    old_ids, new_ids = torch.tensor([1, 4, 7, 9, 12, 20, 21, 30, 33, 40, 41, 45]), torch.arange(0, 50, 1)[::2]
    new_ids = torch.unique(torch.cat((old_ids, new_ids)))
    image = torch.randn(8, 8)
    rows = target_rows[old_ids] @ image  # [Vd', hidden]: a linear image of the target's rows
    grown = grown_lm_head(rows, old_ids, new_ids, target_rows[new_ids])
    at = torch.searchsorted(new_ids, old_ids)
    assert torch.equal(grown[at], rows)
    # float32 rows (sums over hidden) fitted back by least squares: their round-off times the old rows' condition number
    kappa, hidden = torch.linalg.cond(target_rows[old_ids].double()).item(), target_rows.shape[1]
    assert max_difference(grown, target_rows[new_ids] @ image) <= round_off(target_rows[new_ids] @ image, kappa * hidden, hidden)
    added = torch.ones(len(new_ids), dtype=torch.bool)
    added[at] = False
    noisy = grown_lm_head(rows + torch.randn_like(rows), old_ids, new_ids, target_rows[new_ids])
    assert not torch.allclose(noisy[added], (target_rows[new_ids] @ image)[added], atol=0.1)
    assert torch.equal(grown_lm_head(rows, old_ids, old_ids, target_rows[old_ids]), rows)  # the same vocabulary: unchanged
    with pytest.raises(ValueError, match="must hold every token of the old one"):
        grown_lm_head(rows, old_ids, new_ids[new_ids != 4], target_rows[new_ids[new_ids != 4]])


def test_training_further_refuses_what_does_not_fit(tiny_folder, tiny_draft_folder, tmp_path, capsys):
    first = tmp_path / "first"
    assert main(data(tiny_folder, first, "--prompts", "12")) == 0
    head = tmp_path / "head"
    common = ["--model", str(tiny_folder), "--data", str(first), "--prompts", "12", "--max-new-tokens", "64",
              "--aux-layers", "0,1", "--epochs", "1", "--depth", "2"]
    assert main(["train", "eagle3", *common, "--out", str(head), "--draft-vocab", "48"]) == 0
    capsys.readouterr()

    def refused(args: list[str]) -> str:
        assert main(args) == 1  # an error of the input: a message, no traceback
        return capsys.readouterr().err

    assert "drafts over its own 48-token vocabulary, which --draft-vocab 40 cannot hold" in refused(
        ["train", "eagle3", *common, "--out", str(tmp_path / "x"), "--init", str(head), "--draft-vocab", "40"])
    assert "--init is for `specdec train eagle3`, not `specdec train medusa`" in refused(
        ["train", "medusa", *common, "--out", str(tmp_path / "x"), "--init", str(head)])
    words = tmp_path / "words"
    assert main(["train", "data", "--model", str(tiny_folder), "--data", str(words), "--prompts", "4",
                 "--max-new-tokens", "8", "--aux-layers", "none"]) == 0
    capsys.readouterr()
    assert "was made with aux layers [], " in refused(
        ["train", "eagle3", *common, "--out", str(tmp_path / "x"), "--more-data", str(words)])
    assert "--more-data " + str(tmp_path / "nothing") + ": no self-distillation data there" in refused(
        ["train", "eagle3", *common, "--out", str(tmp_path / "x"), "--more-data", str(tmp_path / "nothing")])
    foreign = tmp_path / "foreign"  # another model's data (the same shapes): its features mean nothing here
    assert main(data(tiny_draft_folder, foreign, "--prompts", "4")) == 0
    capsys.readouterr()
    assert f"{foreign} holds data made by " in refused(
        ["train", "eagle3", *common, "--out", str(tmp_path / "x"), "--more-data", str(foreign)])
    assert f"{foreign} holds data made by " in refused(data(tiny_folder, tmp_path / "y", "--passages", str(foreign)))
    assert "names a data folder twice" in refused(
        ["train", "eagle3", *common, "--out", str(tmp_path / "x"), "--more-data", str(first)])
    assert "--passages must name another data folder than --data" in refused(data(tiny_folder, first, "--passages", str(first)))
    assert "holds no self-distillation data" in refused(data(tiny_folder, tmp_path / "y", "--passages", str(tmp_path / "z")))
    long_data = tmp_path / "long"
    assert main(data(tiny_folder, long_data, "--prompts", "4", "--passages", str(first))) == 0
    capsys.readouterr()
    assert "was not made from the template instructions" in refused(
        data(tiny_folder, tmp_path / "y", "--prompts", "4", "--passages", str(long_data)))

