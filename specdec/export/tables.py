"""The tensors each engine reads from an exported folder, pinned from its source at a recorded commit.

A table maps a tensor name to (shape formula, dtype). A shape formula is a tuple of dimensions, each
a product of numbers and symbols: H draft hidden size, Ht target hidden size, I intermediate size,
nh attention heads, nkv KV heads, hd head dim, V target vocabulary, Vd draft vocabulary, K Medusa
heads. `{k}` in a name stands for 0..K-1. FLOAT is the export's float dtype (float32). Shapes are in
torch [out, in] order. The export checks its tensors against the table before writing; the tests
check the written folder against it again.
"""

from __future__ import annotations

import torch

from specdec.errors import SpecdecError

FLOAT = "float"

# SpecForge's save (specforge/modeling/draft/llama3_eagle.py and scripts/train_eagle3.py @ 86c17491):
# no `model.` prefix, `midlayer.` for the layer, q/k/v and gate/up separate, embed_tokens left out.
_SPECFORGE_EAGLE3 = {
    "fc.weight": (("H", "3*Ht"), FLOAT),
    "midlayer.input_layernorm.weight": (("H",), FLOAT),
    "midlayer.hidden_norm.weight": (("H",), FLOAT),
    "midlayer.self_attn.q_proj.weight": (("nh*hd", "2*H"), FLOAT),
    "midlayer.self_attn.k_proj.weight": (("nkv*hd", "2*H"), FLOAT),
    "midlayer.self_attn.v_proj.weight": (("nkv*hd", "2*H"), FLOAT),
    "midlayer.self_attn.o_proj.weight": (("H", "nh*hd"), FLOAT),
    "midlayer.post_attention_layernorm.weight": (("H",), FLOAT),
    "midlayer.mlp.gate_proj.weight": (("I", "H"), FLOAT),
    "midlayer.mlp.up_proj.weight": (("I", "H"), FLOAT),
    "midlayer.mlp.down_proj.weight": (("H", "I"), FLOAT),
    "norm.weight": (("H",), FLOAT),
    "lm_head.weight": (("Vd", "H"), FLOAT),
    "d2t": (("Vd",), torch.int64),  # offsets: target id = draft id + d2t[draft id]
    "t2d": (("V",), torch.bool),  # True at the target ids of the draft vocabulary
}

# vLLM vllm/model_executor/models/llama_eagle3.py @ 00bd1493b3e8, Eagle3LlamaForCausalLM.load_weights:
# `t2d` skipped, `d2t` -> draft_id_to_target_id [Vd] int64 (offsets, added to arange(Vd) in
# compute_logits), `model.` prefixed to all but lm_head*, `midlayer.` -> `layers.0.`, q/k/v stacked
# into qkv_proj [nh*hd + 2 nkv*hd, 2H], gate/up into gate_up_proj; fc ReplicatedLinear(3 Ht -> H, no
# bias); lm_head ParallelLMHead(Vd, H); embed_tokens absent -> the target's is used.
VLLM_EAGLE3 = dict(_SPECFORGE_EAGLE3)

# SGLang python/sglang/srt/models/llama_eagle3.py @ 03d5a7771f60, LlamaForCausalLMEagle3.load_weights:
# names tried as given, then with `model.`; no `layers.0.` rename, so the layer must be `midlayer.*`;
# unknown names are dropped silently; `d2t` -> hot_token_id = d2t + arange(Vd); `t2d` skipped; fc
# nn.Linear(3 Ht, H, bias=config.bias -> False); lm_head ParallelLMHead(Vd, H) (draft_vocab_size set).
SGLANG_EAGLE3 = dict(_SPECFORGE_EAGLE3)

# llama.cpp conversion/llama.py @ 0274f0fc7d7f (convert_hf_to_gguf.py), LlamaModel with is_eagle3
# (detected by `draft_vocab_size` in config.json and num_hidden_layers == 1): `midlayer.*` ->
# model.layers.0.*, fc.weight kept, q/k permuted for its RoPE, hidden_norm -> blk.0.attn_norm_2,
# d2t written as I64 absolute ids (d2t + arange, checked in [0, V) and unique), t2d skipped.
LLAMA_CPP_EAGLE3 = dict(_SPECFORGE_EAGLE3)

# vLLM vllm/model_executor/models/medusa.py @ 01dbb08195ca, Medusa.load_weights: ResidualBlock
# layers nn.Linear(H, H, bias=config.medusa_fc_bias); lm_heads ParallelLMHead(truncated_vocab_size,
# H) per head; token_map [Vt] target ids, used when truncated_vocab_size < vocab_size (logits
# scattered into [V] at token_map).
VLLM_MEDUSA = {
    "blocks.{k}.layers.0.weight": (("H", "H"), FLOAT),
    "blocks.{k}.layers.0.bias": (("H",), FLOAT),  # read with medusa_fc_bias: true
    "lm_heads.{k}.weight": (("Vd", "H"), FLOAT),
    "token_map": (("Vd",), torch.int64),
}

EAGLE3_TABLES = {"vllm": VLLM_EAGLE3, "sglang": SGLANG_EAGLE3, "llama.cpp": LLAMA_CPP_EAGLE3}


def expand(table: dict, dims: dict[str, int]) -> dict[str, tuple[tuple[int, ...], object]]:
    """The table with `{k}` expanded over the K heads and its shapes evaluated: name -> (shape, dtype)."""
    names = {}
    for name, (formula, dtype) in table.items():
        shape = tuple(_dimension(term, dims) for term in formula)
        for one in ([name.format(k=k) for k in range(dims["K"])] if "{k}" in name else [name]):
            names[one] = (shape, dtype)
    return names


def _dimension(term: str, dims: dict[str, int]) -> int:
    size = 1
    for factor in term.split("*"):
        size *= int(factor) if factor.isdigit() else dims[factor]
    return size


def check_tensors(table: dict, tensors: dict[str, torch.Tensor], dims: dict[str, int], float_dtype: torch.dtype,
                  engine: str) -> None:
    """Refuse tensors that do not match the engine's table exactly: names, shapes, dtypes."""
    want = expand(table, dims)
    missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
    if missing or extra:
        raise SpecdecError(f"the export does not match {engine}'s layout: missing {missing or 'nothing'}, "
                           f"unexpected {extra or 'nothing'}")
    for name, (shape, dtype) in want.items():
        dtype = float_dtype if dtype == FLOAT else dtype
        tensor = tensors[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise SpecdecError(f"{name} is {tuple(tensor.shape)} {tensor.dtype}; {engine} reads {shape} {dtype}")
