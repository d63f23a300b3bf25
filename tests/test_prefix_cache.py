"""The prefix cache (`specdec.decode.prefix_cache`): a request that starts with what an earlier one
computed copies those slots and features instead of prefilling them, and gets the same logits bit
for bit, so the same tokens.

- logits: the default model (its quantized layers, batch-invariant by construction) after a reused
  prefix equal a fresh prefill's bit for bit; control: the slots of another prefix give other logits;
- whole requests, every drafter kind (the features readers: EAGLE, EAGLE-3, Medusa, hand the
  reused tokens' features on): a conversation's second turn on an engine with a prefix cache reuses
  all but the last committed token of the first and gives the tokens of an engine without one,
  greedy and seeded T = 1 (a fixed γ and the same requests before: the same draws);
- the cache itself: least recently used out first, an entry held whole by a longer one dropped,
  never the whole prompt reused, readers served only by entries with their features.
"""

from __future__ import annotations

import pytest
import torch

from specdec.decode.engine import Engine, GenerationConfig
from specdec.decode.prefix_cache import PrefixCache
from specdec.drafters.base import Features
from specdec.runtime.kv_cache import StaticKVCache
from specdec.sampling import SamplingParams
from whole_runs import PROMPT, drafters


def test_a_reused_prefix_gives_the_logits_of_a_fresh_prefill_bit_for_bit(default_gguf):
    from specdec.runtime import load_model

    net = load_model(str(default_gguf)).net
    ids = torch.tensor([[1, *range(300, 339)]])  # [1, 40]
    shared, other = 25, ids.clone()
    other[0, 10] += 1  # another prefix of the same length

    def prefilled(tokens: torch.Tensor) -> StaticKVCache:
        cache = net.new_cache(64)
        net.forward(tokens, cache)
        return cache

    fresh = net.forward(ids, net.new_cache(64))[0, shared:]  # [15, V]
    for source, same in ((ids, True), (other, False)):
        earlier = prefilled(torch.cat([source[:, :shared], torch.tensor([[7, 8, 9]])], dim=1)).prefix(shared)
        cache = net.new_cache(64)
        cache.copy_from(earlier)
        reused = net.forward(ids[:, shared:], cache)[0]  # [15, V]
        assert torch.equal(reused, fresh) == same


def two_turns(engine: Engine, config: GenerationConfig) -> tuple[list[int], list[int], int]:
    """A conversation: the first turn's prompt, then it, its answer and a new question; returns both
    answers and how many prompt tokens the second turn reused."""
    first = engine.generate(PROMPT, config).token_ids
    second = engine.generate(PROMPT + first + [12, 7, 5], config)
    return first, second.token_ids, second.stats.reused_prompt_tokens


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, seed=5)], ids=["greedy", "T=1"])
def test_a_conversations_second_turn_reuses_the_first_and_gives_the_same_tokens(tiny_target, draft_model, sampling):
    config = GenerationConfig(max_new_tokens=12, gamma=3, ignore_eos=True, sampling=sampling)
    plain_pool, cached_pool = drafters(tiny_target, draft_model), drafters(tiny_target, draft_model)
    for kind in plain_pool:
        without = two_turns(Engine(tiny_target, plain_pool[kind]), config)
        cache = PrefixCache()
        first, second, reused = two_turns(Engine(tiny_target, cached_pool[kind], prefix_cache=cache), config)
        assert (first, second) == without[:2], kind
        # every committed token the cache held: all but the last, or all where the budget ended inside a draft
        assert without[2] == 0 and len(PROMPT) + len(first) - 1 <= reused <= len(PROMPT) + len(first), kind
        readers = cached_pool[kind].wants_features
        assert all((entry.features is not None) == readers for entry in cache.entries.values()), kind


def test_plain_requests_share_a_system_prompt(tiny_target):
    cache = PrefixCache()
    engine = Engine(tiny_target, prefix_cache=cache)
    system = [5, 9, 12, 7, 30, 31, 32, 33]
    config = GenerationConfig(max_new_tokens=6, ignore_eos=True)
    answers = [engine.generate(system + [40 + i], config) for i in range(3)]
    assert [a.stats.reused_prompt_tokens for a in answers] == [0, 8, 8]
    alone = [Engine(tiny_target).generate(system + [40 + i], config).token_ids for i in range(3)]
    assert [a.token_ids for a in answers] == alone


def entry_cache(tokens: int) -> StaticKVCache:
    cache = StaticKVCache(1, 1, 2, 64)  # a slot: 2 × 2 float32 = 16 bytes
    cache.length = tokens
    return cache


def test_the_cache_keeps_what_fits_and_the_longest_useful_beginning():
    cache = PrefixCache(max_bytes=12 * 16)  # 12 slots
    cache.store([1, 2, 3, 4, 5, 6], entry_cache(6), None)
    cache.store([1, 2, 3], entry_cache(3), None)  # held whole by the first: dropped
    assert list(cache.entries) == [(1, 2, 3, 4, 5, 6)]
    assert cache.lookup([1, 2, 3, 4, 5, 6], None)[0] == 5  # never the whole prompt: its last token is prefilled
    assert cache.lookup([1, 2, 9], None)[0] == 2 and cache.lookup([9], None) == (0, None)
    cache.store([7, 8, 9, 10], entry_cache(4), None)
    cache.lookup([1, 2, 3, 0], None)  # the first entry used last
    cache.store([20, 21, 22, 23], entry_cache(4), None)  # 14 slots: the least recently used leaves
    assert list(cache.entries) == [(1, 2, 3, 4, 5, 6), (20, 21, 22, 23)]
    cache.store([1, 2, 3, 4, 5, 6, 7, 8], entry_cache(8), None)  # holds the first whole: replaces it
    assert list(cache.entries) == [(20, 21, 22, 23), (1, 2, 3, 4, 5, 6, 7, 8)]
    # a reader of layer 1's features is served only by an entry that kept them
    assert cache.lookup([1, 2, 3, 4], (1,)) == (0, None)
    cache.store([20, 21, 22, 23, 24], entry_cache(5), Features(torch.zeros(1, 2), {1: torch.zeros(1, 2)}))
    assert cache.lookup([20, 21, 22, 30], (1,))[0] == 3 and cache.lookup([20, 21, 22, 30], (2,))[0] == 0
