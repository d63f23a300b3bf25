"""The default model's dear twins: its GGUF with the MLPs widened by zero blocks to a larger model's
pass cost, so that speculation can be measured with real acceptance where the pass is dear.

Widening an MLP from width m to W appends W − m zero rows to `ffn_gate` and `ffn_up` and W − m zero
inputs (zero blocks) to every row of `ffn_down`, in the types the file stores. A block of zero bytes
is zero in every GGUF type (its scales are zero), so the added gate and up outputs are exactly 0,
SiLU(0)·0 = 0, and the added inputs of the down projection add exact zeros to its sums: every logit
is the narrow model's, bit for bit (tests/test_twin.py checks it, and that one non-zero added block
changes them). A pass reads the added blocks all the same, so it costs what a model of that many
bytes costs.

What a twin stands for: the larger model's weight bytes per pass (its layers and output head, the
dominant cost of decoding on a CPU), with the default model's tokens and acceptance. What it does
not: a larger model's attention (the twin keeps 30 layers of 9 heads of 64; attention at long
contexts costs a real 8B model far more), its arithmetic per byte beyond the MLP, and a larger
model's acceptance (a real 8B model agrees more with a lookup or a head trained on it than the
135M model does), so the gains measured on a twin are a floor for what the real model would gain.

The width matched to a model: `pass_bytes` of its shape as llama.cpp's quantizer types it (the
output head at its real vocabulary: Llama 3's 128,256 tokens, not the tokenizer the synthetic
files borrow), against the twin's layers and head at the types it stores; rounded up to a multiple
of 256 (a K-quant block), so that llama.cpp's quantizer can turn the twin into a K-quant file.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from specdec.errors import ConfigError
from specdec.runtime.gguf_synthetic import SHAPES, Shape, tensor_type

LLAMA3_VOCAB = 128256  # the output head a Llama 3 pass reads
TWINS = {"1b": "llama-3.2-1b", "3b": "llama-3.2-3b", "8b": "llama-3.1-8b"}  # twin name: the shape it costs like
WIDTH_STEP = 256  # a K-quant block: the twin's MLP width is a multiple of it
MLP_PARTS = ("ffn_gate", "ffn_up", "ffn_down")


def bytes_per_weight(type_name: str) -> float:
    """Bytes one weight of GGUF type `type_name` takes, its share of a block's scales included."""
    import gguf

    block_inputs, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return block_bytes / block_inputs


def mlp_part(name: str) -> str | None:
    """ffn_gate, ffn_up or ffn_down for a layer's MLP tensor `name` (blk.N.ffn_up.weight), else None."""
    part = name.split(".")[-2] if name.startswith("blk.") else None
    return part if part in MLP_PARTS else None


def pass_bytes(shape: Shape, file_type: str = "Q4_K_M", vocab: int = LLAMA3_VOCAB) -> int:
    """Weight bytes one pass of `shape` reads, typed as llama.cpp's quantizer types `file_type`: every
    layer's linears and the output head (the token embedding's one row a token is left out)."""
    head_dim = shape.hidden // shape.heads
    linears = {"attn_q": shape.heads * head_dim * shape.hidden, "attn_k": shape.kv_heads * head_dim * shape.hidden,
               "attn_v": shape.kv_heads * head_dim * shape.hidden, "attn_output": shape.hidden * shape.heads * head_dim,
               "ffn_gate": shape.mlp * shape.hidden, "ffn_up": shape.mlp * shape.hidden,
               "ffn_down": shape.hidden * shape.mlp}
    total = sum(count * bytes_per_weight(tensor_type(file_type, kind, layer, shape.layers))
                for layer in range(shape.layers) for kind, count in linears.items())
    head = tensor_type(file_type, "token_embd_tied" if shape.tied else "output", 0, shape.layers)
    return round(total + vocab * shape.hidden * bytes_per_weight(head))


def _tensor_types(reader) -> dict[str, str]:
    return {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}


def _mlp_of(reader) -> tuple[str, int, int]:
    """(architecture, MLP width, layers) of a GGUF that a twin can be made of."""
    fields = reader.fields
    arch = fields["general.architecture"].contents() if "general.architecture" in fields else None
    names = set(_tensor_types(reader))
    if arch != "llama" or f"{arch}.feed_forward_length" not in fields or "blk.0.ffn_gate.weight" not in names:
        raise ConfigError(f"a twin is made of a Llama-family GGUF with gated MLPs (ffn_gate, ffn_up, ffn_down); "
                          f"this file's architecture is {arch}")
    return arch, int(fields[f"{arch}.feed_forward_length"].contents()), int(fields[f"{arch}.block_count"].contents())


