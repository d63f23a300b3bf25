"""The server's memory for KV caches: what a row needs, what the machine can give, how many rows fit.

Every row holds a target cache of its own, which grows in steps of 256 slots as the row does, up to
`cache_slots` (its prompt, its `max_tokens` and the largest token tree), and is freed when it leaves.
The scheduler admits a waiting request only while the rows' caches, grown for their next round and its
own included, stay within the budget (`--kv-memory`; by default 80% of the memory the machine has
available at start, less the model's weights); when growing rows would pass it, the rows that joined
last are preempted (serve/scheduler.py). A request whose largest cache alone is larger than the budget
is refused.
Drafters' own caches (a separate draft model's, an EAGLE head's) are small beside the target's and
are not counted.
"""

from __future__ import annotations

from pathlib import Path

from specdec.runtime.weight_formats import weight_bytes


DEFAULT_SHARE = 0.8  # of the memory available at start (weights excluded) that KV caches may take


def cache_bytes_per_slot(net) -> int:
    """Bytes of one slot (one token's keys and values at every layer) of the model's cache."""
    return net.new_cache(1).slot_bytes()


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The memory the machine can give without swapping (Linux's MemAvailable), or None elsewhere."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_budget(net) -> int | None:
    """DEFAULT_SHARE of what is available beyond the weights (whose pages a memory-mapped model counts
    as available, though it needs them), or None where the machine does not say."""
    available = available_bytes()
    if available is None:
        return None
    return max(0, int(DEFAULT_SHARE * (available - weight_bytes(net))))
