"""Suffix drafting: continue the longest suffix of the context that was seen before.

Two suffix automata index what has been seen:
- the *request* automaton: the prompt and every committed token, extended as the text grows;
- the *corpus* automaton (optional): documents given by the user (a text file, a folder of text
  files, or JSON-lines with a "text" field) and, if asked (`learn_outputs`, on for the `suffix`
  spec), this drafter's own earlier outputs, up to LEARN_LIMIT tokens of them.

A suffix automaton has at most 2N states for N tokens, recognises every substring, and lets a
running match (the longest suffix of the context that occurs in the index) advance in amortised
O(1) per token. From the matched state:
- in the request automaton the draft is the text that followed the first earlier occurrence;
- in the corpus automaton the draft follows, token by token, the transition whose target occurs
  most often in the corpus ("the continuation seen most often"); `candidates` gives the best few
  branches at the first step, for token trees.
The longer of the two matches is the proposal (the request's on a tie) and the other, if both
matched, its `alternative`: the same match length predicts very different acceptance in the two
texts, and the policy weighs each by its own (`control/policy.py`). A match shorter than `min_match`
tokens proposes nothing. Point-mass proposals (q = None); no model call.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdec.drafters.base import CORPUS, Draft, Drafter
from specdec.drafters.spec import DrafterSpec
from specdec.errors import ConfigError, SpecdecError
from specdec.sampling import SamplingParams

SEPARATOR = -1  # between corpus documents: no match crosses it
LEARN_LIMIT = 500_000  # tokens of earlier outputs learned at most (about 1 M automaton states)
RECOUNT_GROWTH = 0.1  # occurrence counts are refreshed when the corpus grew by this share


class SuffixAutomaton:
    """Online suffix automaton over a sequence of token ids (Blumer et al. 1985)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.length = [0]  # longest string of each state
        self.link = [-1]  # suffix link
        self.next: list[dict[int, int]] = [{}]  # transitions
        self.first_end = [-1]  # end position of the first occurrence of the state's strings
        self.is_clone = [False]
        self.count: list[int] = [0]  # occurrences; valid after `count_occurrences`
        self.last = 0  # the state of the whole sequence

    def extend(self, token: int) -> None:
        position = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(self.length[self.last] + 1, position, clone=False)
        state = self.last
        while state != -1 and token not in self.next[state]:
            self.next[state][token] = cur
            state = self.link[state]
        if state == -1:
            self.link[cur] = 0
        else:
            target = self.next[state][token]
            if self.length[state] + 1 == self.length[target]:
                self.link[cur] = target
            else:
                clone = self._new_state(self.length[state] + 1, self.first_end[target], clone=True)
                self.next[clone] = dict(self.next[target])
                self.link[clone] = self.link[target]
                while state != -1 and self.next[state].get(token) == target:
                    self.next[state][token] = clone
                    state = self.link[state]
                self.link[target] = clone
                self.link[cur] = clone
        self.last = cur

    def _new_state(self, length: int, first_end: int, clone: bool) -> int:
        self.length.append(length)
        self.link.append(-1)
        self.next.append({})
        self.first_end.append(first_end)
        self.is_clone.append(clone)
        self.count.append(0)
        return len(self.length) - 1

    def count_occurrences(self) -> None:
        """Occurrence counts (end-position set sizes) for every state, in O(states)."""
        self.count = [0 if clone else 1 for clone in self.is_clone]
        self.count[0] = 0
        for state in sorted(range(1, len(self.length)), key=self.length.__getitem__, reverse=True):
            self.count[self.link[state]] += self.count[state]

    def step(self, state: int, matched: int, token: int) -> tuple[int, int]:
        """Advance a running match by one token: (state, matched length) of the longest suffix found."""
        while state and token not in self.next[state]:
            state = self.link[state]
            matched = self.length[state]
        if token in self.next[state]:
            return self.next[state][token], matched + 1
        return 0, 0

    def most_frequent_path(self, state: int, max_tokens: int, first: int | None = None) -> list[int]:
        """Follow the most frequent transition from `state` (optionally forcing the first token)."""
        path: list[int] = []
        while len(path) < max_tokens:
            options = {t: s for t, s in self.next[state].items() if t != SEPARATOR}
            if not options:
                break
            token = first if (first is not None and not path) else max(options, key=lambda t: self.count[options[t]])
            path.append(token)
            state = options[token]
        return path


class Corpus:
    """The corpus automaton with its documents and what was learned: one object, shared by the
    per-request copies of a drafter (`Drafter.for_request`)."""

    def __init__(self, documents: list[list[int]]) -> None:
        self.automaton = SuffixAutomaton()
        for document in documents:
            self.add(document)
        self.automaton.count_occurrences()
        self.counted_states = len(self.automaton.length)
        self.learned = 0  # tokens of earlier outputs added
        self.held: list[list[int]] | None = None  # outputs kept aside while learning is held (`hold`)

    def add(self, document: list[int]) -> None:
        for token in document:
            self.automaton.extend(token)
        self.automaton.extend(SEPARATOR)

    def hold(self) -> None:
        """From now on, keep outputs aside instead of learning them (until `release`)."""
        if self.held is None:
            self.held = []

    def release(self) -> None:
        """Learn the outputs kept aside, in the order they came, and learn as they come again."""
        held, self.held = self.held or [], None
        for output in held:
            self.learn(output)

    def learn(self, output: list[int]) -> None:
        """Add an output (up to LEARN_LIMIT tokens in all); occurrence counts are refreshed as it grows."""
        if self.held is not None:
            self.held.append(list(output))
            return
        if not output or self.learned + len(output) > LEARN_LIMIT:
            return
        self.add(output)
        self.learned += len(output)
        states = len(self.automaton.length)
        if states > self.counted_states * (1 + RECOUNT_GROWTH):  # newer states count 0 until then
            self.automaton.count_occurrences()
            self.counted_states = states


