"""A GGUF file's Hugging Face folder, made once: its config and tokenizer, and float weights on demand.

`metadata_folder` writes `config.json` (from the file's metadata), `tokenizer.json`,
`tokenizer_config.json` and `chat_template.jinja` (transformers' GGUF tokenizer converter, several
seconds) under the cache directory, keyed by the file's content (`content_key`: its name and a digest
of its bytes), so that a copy of the file, or the same file installed again with a new modification
time, finds the folder made before; later loads read it. The lean runtime runs the file's own
blocks from the GGUF (`gguf_model.py`) and needs only this.

`converted_folder` adds `model.safetensors`, the weights dequantized to float32, for what needs
float weights: training, the transformers runtime and baseline, `--weights float32|bfloat16|int4|int8`.
The folder is then a normal Hugging Face checkpoint, so transformers can load the very same weights.

GGUF stores the Q and K projections of Llama-architecture models permuted for llama.cpp's
interleaved RoPE; `unpermute_qk` restores the Hugging Face "rotate half" layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from specdec.announce import announce
from specdec.cache_dir import cache_root
from specdec.errors import ModelLoadError

CONVERSION_VERSION = 2
DIGESTS = "digests.json"  # under the cache's gguf/: each file version's digest, so that a file is read through once
DIGEST_CHUNK = 1 << 24
ARCH_TO_HF = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
              "phi3": "Phi3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
ROPE_FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight")  # read into the config
RUNS = "Llama 2/3/3.1/3.2, Mistral, Qwen2/2.5, Qwen3, Phi-3, Phi-3.5-mini, Phi-4, Phi-4-mini and Gemma 3 (text)"  # the models those files hold
FLOAT_WEIGHTS = "model.safetensors"


def unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's permutation of a Q or K projection ([out, in] or a bias [out])."""
    shape = weight.shape
    return (
        weight.reshape(num_heads, shape[0] // num_heads // 2, 2, *shape[1:])
        .swapaxes(1, 2)
        .reshape(shape)
    )


def metadata_folder(gguf_path: Path) -> Path:
    """The cached folder with `gguf_path`'s config and tokenizer (no weights), made first if needed."""
    key = content_key(gguf_path)
    folder = cache_root() / "gguf" / key
    if (folder / "config.json").exists():
        return folder
    _remove_earlier_naming(folder.parent, gguf_path)
    folder.parent.mkdir(parents=True, exist_ok=True)
    announce(f"reading the tokenizer of {gguf_path.name} once (a few seconds) into {folder}")
    staging = Path(tempfile.mkdtemp(prefix=key + ".", dir=folder.parent))
    try:
        reader = read_gguf(gguf_path)
        (staging / "config.json").write_text(json.dumps(hf_config(reader, gguf_path), indent=2))
        _convert_tokenizer(gguf_path, staging)
        try:
            staging.rename(folder)
        except OSError:  # another process converted it meanwhile
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def content_key(gguf_path: Path) -> str:
    """The cache folder's name for `gguf_path`: `{stem}-{digest}-v{CONVERSION_VERSION}`, the digest the
    first 16 hex digits of the file's SHA-256. The digest is remembered per path, size and modification
    time (`DIGESTS`), so a file is read through once per version (about a second a gigabyte)."""
    try:
        stat = gguf_path.stat()
    except OSError as err:
        raise ModelLoadError(f"cannot read model file {gguf_path}: {err.strerror}") from None
    memo_path = cache_root() / "gguf" / DIGESTS
    version = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: digests are remade, nothing is lost
        memo = {}
    digest = memo.get(version)
    if digest is None:
        if stat.st_size > 1 << 30:
            announce(f"reading {gguf_path.name} through once to name its cache folder by its content")
        sha = hashlib.sha256()
        with gguf_path.open("rb") as f:
            while chunk := f.read(DIGEST_CHUNK):
                sha.update(chunk)
        memo = {known: d for known, d in memo.items() if _still_there(known)}  # versions gone: forgotten
        digest = memo[version] = sha.hexdigest()[:16]
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        staging = memo_path.with_name(f"{DIGESTS}.{os.getpid()}.partial")
        staging.write_text(json.dumps(memo, indent=0))
        staging.replace(memo_path)  # atomic: a concurrent reader sees the old memo or the new one
    return f"{gguf_path.stem}-{digest}-v{CONVERSION_VERSION}"


def _still_there(version: str) -> bool:
    """Whether the file version a digest was remembered for (`path|size|mtime_ns`) is still on disk."""
    path, size, mtime = version.rsplit("|", 2)
    try:
        stat = os.stat(path)
    except OSError:
        return False
    return f"{stat.st_size}|{stat.st_mtime_ns}" == f"{size}|{mtime}"


def _remove_earlier_naming(folder: Path, gguf_path: Path) -> None:
    """Remove the folders this file's versions were cached in under the earlier naming (name, size and
    modification time): one was made each time the file was installed anew, 0.6 GB each for the default
    model."""
    earlier = re.compile(rf"{re.escape(gguf_path.stem)}-{gguf_path.stat().st_size}-\d+-v\d+")
    stale = [f for f in folder.glob(f"{gguf_path.stem}-*") if f.is_dir() and earlier.fullmatch(f.name)]
    for old in stale:
        shutil.rmtree(old, ignore_errors=True)
    if stale:
        announce(f"removed {len(stale)} cached folder(s) of {gguf_path.name} named by an earlier version of specdec")


def converted_folder(gguf_path: Path) -> Path:
    """The cached Hugging Face folder of `gguf_path` with float32 weights, converting them first if needed."""
    folder = metadata_folder(gguf_path)
    target = folder / FLOAT_WEIGHTS
    if target.exists():
        return folder
    announce(f"writing float32 weights of {gguf_path.name} once (they are needed for float weights, training "
             f"or transformers; about 15 s for a small model) into {folder}")
    staging = folder / (FLOAT_WEIGHTS + f".{os.getpid()}.partial")
    try:
        _convert_weights(read_gguf(gguf_path), gguf_path, staging)
        staging.rename(target)
    finally:
        staging.unlink(missing_ok=True)
    return folder


def read_gguf(gguf_path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(gguf_path))
    except Exception as err:  # the reader raises ValueError, KeyError, struct errors...
        raise ModelLoadError(
            f"{gguf_path} is not a readable GGUF file ({type(err).__name__}: {err}); "
            "re-download or re-install it"
        ) from None


def gguf_field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def refuse_unsupported_types(reader, gguf_path: Path) -> None:
    """One line naming the first tensor whose type the runtime does not run, and what to do."""
    from specdec.runtime.quant import FLOAT_GGUF_TYPES, PACKED_GGUF_TYPES

    supported = [*PACKED_GGUF_TYPES, *FLOAT_GGUF_TYPES]
    for tensor in reader.tensors:
        if tensor.tensor_type.name not in supported:
            raise ModelLoadError(
                f"{gguf_path.name}: tensor {tensor.name} is stored as {tensor.tensor_type.name}, which specdec does not "
                f"run (it runs {', '.join(sorted(supported))}); requantize the file with llama.cpp's llama-quantize "
                "to one of these (Q4_K_M is the usual choice)"
            )


def hf_config(reader, gguf_path: Path) -> dict:
    """A Hugging Face config.json for the GGUF's metadata; other architectures, tensor types and
    incomplete files are refused with one line naming what is wrong."""
    try:
        return _hf_config(reader, gguf_path)
    except KeyError as missing:
        raise ModelLoadError(f"{gguf_path.name} lacks the metadata field {missing}; it is not a complete GGUF "
                             "model file (re-download it, or convert it again with llama.cpp)") from None


def _hf_config(reader, gguf_path: Path) -> dict:
    arch = gguf_field(reader, "general.architecture")
    if arch not in ARCH_TO_HF:
        raise ModelLoadError(
            f"{gguf_path.name} is a '{arch}' model, which specdec's runtime does not run (it runs the "
            f"Llama family: {', '.join(ARCH_TO_HF)} GGUF files: {RUNS})"
        )
    refuse_unsupported_types(reader, gguf_path)
    num_heads = gguf_field(reader, f"{arch}.attention.head_count")
    num_kv_heads = gguf_field(reader, f"{arch}.attention.head_count_kv", num_heads)
    hidden = gguf_field(reader, f"{arch}.embedding_length")
    names = {t.name for t in reader.tensors}
    config = {
        "architectures": [ARCH_TO_HF[arch]],
        "model_type": arch,
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "hidden_size": hidden,
        "intermediate_size": gguf_field(reader, f"{arch}.feed_forward_length"),
        "num_hidden_layers": gguf_field(reader, f"{arch}.block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": gguf_field(reader, f"{arch}.attention.key_length", hidden // num_heads),
        "max_position_embeddings": gguf_field(reader, f"{arch}.context_length", 2048),
        "rms_norm_eps": gguf_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": gguf_field(reader, f"{arch}.rope.freq_base", 10000.0),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf_field(reader, "tokenizer.ggml.eos_token_id"),
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    scaling = gguf_field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": gguf_field(reader, f"{arch}.rope.scaling.factor")}
    elif scaling not in ("none", "longrope"):  # LongRoPE: read from its factor tensors below
        raise ModelLoadError(f"{gguf_path.name} uses RoPE scaling '{scaling}', which specdec's runtime does not "
                             "implement (it runs none, linear, Llama 3.1's rope_freqs and Phi's LongRoPE)")
    if scaling == "longrope" or names & {"rope_factors_short.weight", "rope_factors_long.weight"}:
        config["rope_scaling"] = _longrope(reader, gguf_path, arch, names)
    if arch == "phi3":
        _phi3_fields(reader, config)
    if arch == "gemma3":
        _gemma3_fields(reader, config)
    if "rope_freqs.weight" in names:  # Llama 3.1/3.2: the divisor of each RoPE frequency, stored as a tensor
        config["rope_freq_factors"] = _float_tensor(reader, "rope_freqs.weight")
    return config


def _phi3_fields(reader, config: dict) -> None:
    """Phi-3/Phi-4's own metadata: its sliding window (the runtime runs up to the window, where full
    attention is exact, as for Mistral) and RoPE over part of each head (Phi-4-mini: 96 of 128)."""
    window = gguf_field(reader, "phi3.attention.sliding_window")
    if window:
        config["sliding_window"] = window
    rotary = gguf_field(reader, "phi3.rope.dimension_count", config["head_dim"])
    if rotary != config["head_dim"]:
        config["partial_rotary_factor"] = rotary / config["head_dim"]


GEMMA3_LOCAL_ROPE_BASE, GEMMA3_WINDOW_PATTERN = 10000.0, 6  # what llama.cpp assumes for every gemma3 file
GEMMA3_27B_LAYERS = 62  # the one size whose queries llama.cpp scales by 1/sqrt(hidden / heads), not by the head's


def _gemma3_fields(reader, config: dict) -> None:
    """Gemma 3 as transformers' Gemma3TextConfig names it, with what llama.cpp reads from the file or
    assumes: every sixth layer global, the others windowed with a RoPE base of 10,000; queries scaled
    by the head size (the 27B model: hidden / heads); GELU's tanh form; the output tied when absent."""
    config["model_type"] = "gemma3_text"
    config["hidden_act"] = config["hidden_activation"] = "gelu_pytorch_tanh"
    config["sliding_window"] = gguf_field(reader, "gemma3.attention.sliding_window")
    config["layer_types"] = ["sliding_attention" if (i + 1) % GEMMA3_WINDOW_PATTERN else "full_attention"
                             for i in range(config["num_hidden_layers"])]
    config["rope_local_base_freq"] = GEMMA3_LOCAL_ROPE_BASE
    config["query_pre_attn_scalar"] = (config["hidden_size"] // config["num_attention_heads"]
                                       if config["num_hidden_layers"] == GEMMA3_27B_LAYERS else config["head_dim"])
    config["final_logit_softcapping"] = config["attn_logit_softcapping"] = None


def _longrope(reader, gguf_path: Path, arch: str, names: set[str]) -> dict:
    """LongRoPE (Phi-3-128k, Phi-3.5, Phi-4-mini: rope_factors_short and _long), as a transformers
    config names it: run with its short factors and the attention factor the file stores (1.0 where
    it stores none, as llama.cpp reads it), up to the pretraining context they hold for
    (ModelConfig.max_context)."""
    if "rope_factors_short.weight" not in names:
        stored = ("stores LongRoPE's rope_factors_long" if "rope_factors_long.weight" in names
                  else "names RoPE scaling 'longrope'")
        raise ModelLoadError(f"{gguf_path.name} {stored} without rope_factors_short")
    original = gguf_field(reader, f"{arch}.rope.scaling.original_context_length")
    if not original:
        raise ModelLoadError(f"{gguf_path.name} stores LongRoPE factors without "
                             f"{arch}.rope.scaling.original_context_length (the context they were trained for)")
    short = _float_tensor(reader, "rope_factors_short.weight")
    long = _float_tensor(reader, "rope_factors_long.weight") if "rope_factors_long.weight" in names else short
    # (--runtime transformers on the converted folder was not tried)
    return {"rope_type": "longrope", "short_factor": short, "long_factor": long,
            "original_max_position_embeddings": original,
            "attention_factor": gguf_field(reader, f"{arch}.rope.scaling.attn_factor", 1.0)}


def _float_tensor(reader, name: str) -> list[float]:
    """A small float tensor of the file (RoPE factors) as a list."""
    import gguf

    tensor = next(t for t in reader.tensors if t.name == name)
    return [float(f) for f in gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32).ravel()]


def _convert_weights(reader, gguf_path: Path, out: Path) -> None:
    import gguf
    from safetensors.torch import save_file

    config = hf_config(reader, gguf_path)
    arch, num_heads, num_kv_heads = (gguf_field(reader, "general.architecture"), config["num_attention_heads"],
                                     config["num_key_value_heads"])
    state = {}
    for tensor in reader.tensors:
        if tensor.name in ROPE_FACTOR_TENSORS:
            continue  # in config.json
        try:
            weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        except (NotImplementedError, ValueError) as err:
            raise ModelLoadError(f"cannot dequantize {tensor.name} ({tensor.tensor_type.name}) in {gguf_path}: {err}") from None
        name = _hf_name(tensor.name, gguf_path, arch)
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            weight = unpermute_qk(weight, num_heads if "q_proj" in name else num_kv_heads)
        if arch == "gemma3" and name.endswith("norm.weight"):
            weight = weight - np.float32(1)  # llama.cpp's converter stored 1 + w; transformers' Gemma norms add the 1
        state[name] = torch.from_numpy(np.ascontiguousarray(weight))
    save_file(state, str(out), metadata={"format": "pt"})


_GGUF_TO_HF = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


_PHI3_TO_HF = {**_GGUF_TO_HF, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}  # [q; k; v], [gate; up]
_GEMMA3_TO_HF = {**_GGUF_TO_HF, "post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_ARCH_NAMES = {"phi3": _PHI3_TO_HF, "gemma3": _GEMMA3_TO_HF}


def _hf_name(name: str, gguf_path: Path, arch: str = "llama") -> str:
    parts = name.split(".")
    names = _ARCH_NAMES.get(arch, _GGUF_TO_HF)
    try:
        if parts[0] == "blk":  # blk.{i}.{module}.{weight|bias}
            return f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
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
