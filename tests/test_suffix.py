"""Suffix automaton against brute force, and what the suffix drafter proposes."""

from __future__ import annotations

import random

import pytest

from specdec.drafters.base import CORPUS, REQUEST
from specdec.drafters.suffix import SEPARATOR, SuffixAutomaton, SuffixDrafter, read_corpus
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams

GREEDY = SamplingParams()


def occurrences(seq: list[int], sub: list[int]) -> list[int]:
    """End positions of every occurrence of `sub` in `seq`."""
    n = len(sub)
    return [i + n - 1 for i in range(len(seq) - n + 1) if seq[i : i + n] == sub]


def walk(sam: SuffixAutomaton, sub: list[int]) -> int | None:
    state = 0
    for token in sub:
        state = sam.next[state].get(token)
        if state is None:
            return None
    return state


@pytest.mark.parametrize("seed", range(5))
def test_automaton_recognises_exactly_the_substrings_with_counts_and_first_ends(seed):
    rng = random.Random(seed)
    seq = [rng.randrange(3) for _ in range(60)]
    sam = SuffixAutomaton()
    for token in seq:
        sam.extend(token)
    sam.count_occurrences()
    assert len(sam.length) <= 2 * len(seq)
    for _ in range(400):  # random substrings and random non-substrings
        n = rng.randrange(1, 9)
        start = rng.randrange(len(seq) - n + 1)
        sub = seq[start : start + n] if rng.random() < 0.7 else [rng.randrange(4) for _ in range(n)]
        ends = occurrences(seq, sub)
        state = walk(sam, sub)
        assert (state is not None) == bool(ends)
        if ends:
            assert sam.count[state] == len(ends)
            assert sam.first_end[state] == ends[0]


def test_running_match_finds_the_longest_suffix_in_the_corpus():
    sam = SuffixAutomaton()
    for token in [1, 2, 3, 4, SEPARATOR, 9, 2, 3, 7]:
        sam.extend(token)
    state, matched = 0, 0
    for token in [5, 2, 3]:
        state, matched = sam.step(state, matched, token)
    assert matched == 2  # "2 3"
    state, matched = sam.step(state, matched, 4)
    assert matched == 3  # "2 3 4"
    state, matched = sam.step(state, matched, 8)
    assert matched == 0


def test_request_match_continues_the_first_earlier_occurrence():
    drafter = SuffixDrafter(min_match=2)
    prompt = [10, 11, 12, 13, 14, 50, 10, 11, 12]
    drafter.begin(prompt, 64)
    assert drafter.propose(prompt, 3, GREEDY, None).tokens == [13, 14, 50]
    assert drafter.propose(prompt + [99], 3, GREEDY, None).tokens == []  # "12 99" never seen


def test_corpus_proposes_the_most_frequent_continuation_and_candidates():
    corpus = [[1, 2, 3, 4], [1, 2, 3, 5], [7, 2, 3, 5, 6], [2, 3, 8]]
    drafter = SuffixDrafter(corpus, min_match=2)
    drafter.begin([0, 2, 3], 64)
    assert drafter.propose([0, 2, 3], 2, GREEDY, None).tokens == [5, 6]  # 5 follows "2 3" twice
    assert drafter.candidates([0, 2, 3], 2, 2) == [[5, 6], [4]]