class SuffixDrafter(Drafter):
    looks_up = True

    def __init__(self, corpus: list[list[int]] | None = None, min_match: int = 2,
                 learn_outputs: bool = False) -> None:
        if min_match < 1:
            raise ConfigError(f"min_match must be >= 1, got {min_match}")
        self.min_match = min_match
        self.learn_outputs = learn_outputs
        self.name = "suffix+corpus" if corpus else "suffix"
        self.shared = Corpus(corpus or [])
        self.corpus = self.shared.automaton
        self.request = SuffixAutomaton()
        self.corpus_match = (0, 0)

    def begin(self, prompt_ids: list[int], max_len: int, target_cache=None) -> None:
        self.request = SuffixAutomaton()
        self.corpus_match = (0, 0)
        self._catch_up(prompt_ids)  # the prompt read now, so that a round's ask reads only new tokens

    def finish(self, tokens: list[int], prompt_length: int) -> None:
        if self.learn_outputs:
            self.shared.learn(tokens[prompt_length:])

    def hold_learning(self) -> None:
        self.shared.hold()

    def release_learning(self) -> None:
        self.shared.release()

    def _catch_up(self, tokens: list[int]) -> None:
        for token in tokens[len(self.request.tokens):]:
            self.request.extend(token)
            self.corpus_match = self.corpus.step(*self.corpus_match, token)

    def _request_match(self) -> tuple[int, int]:
        """(first end position, length) of the longest suffix that also occurred earlier in the request."""
        end = len(self.request.tokens) - 1
        state = self.request.link[self.request.last]
        while state > 0:
            if self.request.first_end[state] < end:
                return self.request.first_end[state], self.request.length[state]
            state = self.request.link[state]
        return -1, 0

    def propose(
        self, tokens: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        self._catch_up(tokens)
        if max_tokens <= 0:
            return Draft([])
        request_end, request_len = self._request_match()
        corpus_state, corpus_len = self.corpus_match
        found = []  # (match length, proposal): the request's first, so that it wins a tie
        if request_len >= self.min_match:
            found.append((request_len, Draft(self.request.tokens[request_end + 1 : request_end + 1 + max_tokens],
                                             match_length=request_len)))
        if corpus_len >= self.min_match:
            found.append((corpus_len, Draft(self.corpus.most_frequent_path(corpus_state, max_tokens),
                                            match_length=corpus_len, source=CORPUS)))
        # the longer match first (a stable sort: the request's on a tie)
        found = sorted((pair for pair in found if len(pair[1])), key=lambda pair: -pair[0])
        if not found:
            return Draft([])
        best = found[0][1]
        if len(found) > 1:
            best.alternative = found[1][1]  # the policy weighs both by what each text's matches were worth
        return best

    def candidates(self, tokens: list[int], max_tokens: int, count: int) -> list[list[int]]:
        """Up to `count` continuations from the corpus, one per most frequent first token."""
        self._catch_up(tokens)
        state, matched = self.corpus_match
        if matched < self.min_match:
            return []
        firsts = sorted((t for t in self.corpus.next[state] if t != SEPARATOR),
                        key=lambda t: self.corpus.count[self.corpus.next[state][t]], reverse=True)
        return [self.corpus.most_frequent_path(state, max_tokens, first=t) for t in firsts[:count]]


def read_corpus(path: Path, encode) -> list[list[int]]:
    """Token documents from a text file, a folder of .txt/.md files, or JSON lines with "text"."""
    if not path.exists():
        raise SpecdecError(f"corpus {path} does not exist")
    files = sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".md", ".jsonl")) if path.is_dir() else [path]
    documents = []
    for file in files:
        try:
            content = file.read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise SpecdecError(f"cannot read corpus file {file}: {err}") from None
        if file.suffix == ".jsonl":
            for number, line in enumerate(content.splitlines(), 1):
                if line.strip():
                    try:
                        documents.append(encode(json.loads(line)["text"]))
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise SpecdecError(f'{file}:{number} is not a JSON object with a "text" field') from None
        else:
            documents.append(encode(content))
    if not any(documents):
        raise SpecdecError(f"corpus {path} holds no text")
    return documents


def build(spec: DrafterSpec, target, **load) -> SuffixDrafter:
    """`suffix[:PATH]`: learning from its outputs; with PATH, a corpus besides."""
    if not spec.arg:
        return SuffixDrafter(learn_outputs=True)
    encode = lambda text: target.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    return SuffixDrafter(read_corpus(Path(spec.arg).expanduser(), encode), learn_outputs=True)
