"""An EAGLE-3 head in SpecForge's layout, which vLLM, SGLang and llama.cpp's converter read.

Our head fuses q|k|v and gate|up as this runtime runs them; the export splits them by rows, which
loses nothing. The columns of q, k and v stay in our order, [input_layernorm(embedding) ;
hidden_norm(feature)], the order every engine concatenates. Every tensor of the head's state is
mapped or refused by name: nothing is dropped.
"""

from __future__ import annotations

import torch

from specdec.errors import ConfigError, SpecdecError
from specdec.export.source import Target
from specdec.heads.eagle3 import Eagle3Config

# our name -> SpecForge's, for the tensors that keep their values
RENAMED = {
    "fc.weight": "fc.weight",
    "midlayer.input_layernorm.weight": "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight": "midlayer.hidden_norm.weight",
    "midlayer.self_attn.o.weight": "midlayer.self_attn.o_proj.weight",
    "midlayer.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "midlayer.mlp.down.weight": "midlayer.mlp.down_proj.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "d2t": "d2t",
    "t2d": "t2d",
}
AUX_LAYERS = 3  # vLLM's and SGLang's fc read 3 × target_hidden_size; llama.cpp wants exactly 3 extract_layers


def head_config(config: dict) -> Eagle3Config:
    try:
        return Eagle3Config(**config)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"head.json's config is not an EAGLE-3 config: {e}") from e


def check_exportable(config: Eagle3Config, target: Target) -> None:
    """Refuse what no engine could run as this head runs."""
    aux, layers = config.aux_layers, target.config.num_layers
    if len(aux) != AUX_LAYERS or sorted(set(aux)) != aux:
        raise SpecdecError(f"the head reads the target's layers {aux}; vLLM, SGLang and llama.cpp fuse exactly "
                           f"{AUX_LAYERS} distinct layers, ascending (their fc reads 3 × target_hidden_size)")
    if not all(0 <= layer < layers for layer in aux):
        raise ConfigError(f"the head reads the target's layers {aux}, but {target.spec} has {layers} layers")
    if config.target_hidden_size != config.hidden_size:
        raise SpecdecError("the head's hidden size differs from the target's: the engines would need the head's own "
                           "embedding, which it does not store")


def split_qkv(weight: torch.Tensor, config: Eagle3Config) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our fused q|k|v rows [nh hd + 2 nkv hd, 2H] -> q [nh hd, 2H], k [nkv hd, 2H], v [nkv hd, 2H]."""
    q_dim, kv_dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return tuple(part.contiguous() for part in weight.split((q_dim, kv_dim, kv_dim), dim=0))


def engine_tensors(state: dict[str, torch.Tensor], config: Eagle3Config, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Our state dict -> SpecForge's names, float tensors in `dtype`; refuse any tensor without a counterpart."""
    out = {}
    for name, tensor in state.items():
        if name == "midlayer.self_attn.qkv.weight":
            q, k, v = split_qkv(tensor, config)
            out.update({"midlayer.self_attn.q_proj.weight": q, "midlayer.self_attn.k_proj.weight": k,
                        "midlayer.self_attn.v_proj.weight": v})
        elif name == "midlayer.mlp.gate_up.weight":  # [2I, H]: gate rows, then up rows
            gate, up = tensor.chunk(2, dim=0)
            out.update({"midlayer.mlp.gate_proj.weight": gate.contiguous(), "midlayer.mlp.up_proj.weight": up.contiguous()})
        elif name in RENAMED:
            out[RENAMED[name]] = tensor
        else:
            raise SpecdecError(f"the head's tensor {name} {tuple(tensor.shape)} has no counterpart in the engines' "
                               "EAGLE-3 layout; it cannot be exported without changing what the head computes")
    return {name: t.to(dtype) if t.is_floating_point() else t for name, t in out.items()}


def check_vocabulary(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int) -> None:
    """d2t [Vd] int64 offsets and t2d [V] bool must describe one draft vocabulary of ascending target ids."""
    if d2t.dtype != torch.int64 or t2d.dtype != torch.bool or t2d.shape != (vocab_size,):
        raise SpecdecError(f"d2t must be int64 [Vd] and t2d bool [{vocab_size}], got {d2t.dtype} {tuple(d2t.shape)} "
                           f"and {t2d.dtype} {tuple(t2d.shape)}")
    ids = d2t + torch.arange(len(d2t))  # [Vd] target ids
    if not bool((ids[1:] > ids[:-1]).all()):
        raise SpecdecError("d2t + arange(Vd) is not strictly ascending: d2t must hold offsets (target id − draft id)")
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise SpecdecError(f"d2t + arange(Vd) leaves [0, {vocab_size}): d2t must hold offsets (target id − draft id)")
    if int(t2d.sum()) != len(d2t) or not bool(t2d[ids].all()):
        raise SpecdecError("t2d does not mark exactly the target ids d2t + arange(Vd)")


def engine_aux_layers(config: Eagle3Config, fmt: str) -> list[int]:
    """The aux layer ids in the engine's convention. Ours (and vLLM's, llama.cpp's): the layer whose
    input is read; SGLang's: the layer whose output is read (it adds 1 when capturing)."""
    return [layer - 1 for layer in config.aux_layers] if fmt == "sglang" else list(config.aux_layers)


def config_json(config: Eagle3Config, fmt: str, target: Target, dtype: str) -> dict:
    """A LlamaConfig-style config.json as SpecForge writes it, with the aux layers where `fmt` reads them
    (vLLM and SGLang: eagle_config.eagle_aux_hidden_state_layer_ids; llama.cpp's converter and some vLLM
    versions: the top level; both written). `dtype`: the dtype the tensors are stored in."""
    out = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
        "max_position_embeddings": target.config.max_position_embeddings, "hidden_act": "silu",
        "vocab_size": config.vocab_size, "draft_vocab_size": config.draft_vocab,
        "target_hidden_size": config.target_hidden_size, "tie_word_embeddings": False, "attention_bias": False,
        "mlp_bias": False, "norm_before_residual": False, "torch_dtype": dtype,
    }
    ids = engine_aux_layers(config, fmt)
    out["eagle_aux_hidden_state_layer_ids"] = ids  # top level: llama.cpp's converter, and vLLM in some versions
    if fmt != "llama.cpp":
        out["eagle_config"] = {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": ids}
    return out
