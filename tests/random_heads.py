"""Seeded random EAGLE and Medusa heads for the tiny target: drafters whose exactness must not
depend on their quality (training is tested in test_heads.py)."""

from __future__ import annotations

import torch


def random_medusa_heads(target):
    """Three seeded random Medusa heads over a reduced vocabulary of 40 tokens (exactness must not
    depend on their quality)."""
    from specdec.heads.medusa import MedusaConfig, MedusaHeads

    torch.manual_seed(8)
    heads = MedusaHeads(MedusaConfig(target.net.config.hidden_size, target.vocab_size, 3, 40))
    heads.vocab_ids.copy_(torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(8))[:40].sort().values)
    with torch.no_grad():
        for block in heads.blocks:
            block.weight.normal_(0, 0.3)
    return heads.eval()


def random_eagle_head(target):
    """An untrained EAGLE head over a reduced vocabulary of 40 of the 64 tokens (a seeded random one:
    exactness must not depend on the head's quality; training is tested in test_heads.py)."""
    from specdec.heads.eagle import EagleConfig, EagleHead

    torch.manual_seed(7)
    head = EagleHead(EagleConfig.for_target(target.net.config, draft_vocab=40))
    head.vocab_ids.copy_(torch.randperm(target.vocab_size, generator=torch.Generator().manual_seed(7))[:40].sort().values)
    with torch.no_grad():
        for param in head.parameters():
            if param.dim() == 2:
                param.normal_(0, 0.3)  # peakier drafts than the default initialisation
    return head.eval()
