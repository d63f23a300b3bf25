"""A GGUF file run as it is stored: every linear layer in its own quantized type, no float copy.

`load_gguf` builds the lean model from the file's metadata (via `gguf_convert.hf_config`) and fills
it tensor by tensor: each linear layer's blocks are read from the file (one tensor at a time, so the
memory held is the packed weights plus one tensor) and packed by the compiled `pack_gguf` into the
kernels' layout for its type (`quant.FORMATS`), exactly: the weights the layer multiplies by are
the file's, as `gguf.quants.dequantize` computes them. Fused layers (q/k/v, gate/up) whose parts
have different types take the layout that holds them all exactly (Q4_K beside Q6_K: Q6_K's), or
float32 where none does. The token table stays quantized (`QuantizedEmbedding`: rows dequantized as
they are gathered; a tied LM head shares it). Norms, biases and `rope_freqs` are small float tensors.

Types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K run in their kernels; F32, F16
and BF16 linears run as float32 (exact). Any other type is refused with one line naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from specdec.errors import ModelLoadError
from specdec.runtime.config import ModelConfig
from specdec.runtime.gguf_convert import hf_config, read_gguf, unpermute_qk
from specdec.runtime.llama import LlamaModel, rope_inverse_frequencies
from specdec.runtime.packed_linear import pack_linears
from specdec.runtime.quant import (
    FLOAT_GGUF_TYPES,
    QuantizedEmbedding,
    QuantizedLinear,
    gguf_format,
    pack_gguf_tensors,
)
from specdec.runtime.weight_formats import LAYER_SOURCES, WeightReport

SUPPORTED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", *FLOAT_GGUF_TYPES)


class GgufTensors:
    """The tensors of a GGUF file by name, each read from the file only when asked for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader = read_gguf(path)
        self.by_name = {t.name: t for t in self.reader.tensors}
        for tensor in self.reader.tensors:
            if tensor.tensor_type.name not in SUPPORTED_TYPES:
                raise ModelLoadError(
                    f"{path.name}: tensor {tensor.name} is stored as {tensor.tensor_type.name}, which specdec does not "
                    f"run (it runs {', '.join(SUPPORTED_TYPES)}); requantize the file with llama.cpp's llama-quantize "
                    "to one of these (Q4_K_M is the usual choice)"
                )

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
    """The lean model of the GGUF at `path` (folder: its metadata folder), linears as stored."""
    tensors = GgufTensors(path)
    hf = hf_config(tensors.reader, path)
    config = ModelConfig.from_hf(hf)
    with torch.device("meta"):
        model = LlamaModel(config)
    report = WeightReport()
    rows_order = _row_orders(config, hf["model_type"])

    def need(name: str) -> str:
        if name not in tensors.by_name:
            raise ModelLoadError(f"{path.name} lacks the tensor {name}; it is not a complete {hf['model_type']} model")
        return name

    def vector(name: str, permute_as: str | None = None) -> nn.Parameter:
        values = tensors.floats(need(name)).reshape(-1)
        if permute_as is not None and permute_as in rows_order:
            values = values[rows_order[permute_as](values.shape[0])]
        return nn.Parameter(values.contiguous(), requires_grad=False)

    def order(name: str) -> torch.Tensor | None:  # [rows] stored row of each output row, or None
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        return rows_order[kind](tensors.rows(name)) if kind in rows_order else None

    def packed(names: tuple[str, ...]) -> tuple[torch.Tensor, str, str] | None:
        """(packed weights, layout, how) of tensors stacked along their outputs; None: no layout holds them."""
        types = [tensors.type_of(need(n)) for n in names]
        layout = gguf_format(types)
        if layout is None:
            return None
        weights = pack_gguf_tensors([tensors.raw(n) for n in names], types, [order(n) for n in names], layout)
        return weights, layout, "as stored" if set(types) == {layout} else f"{'+'.join(sorted(set(types)))} in {layout}'s layout"

    def linear(names: tuple[str, ...], bias: torch.Tensor | None = None) -> nn.Module:
        found = packed(names)
        if found is not None:
            weights, layout, how = found
            report.add(layout, how)
            return QuantizedLinear.from_packed(weights, layout, bias)
        parts = [tensors.floats(n) if order(n) is None else tensors.floats(n)[order(n)] for n in names]
        report.add("float32", f"dequantized from {'+'.join(sorted({tensors.type_of(n) for n in names}))}")
        weight = torch.cat(parts)  # [out, in]
        layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        layer.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            layer.bias = nn.Parameter(bias, requires_grad=False)
        return layer

    for i, layer in enumerate(model.layers):
        blk = f"blk.{i}."
        layer.attn_norm.weight = vector(blk + "attn_norm.weight")
        layer.mlp_norm.weight = vector(blk + "ffn_norm.weight")
        bias = None
        if config.attention_bias:
            bias = torch.cat([vector(blk + f"attn_{p}.bias", f"attn_{p}").data for p in "qkv"])
        for path_in_layer, sources in LAYER_SOURCES.items():
            block, attr = path_in_layer.split(".")
            part_bias = bias if attr == "qkv" else None
            setattr(getattr(layer, block), attr, linear(tuple(f"{blk}{s}.weight" for s in sources), part_bias))
    model.norm.weight = vector("output_norm.weight")
    head_source = "token_embd.weight" if config.tie_word_embeddings else "output.weight"
    model.lm_head = linear((head_source,))
    if config.tie_word_embeddings and isinstance(model.lm_head, QuantizedLinear):
        model.embed = QuantizedEmbedding(model.lm_head.packed)  # one table for both
    elif (table := packed((need("token_embd.weight"),))) is not None:
        model.embed = QuantizedEmbedding(table[0])
    else:
        model.embed = nn.Embedding.from_pretrained(tensors.floats("token_embd.weight"), freeze=True)
    model.inv_freq = rope_inverse_frequencies(config)
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
