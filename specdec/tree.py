"""Token trees as data: what the drafter proposes, what the target scores in one pass, and how the
accepted path is kept.

A tree has N draft nodes; node i holds token `tokens[i]` and hangs under `parents[i]` (-1: the
root, which is the last committed token, not a draft). Parents come before their children (every
builder here keeps that order), so depth and ancestry are computed in one sweep. A chain is the
tree whose node i hangs under i − 1.

For verification the root and the nodes are scored together (`tree_inputs`): N + 1 tokens at RoPE
positions past + depth, each seeing the cache and its own ancestors (the tree mask). The target's
distribution at input index j (0: root, i + 1: node i) is the one for the children of that node.
After verification the cache keeps the root and the accepted path (`kept_slots`, then the cache's
`compact`).

`from_paths` builds a static tree from a list of paths of choice indices (Medusa's format: path
[0, 1] is "the first candidate at depth 1, then the second candidate after it at depth 2").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenTree:
    tokens: list[int]  # [N] draft token ids
    parents: list[int]  # [N] parent node index, -1 = the root (the last committed token)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a tree needs one parent per token: {len(self.tokens)} tokens, {len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i}'s parent {parent} must be -1 (the root) or an earlier node")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: list[int]) -> TokenTree:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)))

    def depths(self) -> list[int]:
        """[N]: 1 for the root's children, 2 for theirs, ..."""
        out: list[int] = []
        for parent in self.parents:
            out.append(1 if parent < 0 else out[parent] + 1)
        return out

    def children(self, node: int) -> list[int]:
        """Node indices under `node` (-1: the root), in order."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """[N + 1, N + 1] bool over (root, nodes): True where the row's token may see the column's
        (itself, the root and its ancestors)."""
        n = len(self)
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        mask[:, 0] = True
        mask[0, 0] = True
        for i, parent in enumerate(self.parents):
            row = i + 1
            if parent >= 0:
                mask[row] = mask[parent + 1]
            mask[row, row] = True
        return mask


def tree_inputs(tree: TokenTree, root_token: int, past: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [1, N+1], positions [1, N+1], tree mask [N+1, N+1]) for one target pass over the root
    and the nodes, after `past` cached tokens."""
    ids = torch.tensor([[root_token, *tree.tokens]], device=device)
    positions = torch.tensor([[past, *(past + d for d in tree.depths())]], device=device)
    return ids, positions, tree.ancestor_mask().to(device)


def kept_slots(past: int, path: list[int]) -> torch.Tensor:
    """Cache slots to keep after a tree pass written at `past`: everything before it, the root, and
    the accepted nodes (ascending, as `compact` needs)."""
    return torch.tensor([*range(past + 1), *(past + 1 + node for node in path)])


def from_paths(paths: list[list[int]], candidates: list[list[int]]) -> tuple[TokenTree, list[list[int]]]:
    """A static tree from choice paths; `candidates[d]` are the tokens proposed at depth d + 1 in
    order of preference (Medusa: head d's top-k). Paths missing a prefix get it added. Returns the
    tree and, for each node, its path (so callers can tell which choice made it)."""
    wanted = sorted({tuple(p[:k]) for p in paths for k in range(1, len(p) + 1) if len(p) <= len(candidates)},
                    key=lambda p: (len(p), p))
    index: dict[tuple, int] = {}
    tokens, parents, node_paths = [], [], []
    for path in wanted:
        depth = len(path)
        if path[-1] >= len(candidates[depth - 1]):
            continue  # fewer candidates than the path asks for
        parent = index.get(path[:-1], -1) if depth > 1 else -1
        if depth > 1 and path[:-1] not in index:
            continue
        index[path] = len(tokens)
        tokens.append(candidates[depth - 1][path[-1]])
        parents.append(parent)
        node_paths.append(list(path))
    return TokenTree(tokens, parents), node_paths
