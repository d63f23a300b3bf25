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



_TRAINED: dict[int, object] = {}


def small_eagle3_head(target):
    """An EAGLE-3 head reading both layers of the tiny target, trained for a few seconds on its own
    answers (cached per target). An untrained one has its own random LM head and is almost never
    right, so the tests could not see drafts accepted and rejected; its quality is otherwise irrelevant."""
    if id(target) not in _TRAINED:
        import random
        import tempfile
        from pathlib import Path

        from specdec.drafters.eagle import load_eagle3_head
        from specdec.train.distill import distill
        from specdec.train.eagle3 import train_eagle3

        rng = random.Random(11)
        prompts = [" ".join(f"t{rng.randrange(2, 64)}" for _ in range(rng.randint(3, 12))) for _ in range(32)]
        with tempfile.TemporaryDirectory() as folder:
            distill(target, prompts, Path(folder) / "data", max_new_tokens=24, batch_size=8, shard_size=32,
                    temperatures=(0.0, 1.0), aux_layers=(0, 1))
            train_eagle3(target, Path(folder) / "data", Path(folder) / "head", draft_vocab=40, depth=2, epochs=3,
                         batch_tokens=256, lr=3e-3, validation_share=0.1, checkpoint_dir=Path(folder) / "checkpoints",
                         log=lambda *_: None)
            _TRAINED[id(target)] = load_eagle3_head(Path(folder) / "head", target)
    return _TRAINED[id(target)]
