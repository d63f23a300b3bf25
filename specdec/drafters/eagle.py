"""EAGLE drafting: an EAGLE head (`heads/eagle.py`) or an EAGLE-3 head (`heads/eagle3.py`) proposes
from the target's own features.

State per request: the target's features of every committed token but the last (the engine hands
them over after the prefill and after each verification pass: `accept_features`; for EAGLE-3 the
inputs of the layers the head reads, `feature_layers`), and the head's one-layer KV cache over the
pairs (f_t, x_{t+1}) already fed. A proposal feeds the pairs not yet fed (the last committed
token's pair among them), then drafts one token at a time, feeding the head its own predicted
feature with each drafted token, and finally rolls its cache back to the committed pairs. The
target is only read (embedding, and an EAGLE head's LM head rows), never changed. The two heads
differ only in what they read and how their output becomes logits: an EAGLE head's predicted
feature goes through the target's LM head rows of its draft vocabulary, an EAGLE-3 head's through
its own norm and LM head.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch
from torch import nn

from specdec.drafters.base import Draft, Drafter, draft_chain, module_digest
from specdec.drafters.spec import DrafterSpec
from specdec.errors import ConfigError
from specdec.heads.eagle import EagleConfig, EagleHead
from specdec.heads.eagle3 import Eagle3Config, Eagle3Head
from specdec.heads.files import load_module
from specdec.heads.shipped import shipped_head
from specdec.runtime.kernels import invariant_kernels
from specdec.runtime.kv_cache import StaticKVCache
from specdec.runtime.llama import LlamaModel, cache_attention_mask
from specdec.runtime.quant import quantize_linears, quantized_bits
from specdec.sampling import SamplingParams, logits_to_probs

TREE_BUDGET, TREE_TOP_K = 16, 4  # eagle-tree and eagle3: nodes verified per round, candidates per expanded node


def load_eagle_head(folder: Path, target) -> EagleHead:
    return load_module(folder, "eagle", target, lambda config: EagleHead(EagleConfig(**config)))


def load_eagle3_head(folder: Path, target) -> Eagle3Head:
    head = load_module(folder, "eagle3", target, lambda config: Eagle3Head(Eagle3Config(**config)))
    layers = target.net.config.num_layers
    if any(not 0 <= layer < layers for layer in head.config.aux_layers):
        raise ConfigError(f"{folder} reads the target's layers {head.config.aux_layers}, but it has {layers} layers")
    return head


class EagleDrafter(Drafter):
    """A chain of γ drafts, or with `tree_budget` a dynamic tree (EAGLE-2): γ levels deep, each level
    expanding the `top_k` most probable nodes of the level before by their `top_k` most probable
    next tokens, then keeping the `top_k` × γ nodes (at most `tree_budget`) with the highest path
    probability (the product of the draft's probabilities along the path; a node always outranks its
    children, so the kept nodes form a tree). A shallow tree is thus a small one: choosing γ, the
    policy chooses what the verification pass costs, which matters where a pass over 17 tokens costs
    three one-token passes (a CPU), not only where it costs one (a GPU). Candidates are ranked by the draft's distribution under the target's
    sampling transform; they are fixed before verification, which treats them as point masses."""

    wants_features = True  # the engine passes the target's final hidden states of committed tokens

    def __init__(self, target, head: EagleHead | Eagle3Head, name: str = "eagle", tree_budget: int = 0,
                 top_k: int = 4) -> None:
        if not isinstance(target.net, LlamaModel):
            raise ConfigError("EAGLE drafting reads the target's features: it needs the lean runtime (--runtime lean)")
        self.net = target.net
        self.name = name
        self.head_digest = module_digest(head)  # the head as loaded: a changed head file is priced anew
        self.vocab_ids = head.vocab_ids  # [Vd] target ids
        # beside a quantized target the head's linears are quantized as finely (4-bit beside a Q4 GGUF): a
        # draft step costs what its weights' bytes do
        bits = quantized_bits(self.net)
        self.kernels = self.layer_weights = None  # an EAGLE-3 head's layer in one kernel call, where it is quantized
        if isinstance(head, Eagle3Head):
            self.feature_layers = tuple(head.config.aux_layers)
            self.feature_size = len(self.feature_layers) * head.config.target_hidden_size
            if bits:
                head = quantize_linears(copy.deepcopy(head), bits)
                self.kernels = invariant_kernels()
                self.layer_weights = head.kernel_weights() if self.kernels is not None else None
            self.draft_logits = functools.partial(head.logits, kernels=self.kernels)
        else:
            self.feature_size = head.config.hidden_size
            rows = nn.Linear(head.config.hidden_size, len(self.vocab_ids), bias=False)  # the target's LM head rows
            rows.weight = nn.Parameter(self.net.lm_head_weight()[self.vocab_ids].detach().clone(), requires_grad=False)
            if bits:
                head = quantize_linears(copy.deepcopy(head), bits)
                rows = quantize_linears(rows, bits)
            self.draft_logits = rows  # [n, hidden] -> [n, Vd]
        self.head = head
        if tree_budget < 0 or top_k < 1:
            raise ConfigError(f"an EAGLE tree needs a budget >= 1 node and top_k >= 1, got {tree_budget} and {top_k}")
        self.max_nodes = tree_budget  # 0: chains
        self.stops_early = not tree_budget  # a chain drafts while the policy's keep_drafting says its confidence pays
        self.top_k = top_k
        self.cache: StaticKVCache | None = None
        self.features: torch.Tensor | None = None  # [max_len, hidden]: f_t of committed tokens
        self.known = 0  # features known for tokens [0, known)

    def weights_digest(self) -> str:
        return self.head_digest

    def begin(self, prompt_ids: list[int], max_len: int, target_cache=None) -> None:
        c = self.head.config
        room = max_len + 1 + self.max_nodes * self.top_k  # committed pairs, then a chain or the tree's expanded nodes
        self.cache = StaticKVCache(1, c.num_kv_heads, c.head_dim, room, device=self.net.device, dtype=self.net.dtype)
        if self.layer_weights is not None:  # RoPE of every slot, once: [room, D] each
            cos, sin = self.head.rope(torch.arange(room, device=self.net.device)[None])
            self.rope_table = (cos[0, 0].contiguous(), sin[0, 0].contiguous())
        self.features = torch.zeros(max_len, self.feature_size, device=self.net.device, dtype=self.net.dtype)
        self.known = 0

    def accept_features(self, hidden: torch.Tensor) -> None:  # hidden: [n, feature_size] of the next n committed tokens
        n = hidden.shape[0]
        self.features[self.known:self.known + n] = hidden
        self.known += n

    @torch.inference_mode()
    def _feed(self, features: torch.Tensor, ids: list[int], positions: list[int] | None = None,
              tree_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed pairs (features [n, hidden], ids [n]) into the next slots of the head's cache, at the
        next positions (a chain) or at `positions` seeing the committed pairs and per `tree_mask`
        [n, slots drafted so far + n] the drafted ones. `features` are the target's ([n, feature_size])
        or the head's own predictions ([n, hidden]). Returns the predicted features [n, hidden]
        and the draft logits over the draft vocabulary (`vocab_ids` maps them to target ids): [n, Vd]
        for tree nodes, [1, Vd] for a chain's feed, whose last pair alone is drafted from (a probe
        after a long rest feeds hundreds of pairs; their logits over Vd would cost more than the layer)."""
        device = self.net.device
        past, n = self.cache.length, len(ids)
        self.cache.reserve(n)
        if positions is None and self.layer_weights is not None:
            return self._feed_chain_fused(features, ids)
        if positions is None:
            position_ids = torch.arange(past, past + n, device=device)[None]  # [1, n]
            causal = past == 0 and n > 1
            mask = None if causal else cache_attention_mask(past, n, None, device)
        else:
            position_ids = torch.tensor([positions], device=device)
            causal = False
            committed = torch.ones(n, self.known, dtype=torch.bool, device=device)
            mask = torch.cat((committed, tree_mask.to(device)), dim=1)[None, None]  # [1, 1, n, past + n]
        embeds = self.net.embed(torch.tensor([ids], device=device))  # [1, n, hidden]
        predicted = self.head(features[None], embeds, position_ids, self.cache, mask, causal)[0]  # [n, hidden]
        self.cache.advance(n)
        return predicted, self.draft_logits(predicted if positions is not None else predicted[-1:])

    def _feed_chain_fused(self, features: torch.Tensor, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """`_feed` of a chain for a quantized EAGLE-3 head: its layer in one kernel call (`eagle3_layer`,
        the kernels' attention instead of SDPA; tested against the module path)."""
        past, n, c = self.cache.length, len(ids), self.head.config
        embeds = self.net.embed(torch.tensor(ids, device=self.net.device))  # [n, hidden]
        if features.shape[-1] != c.hidden_size:
            features = self.head.fc(features)  # [n, 3 Ht] -> [n, hidden]
        cos, sin = self.rope_table
        predicted = self.kernels.eagle3_layer(embeds, features, self.layer_weights, cos[past:past + n],
                                              sin[past:past + n], self.cache.keys, self.cache.values, past,
                                              c.rms_norm_eps, c.num_heads, c.num_kv_heads)  # [n, hidden]
        self.cache.advance(n)
        return predicted, self.draft_logits(predicted[-1:])  # [1, Vd]: a chain drafts from its last pair

    def verified_tokens(self, gamma: int) -> int:
        """Draft tokens a proposal of depth γ puts in the verification pass (the policy prices it)."""
        if not self.max_nodes:
            return gamma
        return min(self.max_nodes, self.top_k * gamma, self.top_k + (gamma - 1) * self.top_k * self.top_k)

    def catch_up_tokens(self, tokens: list[int]) -> int:
        """Committed pairs before the last one that the next proposal feeds the head first."""
        return max(0, self.known - 1 - self.cache.length) if self.cache is not None else 0

    def _catch_up(self, tokens: list[int]) -> int:
        """Check the features are in step, roll the cache back to the committed pairs not yet fed
        (at least the last one, whose prediction starts the draft); returns the first pair to feed."""
        if self.known != len(tokens) - 1:
            raise RuntimeError(f"{self.name} has features for {self.known} tokens, expected {len(tokens) - 1} "
                               "(every committed token but the last): the engine must call accept_features")
        start = min(self.cache.length, self.known - 1)  # pairs (f_t, x_{t+1}) for t >= start are not fed yet
        self.cache.truncate(start)
        return start

    def propose(self, tokens: list[int], max_tokens: int, params: SamplingParams, generator: torch.Generator,
                keep_drafting=None) -> Draft:
        if max_tokens <= 0:
            return Draft([], None)
        if self.max_nodes:
            return self._propose_tree(tokens, max_tokens, params)
        start = self._catch_up(tokens)
        state = {"feature": None}

        def next_logits(ids: list[int]) -> torch.Tensor:
            if state["feature"] is None:  # the committed pairs: the target's own features
                features = self.features[start:self.known]  # [n, hidden]
            else:  # a drafted token: the head's own prediction of the feature before it
                features = state["feature"][None]  # [1, hidden]
            predicted, logits = self._feed(features, ids)
            state["feature"] = predicted[-1]
            return logits[-1]  # [Vd]

        try:
            return draft_chain(next_logits, tokens[start + 1:], max_tokens, params, generator, self.vocab_ids,
                               self.net.vocab_size, keep_drafting)
        finally:
            self.cache.truncate(self.known)

    def _propose_tree(self, tokens: list[int], depth: int, params: SamplingParams) -> Draft:
        start = self._catch_up(tokens)
        try:
            predicted, logits = self._feed(self.features[start:self.known], tokens[start + 1:])
            width = min(self.top_k, len(self.vocab_ids))
            node_tokens: list[int] = []
            node_parents: list[int] = []
            scores: list[float] = []  # log of the path probability under q
            depths: list[int] = []  # 1 for the root's children
            slot: dict[int, int] = {}  # fed node → its slot among this round's drafted pairs
            outputs = [predicted[-1]]  # predicted features: [0] the root's, then one per fed node, by slot + 1
            level = self._add(node_tokens, node_parents, scores, depths, -1, self._top(logits[-1], params, width))
            for _ in range(depth - 1):
                expand = sorted(level, key=lambda i: -scores[i])[: self.top_k]
                parents_fed = [0 if node_parents[i] < 0 else slot[node_parents[i]] + 1 for i in expand]
                mask = self._tree_mask(expand, node_parents, slot)
                positions = [self.known + depths[i] - 1 for i in expand]
                for i in expand:
                    slot[i] = len(slot)
                fed, logits = self._feed(torch.stack([outputs[j] for j in parents_fed]),  # [m, hidden]
                                         [node_tokens[i] for i in expand], positions, mask)
                outputs.extend(fed)
                level = []
                for row, i in enumerate(expand):
                    level += self._add(node_tokens, node_parents, scores, depths, i,
                                       self._top(logits[row], params, width))
            keep = sorted(sorted(range(len(node_tokens)), key=lambda i: -scores[i])[: self.verified_tokens(depth)])
            new_index = {old: new for new, old in enumerate(keep)}
            return Draft([node_tokens[i] for i in keep], None,
                         parents=[-1 if node_parents[i] < 0 else new_index[node_parents[i]] for i in keep])
        finally:
            self.cache.truncate(self.known)

    def _top(self, logits: torch.Tensor, params: SamplingParams, width: int) -> tuple[list[float], list[int]]:
        """The `width` most probable tokens of draft-vocabulary logits [Vd]: (log q, target ids), q
        under the target's sampling transform (greedy: the plain softmax ranks the same; −inf for
        tokens top-k or top-p cut, which `_add` leaves out of the tree). The transform over the
        draft vocabulary equals it over the full vocabulary with −inf elsewhere (those tokens have
        no mass), without building [V] rows."""
        log_q = torch.log_softmax(logits, -1) if params.greedy else logits_to_probs(logits, params).log()  # [Vd]
        top = log_q.topk(width)
        return top.values.tolist(), self.vocab_ids[top.indices].tolist()

    @staticmethod
    def _add(node_tokens, node_parents, scores, depths, parent: int, top) -> list[int]:
        """Append `top`'s tokens (log q, ids) as children of `parent` (-1: the root); returns their node indices."""
        added = []
        for logp, token in zip(*top):
            if logp == float("-inf"):
                continue  # outside the draft vocabulary or cut by top-k / top-p
            added.append(len(node_tokens))
            node_tokens.append(token)
            node_parents.append(parent)
            scores.append((scores[parent] if parent >= 0 else 0.0) + logp)
            depths.append(depths[parent] + 1 if parent >= 0 else 1)
        return added

    def _tree_mask(self, expand: list[int], parents: list[int], slot: dict) -> torch.Tensor:
        """[m, drafted slots + m] bool: each node to feed sees its fed ancestors and itself."""
        fed = len(slot)
        mask = torch.zeros(len(expand), fed + len(expand), dtype=torch.bool)
        for row, node in enumerate(expand):
            mask[row, fed + row] = True
            ancestor = parents[node]
            while ancestor >= 0:
                mask[row, slot[ancestor]] = True
                ancestor = parents[ancestor]
        return mask


def build(spec: DrafterSpec, target, **load) -> EagleDrafter:
    """`eagle`, `eagle-tree`, `eagle3`, `eagle3-chain` [:PATH]: the head in PATH, or the shipped one that
    fits the target; eagle-tree and eagle3 draft a dynamic tree, the others a chain."""
    family = "eagle3" if spec.kind.startswith("eagle3") else "eagle"
    folder = Path(spec.arg).expanduser() if spec.arg else shipped_head(target, family)
    head = load_eagle3_head(folder, target) if family == "eagle3" else load_eagle_head(folder, target)
    tree = dict(tree_budget=TREE_BUDGET, top_k=TREE_TOP_K) if spec.kind in ("eagle-tree", "eagle3") else {}
    return EagleDrafter(target, head, name=str(spec), **tree)
