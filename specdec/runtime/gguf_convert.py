"""Turn a GGUF file into a cached Hugging Face model folder, once.

Dequantizing the weights (gguf's numpy kernels) and converting the tokenizer (transformers' GGUF
converter) take several seconds each, so the first load writes a folder — `config.json`,
`model.safetensors` (float32), `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` — under
the cache directory, keyed by the file's size and modification time; later loads read that folder.
The folder is a normal Hugging Face checkpoint, so transformers can load the very same weights (the
tests and the benchmark baseline do).

GGUF stores the Q and K projections of Llama-architecture models permuted for llama.cpp's
interleaved RoPE; `unpermute_qk` restores the Hugging Face "rotate half" layout.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from specdec.announce import announce
from specdec.errors import ModelLoadError

CONVERSION_VERSION = 1
ARCH_TO_HF = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def cache_root() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE_DIR") or Path.home() / ".cache" / "specdec")


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's permutation of a Q or K projection ([out, in] or a bias [out])."""
    shape = weight.shape
    return (
        weight.reshape(num_heads, shape[0] // num_heads // 2, 2, *shape[1:])
        .swapaxes(1, 2)
        .reshape(shape)
    )


def converted_folder(gguf_path: Path) -> Path:
    """Return the cached HF folder for `gguf_path`, converting it first if needed."""
    try:
        stat = gguf_path.stat()
    except OSError as err:
        raise ModelLoadError(f"cannot read model file {gguf_path}: {err.strerror}") from None
    key = f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}-v{CONVERSION_VERSION}"
    folder = cache_root() / "gguf" / key
    if (folder / "model.safetensors").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    announce(f"converting {gguf_path.name} once for this runtime (about 15 s for a small model) into {folder}")
    staging = Path(tempfile.mkdtemp(prefix=key + ".", dir=folder.parent))
    try:
        _convert(gguf_path, staging)
        try:
            staging.rename(folder)
        except OSError:  # another process converted it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def _read(gguf_path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(gguf_path))
    except Exception as err:  # the reader raises ValueError, KeyError, struct errors...
        raise ModelLoadError(
            f"{gguf_path} is not a readable GGUF file ({type(err).__name__}: {err}); "
            "re-download or re-install it"
        ) from None


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _convert(gguf_path: Path, out: Path) -> None:
    import gguf
    from safetensors.torch import save_file

    reader = _read(gguf_path)
    arch = _field(reader, "general.architecture")
    if arch not in ARCH_TO_HF:
        raise ModelLoadError(
            f"GGUF architecture '{arch}' is not supported (supported: {', '.join(ARCH_TO_HF)})"
        )
    num_heads = _field(reader, f"{arch}.attention.head_count")
    num_kv_heads = _field(reader, f"{arch}.attention.head_count_kv", num_heads)
    hidden = _field(reader, f"{arch}.embedding_length")
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    config = {
        "architectures": [ARCH_TO_HF[arch]],
        "model_type": arch,
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": hidden,
        "intermediate_size": _field(reader, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _field(reader, f"{arch}.block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden // num_heads,
        "max_position_embeddings": _field(reader, f"{arch}.context_length", 2048),
        "rms_norm_eps": _field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": _field(reader, f"{arch}.rope.freq_base", 10000.0),
        "tie_word_embeddings": tied,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if "rope_freqs.weight" in names:
        raise ModelLoadError(
            f"{gguf_path.name} stores Llama-3.1 RoPE scaling factors (rope_freqs), which the GGUF "
            "reader does not convert yet; load the model's Hugging Face folder instead"
        )
    state = {}
    for tensor in reader.tensors:
        try:
            weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        except (NotImplementedError, ValueError) as err:
            raise ModelLoadError(f"cannot dequantize {tensor.name} ({tensor.tensor_type.name}) in {gguf_path}: {err}") from None
        name = _hf_name(tensor.name, gguf_path)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            weight = unpermute_qk(weight, num_heads if "q_proj" in name else num_kv_heads)
        state[name] = torch.from_numpy(np.ascontiguousarray(weight))
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _convert_tokenizer(gguf_path, out)


_GGUF_TO_HF = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _hf_name(name: str, gguf_path: Path) -> str:
    parts = name.split(".")
    try:
        if parts[0] == "blk":  # blk.{i}.{module}.{weight|bias}
            return f"model.layers.{parts[1]}.{_GGUF_TO_HF[parts[2]]}.{parts[3]}"
        return f"{_GGUF_TO_HF[parts[0]]}.{parts[1]}"
    except (KeyError, IndexError):
        raise ModelLoadError(f"{gguf_path.name} has a tensor this runtime does not know: {name}") from None


def _convert_tokenizer(gguf_path: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as err:
        raise ModelLoadError(f"cannot convert the tokenizer stored in {gguf_path}: {err}") from None
    tokenizer.save_pretrained(str(out))
