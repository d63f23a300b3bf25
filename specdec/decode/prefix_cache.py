"""What a finished request computed, kept for the next request that starts with the same tokens.

A conversation's next turn resends the whole history; a server's clients resend one system prompt.
Each `Entry` holds the committed tokens of a finished request, the keys and values of their slots
(`StaticKVCache.prefix`: every layer, in the cache's dtype) and, where the engine's drafters read
the target's features (EAGLE, Medusa), those tokens' `Features`. A new request that begins with an
entry's first n tokens copies those n slots into its own cache and hands the n features to its
readers, and prefills only the rest of its prompt (`Row`, decode/batch.py).

Exactness: specdec's CPU kernels compute every token's keys, values and features by the same
operations in the same order whatever else is in the pass (batch-invariant, docs/ARCHITECTURE.md),
so with quantized linears (a GGUF as stored, the default) the slots copied are, bit for bit, what
prefilling those n tokens would write, and every logit after them is the same; a float
checkpoint's linears round a row by the pass's row count, as in a batch, so there the logits agree
to round-off (tests/test_prefix_cache.py checks the logits and whole generations). At least the
prompt's last token is always prefilled: its logits give the first new token.

Entries are kept while their bytes (slots and features) fit `max_bytes` in all; the least recently
used goes first. A lookup compares the prompt with every entry (a conversation holds a few; a server
with many shared prompts would want a radix tree).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from specdec.drafters.base import Features
from specdec.runtime.kv_cache import StaticKVCache

DEFAULT_MAX_BYTES = 1 << 30  # a 2,000-token conversation of an 8B model (float16 cache): 256 MiB


@dataclass
class Entry:
    tokens: tuple[int, ...]  # the committed tokens whose slots `cache` holds, in order
    cache: StaticKVCache  # [0, len(tokens)) filled, exactly that long
    features: Features | None  # their features ([len(tokens), ...]), where the drafters read them
    bytes: int  # what the slots and features take (`held_bytes`)


def held_bytes(cache: StaticKVCache, length: int, features: Features | None) -> int:
    """Bytes of an entry of the first `length` slots of `cache` and these features, before copying them."""
    slot = sum(t[:, :, :, :1].numel() * t.element_size() for t in (cache.keys, cache.values))  # one token, every layer
    extra = [] if features is None else [features.final, *features.aux.values()]
    return length * slot + sum(t.numel() * t.element_size() for t in extra)


def common_length(a: tuple[int, ...], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """The entries of finished requests, looked up by the longest shared beginning (module docstring)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"a prefix cache holds at least 1 byte, got {max_bytes}")
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()  # least recently used first
        self.bytes = 0  # what the entries hold in all

    def lookup(self, prompt_ids: list[int], feature_layers: tuple[int, ...] | None) -> tuple[int, Entry | None]:
        """The longest reusable beginning of `prompt_ids` (never all of it) and the entry that holds
        it, or (0, None). `feature_layers`: what the request's drafters read (None: nothing; () the
        final features only); an entry without them cannot serve it."""
        best, found = 0, None
        for entry in self.entries.values():
            if feature_layers is not None and not _has_features(entry.features, feature_layers):
                continue
            shared = min(common_length(entry.tokens, prompt_ids), len(prompt_ids) - 1)
            if shared > best:
                best, found = shared, entry
        if found is not None:
            self.entries.move_to_end(found.tokens)
        return best, found

    def store(self, tokens: list[int], cache: StaticKVCache, features: Features | None) -> None:
        """Keep `tokens` (the first `len(tokens)` slots of `cache`, copied) and their features; the
        least recently used entries leave to make room. An entry that another holds whole is dropped."""
        key = tuple(tokens)
        if not key:
            return
        for other in list(self.entries):
            if other[:len(key)] == key:  # already held (the same request again, or a longer one)
                self.entries.move_to_end(other)
                return
            if key[:len(other)] == other:  # this one holds it whole
                self.bytes -= self.entries.pop(other).bytes
        size = held_bytes(cache, len(key), features)
        if size > self.max_bytes:  # could never fit: not copied
            return
        self.entries[key] = Entry(key, cache.prefix(len(key)), features, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self.bytes -= self.entries.popitem(last=False)[1].bytes

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


def _has_features(features: Features | None, layers: tuple[int, ...]) -> bool:
    return features is not None and all(layer in features.aux for layer in layers)


def joined(parts: list[Features]) -> Features:
    """Features of consecutive tokens, in order, as one ([sum of n, ...]); the layers every part has
    (a server's passes capture what all their rows' drafters read, which may change)."""
    layers = sorted(set.intersection(*(set(p.aux) for p in parts)))
    return Features(torch.cat([p.final for p in parts]), {layer: torch.cat([p.aux[layer] for p in parts]) for layer in layers})
