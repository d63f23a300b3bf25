"""A static, preallocated key/value cache of one sequence, written by position.

Slots `[0, length)` hold the keys and values of the tokens the model has seen, in order. A forward
pass writes its new tokens at slots `[length, length + T)` and then advances `length`. Rolling back
a chain only moves `length` (stale slots are never read: attention looks at `[0, length)` only, and
the next pass overwrites them). `compact(keep)` keeps an arbitrary, ascending set of slots and moves
them to the front: after a token tree is verified, it keeps the accepted path. It holds the model's
dtype, or float16 where specdec's kernels run the attention (they widen it exactly as they read).

A cache grows as its sequence does (`grow`: larger tensors, the slots held so far copied), and a
preempted request gives its memory back (`release`) and fills it again later.

Only the engine (or a drafter, for its own private model) moves a cache.
"""

from __future__ import annotations

import torch

from specdec.errors import ConfigError


class CacheLength:
    """What every cache shares: a capacity, a length, and the checks on moving the length."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.length = 0

    def reserve(self, num_new: int) -> None:
        """Check that `num_new` more tokens fit; raise a clear error if they do not."""
        if self.length + num_new > self.max_len:
            raise ConfigError(
                f"the sequence would reach {self.length + num_new} tokens, past the cache's "
                f"{self.max_len}; shorten the prompt or lower max_new_tokens"
            )

    def check_truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")

    def grow(self, max_len: int) -> None:
        """Room for `max_len` tokens, what it holds kept (a cache with no storage of its own: the bound)."""
        self.max_len = max(self.max_len, max_len)

    def release(self) -> None:
        """Hold nothing, and give back the memory (the request was preempted: it fills the cache again)."""
        self.length = 0

    @property
    def nbytes(self) -> int:
        """The memory it holds (a cache with no storage of its own: 0)."""
        return 0

    def slot_bytes(self) -> int:
        """The memory one more slot takes (a cache with no storage of its own: 0)."""
        return 0


class StaticKVCache(CacheLength):
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__(max_len)
        shape = (num_layers, 1, num_kv_heads, max_len, head_dim)  # one sequence (a batch has a cache per row)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)  # [L, 1, Hkv, S_max, D]
        self.values = torch.zeros(shape, device=device, dtype=dtype)  # [L, 1, Hkv, S_max, D]

    def grow(self, max_len: int) -> None:
        """Room for `max_len` tokens: larger tensors, the first `length` slots copied (the others are never read)."""
        if max_len <= self.max_len:
            return
        layers, _, heads, _, head_dim = self.keys.shape
        keys = torch.zeros(layers, 1, heads, max_len, head_dim, device=self.keys.device, dtype=self.keys.dtype)
        values = torch.zeros_like(keys)
        keys[:, :, :, :self.length] = self.keys[:, :, :, :self.length]
        values[:, :, :, :self.length] = self.values[:, :, :, :self.length]
        self.keys, self.values, self.max_len = keys, values, max_len  # [L, 1, Hkv, S_max, D] each

    def release(self) -> None:
        """Hold no slot and no memory: tensors of no slots, to grow again when the request comes back."""
        layers, _, heads, _, head_dim = self.keys.shape
        self.keys = self.keys.new_zeros(layers, 1, heads, 0, head_dim)
        self.values = self.values.new_zeros(layers, 1, heads, 0, head_dim)
        self.max_len = self.length = 0

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def slot_bytes(self) -> int:
        layers, _, heads, _, head_dim = self.keys.shape
        return 2 * layers * heads * head_dim * self.keys.element_size()

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' keys/values for one layer (rounded to the cache's dtype) and return
        all live ones, in the cache's dtype.

        keys, values: [1, Hkv, T, D]  (the T tokens of the current pass)
        returns: ([1, Hkv, length + T, D], [1, Hkv, length + T, D])
        """
        end = self.length + keys.shape[2]
        self.keys[layer, :, :, self.length : end] = keys
        self.values[layer, :, :, self.length : end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self, num_new: int) -> None:
        """Mark the `num_new` tokens written by the last pass as part of the sequence."""
        self.length += num_new

    def truncate(self, length: int) -> None:
        """Roll back to the first `length` tokens (a chain rejection): O(1), nothing is copied."""
        self.check_truncate(length)
        self.length = length

    def copy_from(self, other: "StaticKVCache", length: int | None = None) -> None:
        """Hold what `other` holds in its first `length` slots (default: all `other.length`), with this
        cache's room."""
        length = other.length if length is None else length
        other.check_truncate(length)
        same_shape = other.keys.shape[:3] + other.keys.shape[4:] == self.keys.shape[:3] + self.keys.shape[4:]
        if not same_shape or other.keys.dtype != self.keys.dtype or length > self.max_len:
            raise ValueError("copy_from needs a cache of the same layers, heads, head size and dtype that fits here")
        self.keys[:, :, :, :length] = other.keys[:, :, :, :length]
        self.values[:, :, :, :length] = other.values[:, :, :, :length]
        self.length = length

    def prefix(self, length: int) -> "StaticKVCache":
        """A new cache holding a copy of the first `length` slots, with room for exactly those."""
        layers, _, heads, _, head_dim = self.keys.shape
        copy = StaticKVCache(layers, heads, head_dim, length, device=self.keys.device, dtype=self.keys.dtype)
        copy.copy_from(self, length)
        return copy

    def compact(self, keep: torch.Tensor) -> None:
        """Keep only the slots in `keep` (ascending, [N]) and move them to the front, in order."""
        keep = keep.to(device=self.keys.device, dtype=torch.long)
        if keep.numel() and (int(keep.max()) >= self.length or bool((keep[1:] <= keep[:-1]).any())):
            raise ValueError("compact needs strictly ascending slot indices below the cache length")
        n = keep.numel()
        # slots already in place (a tree pass keeps the whole context before it) are not copied
        in_place = int((keep == torch.arange(n, device=keep.device)).long().cumprod(0).sum())
        moved = keep[in_place:]
        self.keys[:, :, :, in_place:n] = self.keys.index_select(3, moved)
        self.values[:, :, :, in_place:n] = self.values.index_select(3, moved)
        self.length = n