def test_a_match_in_both_texts_offers_the_longer_with_the_other_as_its_alternative():
    """Matched in the request's text and in the corpus, the longer match is the proposal (the request's
    on a tie) and the other its alternative, each labelled with its source: the policy weighs them by
    what each text's matches were worth."""
    drafter = SuffixDrafter([[7, 8, 9, 1, 2, 3, 40, 41]], min_match=2)
    prompt = [2, 3, 30, 31, 8, 9, 1, 2, 3]  # "2 3" earlier in the request, "8 9 1 2 3" in the corpus
    drafter.begin(prompt, 64)
    draft = drafter.propose(prompt, 2, GREEDY, None)
    assert (draft.tokens, draft.match_length, draft.source) == ([40, 41], 5, CORPUS)
    alternative = draft.alternative
    assert (alternative.tokens, alternative.match_length, alternative.source) == ([30, 31], 2, REQUEST)
    assert alternative.alternative is None and draft.prefix(1).source == CORPUS
    tie = SuffixDrafter([[1, 2, 3, 40]], min_match=2)
    tie.begin([2, 3, 30, 2, 3], 64)
    draft = tie.propose([2, 3, 30, 2, 3], 1, GREEDY, None)
    assert (draft.tokens, draft.source, draft.alternative.tokens, draft.alternative.source) == ([30], REQUEST, [40], CORPUS)
    alone = SuffixDrafter(min_match=2)
    alone.begin(prompt, 64)
    assert alone.propose(prompt, 2, GREEDY, None).alternative is None  # no corpus: one proposal


def test_min_match_and_learning_outputs():
    """A request's output is learned when it ends (`finish`), into the corpus every per-request copy
    shares; nothing is learned before, or with learning off."""
    shared = SuffixDrafter(min_match=3, learn_outputs=True)
    first, second = shared.for_request(), shared.for_request()
    first.begin([1, 2], 64)
    first.propose([1, 2, 20, 21, 22, 23], 2, GREEDY, None)  # the request's output: 20 21 22 23
    assert first.propose([1, 2, 20, 21, 22, 23, 1, 2], 2, GREEDY, None).tokens == []  # match of 2 < 3
    second.begin([5, 20, 21, 22], 64)  # another request while the first runs: nothing learned yet
    assert second.propose([5, 20, 21, 22], 2, GREEDY, None).tokens == []
    first.finish([1, 2, 20, 21, 22, 23, 1, 2], 2)  # the first request ends: its output joins the corpus
    third = shared.for_request()
    third.begin([5, 20, 21, 22], 64)
    assert third.propose([5, 20, 21, 22], 2, GREEDY, None).tokens == [23, 1]
    private = SuffixDrafter(min_match=3, learn_outputs=False)
    private.finish([1, 2, 20, 21, 22, 23, 1, 2], 2)
    private.begin([5, 20, 21, 22], 64)
    assert private.propose([5, 20, 21, 22], 2, GREEDY, None).tokens == []


def test_read_corpus_formats(tmp_path):
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    (tmp_path / "a.txt").write_text("ab")
    (tmp_path / "b.jsonl").write_text('{"text": "cd"}\n\n{"text": "e"}\n')
    assert read_corpus(tmp_path, encode) == [[97, 98], [99, 100], [101]]
    (tmp_path / "bad.jsonl").write_text('{"title": 1}\n')
    with pytest.raises(SpecdecError, match="bad.jsonl:1"):
        read_corpus(tmp_path, encode)
    with pytest.raises(SpecdecError, match="does not exist"):
        read_corpus(tmp_path / "missing", encode)


def test_lookups_read_the_prompt_when_the_request_begins():
    """A request's prompt is indexed by `begin`, outside the rounds (whose planning time the policy
    charges to the drafters weighed), so the first ask reads only the tokens committed since; what the
    lookups then propose is what a fresh index of the whole context proposes."""
    from specdec.drafters.ngram import PromptLookupDrafter, lookup

    prompt = [5, 6, 7, 8, 9, 5, 6, 7] * 40  # 320 tokens
    suffix, ngram = SuffixDrafter(), PromptLookupDrafter()
    suffix.begin(prompt, 400)
    ngram.begin(prompt, 400)
    assert suffix.request.tokens == prompt and ngram.index.tokens == prompt
    tokens = prompt + [8]
    assert suffix.propose(tokens, 4, GREEDY, None).tokens == [9, 5, 6, 7]
    assert ngram.propose(tokens, 4, GREEDY, None).tokens == lookup(tokens, 4, 4, 2)[0] == [9, 5, 6, 7]
