"""A GGUF file run as it is stored: every linear layer in its own quantized type, no float copy.

`load_gguf` builds the lean model from the file's metadata (the config.json that
`gguf_convert.metadata_folder` wrote from it). The first load fills it tensor by tensor
(`pack_weights`): each linear layer's blocks are read from the file (one tensor at a time, so the
memory held is the packed weights plus one tensor) and packed by the compiled `pack_gguf` into the
kernels' layout for its type (`quant.PACKED_GGUF_TYPES`), and the result is kept beside the metadata
(`packed_file`, about the GGUF's size, in its own subfolder); later loads memory-map it and start at once. Exactly: the weights the layer multiplies by are
the file's, as `gguf.quants.dequantize` computes them. Fused layers (q/k/v, gate/up) whose tensors
have different types keep a part per type (`quant.gguf_parts`: a Q4_K q and k beside a Q6_K v are
two parts of one layer), or run as float32 where a tensor is a float type; Phi-3 files store q/k/v
and gate/up fused already (`PHI3_SOURCES`), in the runtime's order. The token table stays quantized (`QuantizedEmbedding`: rows dequantized as
they are gathered; a tied LM head shares it). Norms, biases and `rope_freqs` are small float tensors.

Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K run in their kernels; F32, F16
and BF16 linears run as float32 (exact). Any other type is refused with one line naming it.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from specdec.announce import announce
from specdec.errors import ModelLoadError
from specdec.runtime.config import ModelConfig
from specdec.runtime.gguf_convert import read_gguf, refuse_unsupported_types, unpermute_qk
from specdec.runtime.llama import LlamaModel
from specdec.runtime.packed_linear import pack_linears
from specdec.runtime.quant import (
    QuantizedEmbedding,
    QuantizedLinear,
    gguf_parts,
    pack_gguf_tensors,
)
from specdec.runtime.weight_formats import LAYER_SOURCES, WeightReport
from specdec.terminal import plural

LAYOUT_SOURCES = ("quant_formats.h", "gguf_pack.cpp")  # what the packed layouts depend on
PHI3_SOURCES = {**LAYER_SOURCES, "attn.qkv": ("attn_qkv",), "mlp.gate_up": ("ffn_up",)}  # Phi-3 stores
# them fused, [q; k; v] and [gate; up]: the runtime's own fused layers, row for row
PLAN_VERSION = b"parts-1"  # the form of the packed file's plan (below), part of its name


class GgufTensors:
    """The tensors of a GGUF file by name, each read from the file only when asked for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader = read_gguf(path)
        self.by_name = {t.name: t for t in self.reader.tensors}
        refuse_unsupported_types(self.reader, path)

    def type_of(self, name: str) -> str:
        return self.by_name[name].tensor_type.name

    def rows(self, name: str) -> int:
        return int(self.by_name[name].shape[-1])  # GGUF lists the fastest dimension first

    def raw(self, name: str) -> torch.Tensor:
        """[rows, bytes per row] uint8: the tensor's blocks as stored, read into memory of its own."""
        tensor = self.by_name[name]
        count = int(tensor.n_bytes)
        data = np.fromfile(self.path, dtype=np.uint8, count=count, offset=int(tensor.data_offset))
        if data.size != count:
            raise ModelLoadError(f"{self.path.name} ends inside tensor {name}; the file is truncated")
        return torch.from_numpy(data.reshape(self.rows(name), -1))

    def floats(self, name: str) -> torch.Tensor:
        """A tensor dequantized to float32 (norms, biases, float linears), in the stored row order."""
        import gguf

        tensor = self.by_name[name]
        raw = self.raw(name).numpy()
        return torch.from_numpy(gguf.quants.dequantize(raw, tensor.tensor_type).astype(np.float32))


def load_gguf(path: Path, folder: Path) -> LlamaModel:
    """The lean model of the GGUF at `path` (folder: its metadata folder), linears as stored. The
    first load packs the file's blocks and keeps them in the folder (`packed_file`); later loads map
    that file, so the pages are read as the passes need them, as llama.cpp maps the GGUF."""
    config = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    cache = packed_file(folder)
    if cache.exists():
        state, plan = _read_packed(cache)
    else:
        announce(f"packing the weights of {path.name} once for the kernels (seconds per GB) into {cache}")
        state, plan = pack_weights(path, config)
        _write_packed(cache, state, plan)
    return _assemble(config, state, plan)