def file_pass_bytes(reader, mlp: int | None = None) -> int:
    """Weight bytes one pass of a GGUF reads (its layers' tensors and output head), its MLPs at width
    `mlp` if given (the twin's)."""
    _, width, _ = _mlp_of(reader)
    types = _tensor_types(reader)
    total = 0.0
    for tensor in reader.tensors:
        scale = (mlp or width) / width if mlp_part(tensor.name) else 1.0
        if tensor.name.startswith("blk.") or tensor.name == "output.weight":
            total += int(tensor.n_bytes) * scale
    if "output.weight" not in types:  # tied: the token embedding is the head
        total += int(next(t.n_bytes for t in reader.tensors if t.name == "token_embd.weight"))
    return round(total)


def width_for(reader, target_bytes: int) -> int:
    """The smallest MLP width, a multiple of WIDTH_STEP, at which a pass of the file reads at least
    `target_bytes`."""
    _, width, _ = _mlp_of(reader)
    now = file_pass_bytes(reader)
    per_unit = (file_pass_bytes(reader, mlp=2 * width) - now) / width  # the MLP bytes a pass reads per unit of width
    if target_bytes <= now:
        raise ConfigError(f"a pass of this file reads {now / 1e6:.0f} MB already, more than the "
                          f"{target_bytes / 1e6:.0f} MB asked for")
    wider = width + (target_bytes - now) / per_unit
    return int(math.ceil(wider / WIDTH_STEP) * WIDTH_STEP)


def twin_width(reader, twin: str) -> int:
    """The MLP width at which the file's passes cost what twin `twin` (1b, 3b, 8b) stands for."""
    if twin not in TWINS:
        raise ConfigError(f"unknown twin '{twin}'; choose one of {', '.join(TWINS)}")
    return width_for(reader, pass_bytes(SHAPES[TWINS[twin]]))


def _widened_shape(shape: tuple[int, ...], part: str | None, width: int, mlp: int) -> tuple[int, ...]:
    """The [rows, units] (bytes of blocks, or float values) of a tensor whose MLP is widened from
    `width` to `mlp`: gate and up get rows, down gets inputs (units in proportion); others stay."""
    if part in ("ffn_gate", "ffn_up"):
        return (mlp, shape[1])
    if part == "ffn_down":
        return (shape[0], shape[1] * mlp // width)
    return tuple(shape)


def _widened(data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`data` with zeros appended up to `shape` (rows, or units of every row)."""
    if data.shape == shape:
        return data
    out = np.zeros(shape, dtype=data.dtype)
    out[:data.shape[0], :data.shape[1]] = data
    return out


def write_twin(path: Path, source: Path, mlp: int, progress=None) -> Path:
    """Write `source`'s GGUF with every MLP widened to `mlp` by zero blocks (module docstring).
    `progress(bytes done, bytes in all)` is told as tensors are written."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch, width, _ = _mlp_of(reader)
    if mlp <= width or mlp % WIDTH_STEP:
        raise ConfigError(f"a twin's MLP width must be a multiple of {WIDTH_STEP} above the file's {width}; got {mlp}")
    writer = gguf.GGUFWriter(str(path), arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue  # the writer's own
        value = field.contents()
        if field.name == f"{arch}.feed_forward_length":
            value = mlp
        elif field.name == "general.name":
            value = f"{value} (dear twin, MLP {mlp})"
        kind = field.types[0]
        writer.add_key_value(field.name, value, kind,
                             sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)

    shapes = {tensor.name: _widened_shape(tensor.data.shape, mlp_part(tensor.name), width, mlp)
              for tensor in reader.tensors}
    sizes = {tensor.name: int(np.prod(shapes[tensor.name])) * tensor.data.dtype.itemsize for tensor in reader.tensors}
    for tensor in reader.tensors:
        writer.add_tensor_info(tensor.name, shapes[tensor.name], tensor.data.dtype, sizes[tensor.name],
                               raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    done, total = 0, sum(sizes.values())
    for tensor in reader.tensors:
        data = _widened(tensor.data, shapes[tensor.name])
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
        done += data.nbytes
        if progress is not None:
            progress(done, total)
    writer.close()
    return path
