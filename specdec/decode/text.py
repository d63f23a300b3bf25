"""What a row's committed tokens become as text: `Piece`s of output, cut at the first stop string."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.runtime.tokenizer import IncrementalDetokenizer


@dataclass
class Piece:
    text: str
    token_ids: list[int]
    kind: str  # TARGET, ACCEPTED, CORRECTED or BONUS


class TextAssembler:
    """Committed ids → text pieces, cut at the first stop string, holding back a possible prefix of one.

    Text already emitted never ends in a proper prefix of a stop string (that much is held back), so a
    stop string can only begin in the held text or the new piece: the search looks there alone."""

    def __init__(self, detokenizer: IncrementalDetokenizer, stop: tuple[str, ...]) -> None:
        self.detokenizer = detokenizer
        self.stop = stop
        self.pieces: list[str] = []  # all text emitted so far
        self.held = ""  # decoded, not yet emitted: it may begin a stop string
        self.stopped = False

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def push(self, token_id: int) -> str:
        return self._emit(self.detokenizer.push([token_id]), final=False)

    def finish(self) -> str:
        if self.stopped:
            return ""
        return self._emit(self.detokenizer.flush(), final=True)

    def _emit(self, new: str, final: bool) -> str:
        buffer = self.held + new
        if not self.stop:
            end = len(buffer)
        else:
            hits = [i for i in (buffer.find(s) for s in self.stop) if i >= 0]
            if hits:
                end = min(hits)
                self.stopped = True
            elif final:
                end = len(buffer)
            else:
                end = len(buffer) - _longest_stop_prefix(buffer, self.stop)
        piece, self.held = buffer[:end], ("" if self.stopped else buffer[end:])
        if piece:
            self.pieces.append(piece)
        return piece


def _longest_stop_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
