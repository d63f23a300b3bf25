"""export_head: a head folder read, refused or mapped to the engine's layout, checked, written."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.errors import SpecdecError
from specdec.export import FORMATS, eagle3, folder, gamma, launch, medusa, source, tables
from specdec.heads.eagle3 import default_aux_layers

DTYPE = torch.float32  # engines cast a checkpoint to their serving dtype at load; none requires bf16 on disk
DTYPE_NAME = "float32"


@dataclass
class Exported:
    out: Path
    kind: str
    fmt: str
    gamma: int
    gamma_rule: str
    tensors: int
    notes: list[str] = field(default_factory=list)


def refuse_eagle() -> None:
    raise SpecdecError("an EAGLE-1 head cannot be exported exactly: its fuse layer has a bias and its layer's "
                       "attn_norm normalises the fused input, and no engine's EAGLE model has either (vLLM, "
                       "SGLang and llama.cpp load EAGLE-3 heads: train one with `specdec train eagle3`)")


def export_head(head: str, fmt: str, out: Path, model: str | None = None, gamma_arg: int | None = None,
                force: bool = False) -> Exported:
    if fmt not in FORMATS:
        raise SpecdecError(f"unknown format '{fmt}'; choose one of {', '.join(FORMATS)}")
    head_path, out = source.head_folder(head, model), Path(out).expanduser()
    folder.check(out, force)
    files = source.read_head(head_path)
    if files.kind == "eagle":
        refuse_eagle()
    if files.kind == "medusa" and fmt != "vllm":
        raise SpecdecError(f"Medusa heads export to vLLM only: {fmt} has no Medusa model to load them")
    build = _eagle3 if files.kind == "eagle3" else _medusa
    config, tensors, max_gamma, notes, target = build(files, fmt, model or files.target)
    chosen, rule = gamma.choose_gamma(files.meta, gamma_arg, max_gamma)
    out.mkdir(parents=True, exist_ok=True)
    script = launch.launch_script(fmt, files.kind, out, target, chosen, rule, notes)
    folder.write(out, config, tensors, script)
    return Exported(out, files.kind, fmt, chosen, rule, len(tensors), notes)


def _eagle3(files: source.HeadFiles, fmt: str, model: str):
    config = eagle3.head_config(files.meta["config"])
    target = source.read_target(model)
    source.check_target(config, target)
    eagle3.check_exportable(config, target)
    tensors = eagle3.engine_tensors(files.state, config, DTYPE)
    dims = dict(H=config.hidden_size, Ht=config.target_hidden_size, I=config.intermediate_size, nh=config.num_heads,
                nkv=config.num_kv_heads, hd=config.head_dim, V=config.vocab_size, Vd=config.draft_vocab)
    tables.check_tensors(tables.EAGLE3_TABLES[fmt], tensors, dims, DTYPE, fmt)
    eagle3.check_vocabulary(tensors["d2t"], tensors["t2d"], config.vocab_size)
    notes = []
    default = default_aux_layers(target.config.num_layers)
    if fmt == "llama.cpp" and config.aux_layers != default:
        notes.append(f"this head reads layers {config.aux_layers}, not the default {default}: convert with a "
                     "llama.cpp that reads eagle_aux_hidden_state_layer_ids (PR #25794); older converters "
                     "(conversion/llama.py @ 0274f0fc7d7f) write the default without a word")
    return eagle3.config_json(config, fmt, target, DTYPE_NAME), tensors, gamma.MAX_GAMMA, notes, target


def _medusa(files: source.HeadFiles, fmt: str, model: str):
    from specdec.runtime import load_model

    config = medusa.head_config(files.meta["config"])
    loaded = load_model(model)
    target = source.read_target(model)
    source.check_target(config, target)
    tensors = medusa.engine_tensors(files.state, config, loaded.net.lm_head_weight().float(), DTYPE)
    dims = dict(H=config.hidden_size, V=config.vocab_size, Vd=config.draft_vocab, K=config.num_heads)
    tables.check_tensors(tables.VLLM_MEDUSA, tensors, dims, DTYPE, fmt)
    return medusa.config_json(config, DTYPE_NAME), tensors, config.num_heads, [], target
