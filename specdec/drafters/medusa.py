"""Medusa drafting: the heads' top candidates at each depth, verified as one static token tree.

The last feature the target has given is that of the token before the last committed one (the
last committed token has not been through the target yet), so head k proposes the token k places
after the last committed one: head 1 the first draft, head 2 the second, ... The tree is built from
choice paths (`tree.from_paths`): path [0, 1] is "head 1's best, then head 2's second best". The
default tree suits a CPU, where every verified token costs: 16 nodes, 4 deep (cut to the number of
heads). A chain (`paths` of first choices only) is the tree with one node per depth.
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.drafters.base import Draft, Drafter, full_vocabulary_logits, module_digest
from specdec.drafters.spec import DrafterSpec
from specdec.errors import ConfigError
from specdec.heads.files import load_module
from specdec.heads.shipped import shipped_head
from specdec.heads.medusa import MedusaConfig, MedusaHeads
from specdec.runtime.llama import LlamaModel
from specdec.sampling import SamplingParams, logits_to_probs
from specdec.tree import from_paths

DEFAULT_PATHS = [[0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0],
                 [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]]


def load_medusa_heads(folder: Path, target) -> MedusaHeads:
    return load_module(folder, "medusa", target, lambda config: MedusaHeads(MedusaConfig(**config)))


class MedusaDrafter(Drafter):
    wants_features = True

    def __init__(self, target, heads: MedusaHeads, name: str = "medusa", paths: list[list[int]] | None = None) -> None:
        if not isinstance(target.net, LlamaModel):
            raise ConfigError("Medusa drafting reads the target's features: it needs the lean runtime (--runtime lean)")
        self.net = target.net
        self.heads = heads
        self.name = name
        self.head_digest = module_digest(heads)  # a changed head file is priced anew
        self.paths = paths if paths is not None else [p for p in DEFAULT_PATHS if len(p) <= heads.config.num_heads]
        deepest = max(len(p) for p in self.paths)
        if deepest > heads.config.num_heads:
            raise ConfigError(f"the tree is {deepest} deep but there are only {heads.config.num_heads} Medusa heads")
        self.nodes = {tuple(p[:k]) for p in self.paths for k in range(1, len(p) + 1)}  # from_paths adds missing prefixes
        self.max_nodes = len(self.nodes)
        self.width = max(max(p) for p in self.paths) + 1  # candidates needed per head
        self.head_rows = self.net.lm_head_weight()[heads.vocab_ids].clone()  # [Vd, hidden]
        self.last_feature: torch.Tensor | None = None

    def weights_digest(self) -> str:
        return self.head_digest

    def begin(self, prompt_ids: list[int], max_len: int, target_cache=None) -> None:
        self.last_feature = None

    def accept_features(self, hidden: torch.Tensor) -> None:  # [n, hidden]: only the newest is read
        self.last_feature = hidden[-1]

    def verified_tokens(self, gamma: int) -> int:
        return sum(len(node) <= gamma for node in self.nodes)

    @torch.inference_mode()
    def propose(self, tokens: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        if max_tokens <= 0:
            return Draft([], None)
        if self.last_feature is None:
            raise RuntimeError(f"{self.name} has no feature yet: the engine must call accept_features")
        depth = min(max_tokens, self.heads.config.num_heads)
        guesses = self.heads(self.last_feature)[:depth]  # [depth, hidden]
        logits = full_vocabulary_logits(guesses @ self.head_rows.T, self.heads.vocab_ids, self.net.vocab_size)  # [depth, V]
        ranked = logits if params.greedy else logits_to_probs(logits, params)  # [depth, V]
        top = ranked.topk(min(self.width, len(self.heads.vocab_ids)), dim=-1)
        candidates = [[t for t, v in zip(ids, vals) if v > (float("-inf") if params.greedy else 0.0)]
                      for ids, vals in zip(top.indices.tolist(), top.values.tolist())]
        tree, _ = from_paths([p for p in self.paths if len(p) <= depth], candidates)
        return Draft(tree.tokens, None, parents=tree.parents)


def build(spec: DrafterSpec, target, **load) -> MedusaDrafter:
    """`medusa[:PATH]`: the heads in PATH, or the shipped ones that fit the target."""
    folder = Path(spec.arg).expanduser() if spec.arg else shipped_head(target, "medusa")
    return MedusaDrafter(target, load_medusa_heads(folder, target), name=str(spec))
