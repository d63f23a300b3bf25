"""GGUF files with the shapes of real models and random weights, for benchmarks and tests.

Speed and memory do not depend on the weights' values, so a file with Llama-3.2-1B's shapes and
random blocks measures what the real file would. Random bytes are valid blocks of every GGUF type
once their float16 scale fields hold sane values (`random_blocks` sets them), so any type is written
directly with the `gguf` package, without a quantizer. `MIXES` gives each tensor the type llama.cpp's
quantizer gives it for a file type (Q4_K_M puts Q6_K in the output and in half the layers' V and
down projections).

The tokenizer is the default model's (SmolLM2's 49,152 tokens, copied from its GGUF), so every
file runs through the same tokenizer and chat template; `vocab` defaults to that size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

# bytes per block, inputs per block and the offsets of the float16 scale fields, per GGUF type
BLOCKS = {
    "Q4_0": (18, 32, (0,)), "Q4_1": (20, 32, (0, 2)), "Q5_0": (22, 32, (0,)), "Q5_1": (24, 32, (0, 2)),
    "Q8_0": (34, 32, (0,)), "Q2_K": (84, 256, (80, 82)), "Q3_K": (110, 256, (108,)),
    "Q4_K": (144, 256, (0, 2)), "Q5_K": (176, 256, (0, 2)), "Q6_K": (210, 256, (208,)),
}


@dataclass(frozen=True)
class Shape:
    """What a Llama-family file's tensors need."""

    arch: str  # GGUF architecture: llama, qwen2, qwen3, phi3 (q/k/v and gate/up stored fused) or gemma3
    layers: int
    hidden: int
    mlp: int
    heads: int
    kv_heads: int
    vocab: int = 49152
    tied: bool = True
    rope_theta: float = 500000.0
    rope_freqs: bool = False  # Llama 3.1/3.2 store RoPE scaling factors as a tensor
    head_dim: int | None = None  # where it is not hidden / heads (Qwen3: 128 at every size)
    rotary: float = 1.0  # the share of each head RoPE turns (phi3: Phi-4-mini turns 0.75)
    long_rope: bool = False  # phi3: LongRoPE factors for a 131,072-token context trained from 4,096 (Phi-3.5, Phi-4-mini)
    window: int = 0  # gemma3: the local layers' sliding window

    def small(self, layers: int = 2) -> "Shape":
        """The same widths with fewer layers (tests make these in seconds)."""
        return replace(self, layers=layers)


SHAPES = {
    "llama-3.2-1b": Shape("llama", 16, 2048, 8192, 32, 8, rope_freqs=True),
    "llama-3.2-3b": Shape("llama", 28, 3072, 8192, 24, 8, rope_freqs=True),
    "llama-3.1-8b": Shape("llama", 32, 4096, 14336, 32, 8, tied=False, rope_freqs=True),
    "qwen2.5-1.5b": Shape("qwen2", 28, 1536, 8960, 12, 2, rope_theta=1000000.0),
    "qwen3-0.6b": Shape("qwen3", 28, 1024, 3072, 16, 8, vocab=151936, rope_theta=1000000.0, head_dim=128),
    "qwen3-8b": Shape("qwen3", 36, 4096, 12288, 32, 8, vocab=151936, tied=False, rope_theta=1000000.0, head_dim=128),
    "phi-4": Shape("phi3", 40, 5120, 17920, 40, 10, vocab=100352, tied=False, rope_theta=250000.0),
    "phi-3.5-mini": Shape("phi3", 32, 3072, 8192, 32, 32, vocab=32064, tied=False, rope_theta=10000.0, long_rope=True),
    "phi-4-mini": Shape("phi3", 32, 3072, 8192, 24, 8, vocab=200064, rope_theta=10000.0, rotary=0.75, long_rope=True),
    "gemma-3-270m": Shape("gemma3", 18, 640, 2048, 4, 1, vocab=262144, rope_theta=1000000.0, head_dim=256, window=512),
    "gemma-3-4b": Shape("gemma3", 34, 2560, 10240, 8, 4, vocab=262144, rope_theta=1000000.0, head_dim=256, window=1024),
}