def packed_file(folder: Path) -> Path:
    """Where a GGUF's packed weights are kept: named by the layouts' sources, so that a change to a
    layout or a decoder packs again."""
    kernels = Path(__file__).with_name("kernels")
    sources = b"".join((kernels / name).read_bytes() for name in LAYOUT_SOURCES)
    digest = hashlib.sha256(PLAN_VERSION + sources).hexdigest()[:12]
    return folder / "packed" / f"{digest}.safetensors"  # a folder of its own: not a checkpoint's shard


def pack_weights(path: Path, config: ModelConfig) -> tuple[dict[str, torch.Tensor], dict[str, list[str]]]:
    """Every tensor the network needs, read from the GGUF: (state: module path -> tensor, plan:
    linear -> [its parts' layouts joined by "+", or "float32"; how]). A quantized linear's parts are
    `<path>.packed.<i>` (each in its layout's format), a float one is `<path>.weight`; "embed" in the
    plan names what the token table is."""
    tensors = GgufTensors(path)
    arch = tensors.reader.fields["general.architecture"].contents()
    rows_order = _row_orders(config, arch)
    state: dict[str, torch.Tensor] = {}
    plan: dict[str, list[str]] = {}

    def need(name: str) -> str:
        if name not in tensors.by_name:
            raise ModelLoadError(f"{path.name} lacks the tensor {name}; it is not a complete {arch} model")
        return name

    def order(name: str) -> torch.Tensor | None:  # [rows] stored row of each output row, or None
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        return rows_order[kind](tensors.rows(name)) if kind in rows_order else None

    def floats(name: str) -> torch.Tensor:  # rows in the runtime's order
        values = tensors.floats(need(name))
        rows = order(name)
        return values if rows is None else values[rows]

    def linear(module: str, names: tuple[str, ...]) -> None:
        types = [tensors.type_of(need(n)) for n in names]
        parts = gguf_parts(types)
        if parts is not None:
            first = 0
            for i, (layout, count) in enumerate(parts):
                part = names[first:first + count]
                state[f"{module}.packed.{i}"] = pack_gguf_tensors([tensors.raw(n) for n in part], [layout] * count,
                                                                  [order(n) for n in part])
                first += count
            plan[module] = ["+".join(layout for layout, _ in parts), "as stored"]
        else:
            state[module + ".weight"] = torch.cat([floats(n) for n in names])  # [out, in]
            plan[module] = ["float32", f"dequantized from {'+'.join(sorted(set(types)))}"]

    for i in range(config.num_layers):
        blk, at = f"blk.{i}.", f"layers.{i}."
        state[at + "attn_norm.weight"] = floats(blk + "attn_norm.weight").reshape(-1)
        state[at + "mlp_norm.weight"] = floats(blk + "ffn_norm.weight").reshape(-1)
        if config.post_norms:  # Gemma: the norms of each branch's output
            state[at + "post_attn_norm.weight"] = floats(blk + "post_attention_norm.weight").reshape(-1)
            state[at + "post_mlp_norm.weight"] = floats(blk + "post_ffw_norm.weight").reshape(-1)
        if config.attention_bias:
            state[at + "attn.qkv.bias"] = torch.cat([floats(f"{blk}attn_{p}.bias").reshape(-1) for p in "qkv"])
        if config.qk_norm:
            for p in "qk":
                state[f"{at}attn.{p}_norm.weight"] = floats(f"{blk}attn_{p}_norm.weight").reshape(-1)
        for module, sources in (PHI3_SOURCES if arch == "phi3" else LAYER_SOURCES).items():
            linear(at + module, tuple(f"{blk}{s}.weight" for s in sources))
    state["norm.weight"] = floats("output_norm.weight").reshape(-1)
    linear("lm_head", ("token_embd.weight" if config.tie_word_embeddings else "output.weight",))
    if config.tie_word_embeddings and "lm_head.packed.0" in state:
        plan["embed"] = ["lm_head"]  # one table for both
    elif gguf_parts([tensors.type_of(need("token_embd.weight"))]) is not None:
        linear("embed", ("token_embd.weight",))
    else:
        state["embed.weight"] = floats("token_embd.weight")
        plan["embed"] = ["float32"]
    return state, plan


