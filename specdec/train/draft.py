"""Distilling a small separate draft model from the target (`specdec train draft`).

The draft starts as the target cut short: its embedding, its first `layers` decoder layers and its
final norm, with the LM head it shares with the embedding (the same start as `early:L`
self-speculation). It is then trained on the self-distillation data (`distill.py`) to match the
target's whole next-token distribution, p_t = softmax(f_t · W_headᵀ) recomputed from the stored
features f_t, by the forward KL(p_t ‖ q_t) at every position whose next token belongs to an answer
(DistillSpec's observation: matching the distribution, not only the argmax, is what raises the
acceptance of speculative sampling). The embedding and LM head stay frozen (shared with the
target's; only the layers and the norm learn), so the draft keeps the target's tokens' meaning.

Validation on held-out sequences, before training and after each epoch: the share of positions
where the draft's argmax is the target's own token (a greedy draft's acceptance, one step with the
true context) and the mean Σ_x min(p, q) (a sampled draft's acceptance at temperature 1).

The result is an ordinary model folder (config.json, model.safetensors, the target's tokenizer
files) that `--drafter draft:FOLDER` loads like any draft model, and transformers too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.errors import ConfigError
from specdec.train.loop import (
    Batch,
    batches,
    default_checkpoint_dir,
    fit,
    load_split,
    remove_checkpoint,
)

INFO_FILE = "training.json"


def truncated_target(target, layers: int | None) -> torch.nn.Module:
    """A transformers causal LM with the target's embedding, first `layers` layers (default: a
    quarter, as `early:L`), final norm and LM head, in float32, from the target folder's safetensors
    (no remote code)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdec.runtime.loading import float_weights_folder

    folder = float_weights_folder(target)
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    layers = layers or max(1, config.num_hidden_layers // 4)
    if not 1 <= layers < config.num_hidden_layers:
        raise ConfigError(f"--layers must be between 1 and {config.num_hidden_layers - 1} for {target.name} "
                          f"(it has {config.num_hidden_layers} layers), got {layers}")
    config.num_hidden_layers = layers
    if hasattr(config, "layer_types") and config.layer_types:  # a per-layer list must match the new depth
        config.layer_types = config.layer_types[:layers]
    model = AutoModelForCausalLM.from_config(config).float()
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        for name, tensor in load_file(str(file)).items():
            parts = name.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
                continue
            state[name] = tensor.float()
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - allowed or unexpected:
        raise ConfigError(f"{folder}'s weights do not fit a {layers}-layer copy of its config: missing "
                          f"{sorted(set(missing) - allowed)[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    for param in model.parameters():
        param.requires_grad_(False)
    for param in trainable(model).parameters():
        param.requires_grad_(True)
    return model


def trainable(model) -> torch.nn.ModuleDict:
    """What distillation changes: the decoder layers and the final norm."""
    return torch.nn.ModuleDict({"layers": model.model.layers, "norm": model.model.norm})


class DraftObjective:
    """KL(p_target ‖ q_draft) over the positions whose next token is an answer token."""

    def __init__(self, model, head_weight: torch.Tensor) -> None:
        self.model, self.head_weight = model, head_weight  # head_weight: [V, hidden], the target's, frozen

    def __call__(self, batch: Batch, train: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean KL, greedy hit per position [N] bool, Σ min(p, q) per position [N])."""
        counted = batch.valid[:, 1:] & batch.answer[:, 1:]  # [B, T−1]: x_{t+1} is an answer token
        logits = self.model(input_ids=batch.tokens, attention_mask=batch.valid.long()).logits[:, :-1]  # [B, T−1, V]
        log_q = F.log_softmax(logits[counted].float(), dim=-1)  # [N, V]
        with torch.no_grad():
            log_p = F.log_softmax(batch.features[:, :-1][counted] @ self.head_weight.T, dim=-1)  # [N, V]
        kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean() if len(log_q) else logits.sum() * 0
        with torch.no_grad():
            hits = log_q.argmax(-1) == batch.tokens[:, 1:][counted]  # [N]: the target's own (greedy) token
            overlap = torch.minimum(log_p.exp(), log_q.exp()).sum(-1)  # [N]
        return kl, hits, overlap


def validate(objective: DraftObjective, val_batches: list[Batch]) -> dict:
    kl_sum, hits, overlap, positions = 0.0, 0, 0.0, 0
    for batch in val_batches:
        kl, batch_hits, batch_overlap = objective(batch, train=False)
        kl_sum += float(kl) * len(batch_hits)
        hits += int(batch_hits.sum())
        overlap += float(batch_overlap.sum())
        positions += len(batch_hits)
    n = max(1, positions)
    return {"kl": round(kl_sum / n, 4), "alpha_greedy": round(hits / n, 4), "alpha_t1": round(overlap / n, 4)}


def train_draft(target, data_dir: Path, out_dir: Path, *, layers: int | None = None, epochs: int = 2, lr: float = 2e-4,
                batch_tokens: int = 2048, max_len: int = 384, validation_share: float = 0.05, seed: int = 0,
                checkpoint_every: int = 50, checkpoint_dir: Path | None = None, progress=None, log=print) -> dict:
    """Distil (or resume distilling) a `layers`-layer draft model of `target` on the data in
    `data_dir`; the model folder is written to `out_dir`, checkpoints as in `train_eagle`."""
    out_dir = Path(out_dir)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(out_dir)
    train_seqs, val_seqs = load_split(data_dir, out_dir, validation_share, seed)
    model = truncated_target(target, layers)
    objective = DraftObjective(model, target.net.lm_head_weight().float())
    with torch.no_grad():
        before = validate(objective, batches(val_seqs, batch_tokens, max_len, seed=None))
    log("before training (the target cut to its first layers): " + ", ".join(f"{k} {v}" for k, v in before.items()))
    result = fit(trainable(model), objective, lambda val: validate(objective, val), train_seqs, val_seqs,
                 checkpoint_dir, epochs=epochs, lr=lr, batch_tokens=batch_tokens, max_len=max_len, seed=seed,
                 checkpoint_every=checkpoint_every, progress=progress, log=log)
    info = {"kind": "draft", "target": target.name, "data": str(data_dir), "layers": model.config.num_hidden_layers,
            "sequences": {"train": len(train_seqs), "validation": len(val_seqs)}, "epochs": epochs, "lr": lr,
            "batch_tokens": batch_tokens, "seed": seed, "before": before, **result}
    model.save_pretrained(str(out_dir), safe_serialization=True)
    copy_tokenizer(Path(target.folder), out_dir)
    (out_dir / INFO_FILE).write_text(json.dumps(info, indent=1))
    remove_checkpoint(checkpoint_dir)
    return info


def copy_tokenizer(source: Path, destination: Path) -> None:
    """The target's tokenizer, chat template and generation settings: the draft must read and write
    the same tokens."""
    for file in source.iterdir():
        if file.is_file() and file.suffix != ".safetensors" and file.name not in ("config.json", INFO_FILE):
            shutil.copy2(file, destination / file.name)
