"""One line on standard error for work that takes a while and happens once: the first conversion of
a GGUF file, the first build of the kernels, the first measurement of this machine's costs.

Standard error, so that a command's standard output stays what it promises (the text, or only the
JSON line under --json), and plain lines rather than spinners, so that logs and pipes see them too.
"""

from __future__ import annotations

import sys


def announce(message: str) -> None:
    print(f"specdec: {message}", file=sys.stderr, flush=True)