def _write_packed(cache: Path, state: dict[str, torch.Tensor], plan: dict[str, list[str]]) -> None:
    """Keep the packed weights beside the metadata (atomically); a failed write only costs packing again.
    Packed files of earlier layouts of the same GGUF (another version of the kernels) are removed, said."""
    from safetensors.torch import save_file

    staging = cache.with_name(cache.name + f".{os.getpid()}.partial")
    try:
        cache.parent.mkdir(exist_ok=True)
        save_file({k: v.contiguous() for k, v in state.items()}, str(staging), metadata={"plan": json.dumps(plan)})
        staging.rename(cache)
        stale = [f for f in cache.parent.glob("*.safetensors") if f != cache]
        if stale:
            size = sum(f.stat().st_size for f in stale)
            for f in stale:
                f.unlink(missing_ok=True)
            announce(f"removed {plural(len(stale), 'packed file')} of an earlier layout "
                     f"({size / 1e9:.1f} GB) from {cache.parent}")
    except OSError as err:
        warnings.warn(f"specdec: could not keep the packed weights in {cache} ({err}); the next load packs again",
                      RuntimeWarning, stacklevel=3)
    finally:
        staging.unlink(missing_ok=True)


def _read_packed(cache: Path) -> tuple[dict[str, torch.Tensor], dict[str, list[str]]]:
    """The packed weights, memory-mapped (pages are read when a pass first needs them)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(cache), framework="pt") as f:
            plan = json.loads(f.metadata()["plan"])
            return {key: f.get_tensor(key) for key in f.keys()}, plan
    except (SafetensorError, OSError, KeyError, ValueError) as err:
        raise ModelLoadError(f"{cache} is damaged ({err}); delete it and load again to pack the file anew") from None


def _assemble(config: ModelConfig, state: dict[str, torch.Tensor], plan: dict[str, list[str]]) -> LlamaModel:
    """The network from the packed state: quantized and float linears as the plan says."""
    model = LlamaModel.on_meta(config)
    report = WeightReport()

    def linear(module: str) -> nn.Module:
        layout, how = plan[module]
        bias = state.get(module + ".bias")
        report.add(layout, how)
        if layout != "float32":
            layouts = layout.split("+")
            return QuantizedLinear.from_packed([state[f"{module}.packed.{i}"] for i in range(len(layouts))], layouts, bias)
        weight = state[module + ".weight"]  # [out, in]
        layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="cpu")
        layer.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            layer.bias = nn.Parameter(bias, requires_grad=False)
        return layer

    def vector(name: str) -> nn.Parameter:
        return nn.Parameter(state[name], requires_grad=False)

    for i, layer in enumerate(model.layers):
        at = f"layers.{i}."
        layer.attn_norm.weight = vector(at + "attn_norm.weight")
        layer.mlp_norm.weight = vector(at + "mlp_norm.weight")
        if config.post_norms:
            layer.post_attn_norm.weight = vector(at + "post_attn_norm.weight")
            layer.post_mlp_norm.weight = vector(at + "post_mlp_norm.weight")
        if config.qk_norm:
            layer.attn.q_norm.weight = vector(at + "attn.q_norm.weight")
            layer.attn.k_norm.weight = vector(at + "attn.k_norm.weight")
        for module in LAYER_SOURCES:
            block, attr = module.split(".")
            setattr(getattr(layer, block), attr, linear(at + module))
    model.norm.weight = vector("norm.weight")
    model.lm_head = linear("lm_head")
    embed = plan["embed"][0]
    if embed == "lm_head":
        model.embed = QuantizedEmbedding(state["lm_head.packed.0"])
    elif embed == "float32":
        model.embed = nn.Embedding.from_pretrained(state["embed.weight"], freeze=True)
    else:
        model.embed = QuantizedEmbedding(state["embed.packed.0"])
    model.weight_report = report
    pack_linears(model)  # float32 layers only (packed_linear.py)
    return model.eval()


def _row_orders(config: ModelConfig, arch: str) -> dict:
    """GGUF tensor kind -> (rows -> the stored row of each output row): Llama files store Q and K
    permuted for llama.cpp's RoPE layout; the runtime's is the Hugging Face one."""
    if arch != "llama":
        return {}
    heads = {"attn_q": config.num_heads, "attn_k": config.num_kv_heads}
    return {kind: (lambda rows, h=h: torch.from_numpy(unpermute_qk(np.arange(rows), h).copy())) for kind, h in heads.items()}