def use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose V and down projections get more bits in *_M files."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(file_type: str, kind: str, layer: int, layers: int) -> str:
    """The type llama.cpp's quantizer gives tensor `kind` ("output", "token_embd", "attn_v", ...); a
    float file is float throughout."""
    if file_type in ("F16", "F32"):
        return file_type
    if kind in ("output", "token_embd_tied"):
        return "Q8_0" if file_type == "Q8_0" else "Q6_K"
    if kind == "attn_qkv" and file_type in ("Q4_K_M", "Q5_K_M"):  # a fused q/k/v (Phi-3): one step up
        return "Q5_K" if file_type == "Q4_K_M" else "Q6_K"
    if file_type in ("Q4_K_M", "Q5_K_M"):
        base = "Q4_K" if file_type == "Q4_K_M" else "Q5_K"
        if kind in ("attn_v", "ffn_down") and use_more_bits(layer, layers):
            return "Q6_K"
        return base
    return file_type


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, bytes per row] uint8: random blocks of `type_name` with scales near 1/64 (so that a
    layer's outputs stay of the order of its inputs)."""
    block_bytes, block_inputs, scale_fields = BLOCKS[type_name]
    if cols % block_inputs:
        raise ValueError(f"{type_name} needs rows of a multiple of {block_inputs} inputs, got {cols}")
    blocks = rng.integers(0, 256, size=(rows, cols // block_inputs, block_bytes), dtype=np.uint8)
    for offset in scale_fields:
        scales = (rng.uniform(0.5, 1.5, size=blocks.shape[:2]) / 64 / np.sqrt(cols / 256)).astype(np.float16)
        blocks[..., offset:offset + 2] = scales[..., None].view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


def write_gguf(path: Path, shape: Shape, file_type: str, tokenizer_gguf: Path, *, seed: int = 0,
               progress=None) -> Path:
    """Write a GGUF of `shape` whose linears are random blocks typed as llama.cpp's `file_type`
    (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K_M, Q5_K_M, Q6_K, F16, F32); norms are F32 ones."""
    import gguf

    rng = np.random.default_rng(seed)
    source = gguf.GGUFReader(str(tokenizer_gguf))
    writer = gguf.GGUFWriter(str(path), shape.arch)
    arch = shape.arch
    writer.add_name(f"synthetic {arch} {shape.layers}x{shape.hidden} {file_type}")
    writer.add_context_length(LONG_ROPE_CONTEXT if shape.long_rope else 8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.mlp)
    writer.add_block_count(shape.layers)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(shape.rope_theta)
    _copy_tokenizer(source, writer, shape.vocab)
    head_dim = shape.head_dim or shape.hidden // shape.heads
    if shape.head_dim:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "phi3":
        writer.add_rope_dimension_count(int(head_dim * shape.rotary))
    if arch == "gemma3":
        writer.add_sliding_window(shape.window)
    if shape.long_rope:
        writer.add_rope_scaling_orig_ctx_len(LONG_ROPE_ORIGINAL)
        writer.add_rope_scaling_attn_factors(long_rope_attention_factor())

    def linear(name: str, kind: str, layer: int, out: int, inp: int) -> None:
        type_name = tensor_type(file_type, kind, layer, shape.layers)
        if type_name in ("F16", "F32"):
            weight = (rng.standard_normal((out, inp), dtype=np.float32) / np.sqrt(inp)).astype(type_name.lower().replace("f", "float"))
            writer.add_tensor(name, weight)
        else:
            blocks = random_blocks(type_name, out, inp, rng)
            writer.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType[type_name])

    def norm(name: str, size: int) -> None:
        writer.add_tensor(name, np.ones(size, dtype=np.float32))

    embed_kind = "token_embd_tied" if shape.tied else "token_embd"
    linear("token_embd.weight", embed_kind, 0, shape.vocab, shape.hidden)
    norm("output_norm.weight", shape.hidden)
    if not shape.tied:
        linear("output.weight", "output", 0, shape.vocab, shape.hidden)
    if shape.rope_freqs:
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(head_dim, shape.rope_theta))
    if shape.long_rope:
        short, long = long_rope_factors(int(head_dim * shape.rotary))
        writer.add_tensor("rope_factors_short.weight", short)
        writer.add_tensor("rope_factors_long.weight", long)
    for i in range(shape.layers):
        blk = f"blk.{i}."
        norm(blk + "attn_norm.weight", shape.hidden)
        norm(blk + "ffn_norm.weight", shape.hidden)
        if arch == "phi3":
            linear(blk + "attn_qkv.weight", "attn_qkv", i, (shape.heads + 2 * shape.kv_heads) * head_dim, shape.hidden)
        else:
            linear(blk + "attn_q.weight", "attn_q", i, shape.heads * head_dim, shape.hidden)
            linear(blk + "attn_k.weight", "attn_k", i, shape.kv_heads * head_dim, shape.hidden)
            linear(blk + "attn_v.weight", "attn_v", i, shape.kv_heads * head_dim, shape.hidden)
        if arch == "qwen2":
            for part, size in (("q", shape.heads), ("k", shape.kv_heads), ("v", shape.kv_heads)):
                writer.add_tensor(f"{blk}attn_{part}.bias", rng.standard_normal(size * head_dim).astype(np.float32) / 8)
        if arch in ("qwen3", "gemma3"):  # per-head q and k norms, not all ones (a test must see them applied)
            for part in "qk":
                writer.add_tensor(f"{blk}attn_{part}_norm.weight", rng.uniform(0.5, 1.5, head_dim).astype(np.float32))
        if arch == "gemma3":  # the norms of each branch's output
            for name in ("post_attention_norm", "post_ffw_norm"):
                writer.add_tensor(f"{blk}{name}.weight", rng.uniform(0.5, 1.5, shape.hidden).astype(np.float32))
        linear(blk + "attn_output.weight", "attn_output", i, shape.hidden, shape.heads * head_dim)
        if arch == "phi3":
            linear(blk + "ffn_up.weight", "ffn_up", i, 2 * shape.mlp, shape.hidden)  # [gate; up]
        else:
            linear(blk + "ffn_gate.weight", "ffn_gate", i, shape.mlp, shape.hidden)
            linear(blk + "ffn_up.weight", "ffn_up", i, shape.mlp, shape.hidden)
        linear(blk + "ffn_down.weight", "ffn_down", i, shape.hidden, shape.mlp)
        if progress is not None:
            progress(i + 1, shape.layers)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


LONG_ROPE_ORIGINAL, LONG_ROPE_CONTEXT = 4096, 131072  # Phi-3.5-mini's and Phi-4-mini's


def long_rope_attention_factor() -> float:
    """What llama.cpp's converter stores for a LongRoPE model grown from 4,096 to 131,072 tokens (and
    transformers computes when a config gives none): sqrt(1 + ln(growth) / ln(original))."""
    return math.sqrt(1 + math.log(LONG_ROPE_CONTEXT / LONG_ROPE_ORIGINAL) / math.log(LONG_ROPE_ORIGINAL))


def long_rope_factors(rotary: int) -> tuple[np.ndarray, np.ndarray]:
    """LongRoPE's short and long factors [rotary / 2] float32, of the kind Phi-3.5-mini stores: near 1
    and rising for the short context, up to some tens for the long one (the values are made up)."""
    rising = np.linspace(0.0, 1.0, rotary // 2)
    return (1.0 + 0.6 * rising ** 2).astype(np.float32), (1.0 + 40.0 * rising ** 3).astype(np.float32)


def llama3_rope_factors(head_dim: int, theta: float, factor: float = 32.0, low: float = 1.0, high: float = 4.0,
                        old_context: float = 8192.0) -> np.ndarray:
    """[head_dim / 2] float32: the RoPE divisors Llama 3.1/3.2's converter stores as rope_freqs."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * np.pi / inv_freq
    smooth = (old_context / wavelen - low) / (high - low)
    factors = np.where(wavelen < old_context / high, 1.0,
                       np.where(wavelen > old_context / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return factors.astype(np.float32)


def _copy_tokenizer(source, writer, vocab: int) -> None:
    """The default model's tokenizer and chat template, with the token list cut or padded to `vocab`."""
    import gguf

    fields = source.fields
    tokens = [bytes(fields["tokenizer.ggml.tokens"].parts[i]) for i in fields["tokenizer.ggml.tokens"].data]
    if vocab < len(tokens):
        raise ValueError(f"vocab {vocab} is smaller than the tokenizer's {len(tokens)} tokens")
    tokens += [f"<|extra_{i}|>".encode() for i in range(vocab - len(tokens))]
    writer.add_tokenizer_model(fields["tokenizer.ggml.model"].contents())
    writer.add_token_list(tokens)
    types = list(fields["tokenizer.ggml.token_type"].contents())
    writer.add_token_types(types + [gguf.TokenType.USER_DEFINED] * (vocab - len(types)))
    writer.add_token_merges(fields["tokenizer.ggml.merges"].contents())
    for key, add in (("tokenizer.ggml.bos_token_id", writer.add_bos_token_id),
                     ("tokenizer.ggml.eos_token_id", writer.add_eos_token_id),
                     ("tokenizer.ggml.unknown_token_id", writer.add_unk_token_id),
                     ("tokenizer.ggml.padding_token_id", writer.add_pad_token_id)):
        if key in fields:
            add(fields[key].contents())
    if "tokenizer.chat_template" in fields:
        writer.add_chat_template(fields["tokenizer.chat_template"].contents())
