"""Where specdec keeps what it makes once and reuses: one folder every layer may import.

`cache_root()` is `$SPECDEC_CACHE_DIR`, else `~/.cache/specdec`. Under it: `gguf/` (a GGUF file's
config, tokenizer and float weights), `kernels/` (the compiled CPU kernels), `costs/` (measured pass
times) and `checkpoints/` (training). The last two can be moved on their own with
`SPECDEC_COSTS_DIR` and `SPECDEC_CHECKPOINTS_DIR`, read where they are used.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE_DIR") or Path.home() / ".cache" / "specdec")
