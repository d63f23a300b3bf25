"""Every common GGUF type runs as stored, exactly, and small files of real models' shapes load and run.

- Per type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), on random blocks (every
  bit pattern is a valid block once the float16 scales are sane): the layer's weights equal
  `gguf.quants.dequantize` of the blocks value for value (a product gguf forms as d·sc·0 gives −0
  where the exact sum gives +0; nothing else differs), and the kernel's outputs follow the stated
  recipe within float32 round-off and the exact product within the rows' quantization error
  (test_quantized.check_layer_recipe). Negative control per type: the same blocks read in the wrong
  order give other weights.
- Fused layers whose tensors have different types (Q4_K beside Q6_K, Q2_K beside Q3_K, Q4_0 beside
  Q5_1, Q8_0 beside Q4_K, …) keep a part per run of one type, each in its own layout; the layer
  equals each tensor's dequantization and each part follows its own recipe; float types make none.
- Batch invariance per type: each row of a 1..17-row call equals its one-row call bit for bit, and
  the kernels built for plain x86-64 with AVX2 (a subprocess) give the same bits as this machine's.
- Files: 2-layer files with Llama-3.2-1B's widths (rope_freqs included) and Qwen2.5-1.5B's (q/k/v
  bias), in Q4_K_M's mix and in Q8_0, load without a float copy and generate; greedy speculation
  with prompt lookup equals plain decoding on them; a second load maps the packed weights the first
  kept, without packing, and generates the same tokens; a copy of a file with a new modification
  time (a new install) finds the cache folder made for its content, and one byte changed does not;
  an unsupported type and an unsupported architecture each get one line naming them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from specdec.errors import ModelLoadError
from specdec.runtime.gguf_synthetic import SHAPES, Shape, random_blocks, write_gguf
from specdec.runtime.llama import LAYER_WEIGHTS
from specdec.runtime.quant import QuantizedLinear, gguf_parts, pack_gguf_tensors
from tests.kernel_checks import check_layer_recipe, on_generic_build

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
ROWS, INPUTS = 48, 512


def dequantized(raw: torch.Tensor, type_name: str) -> torch.Tensor:
    import gguf

    return torch.from_numpy(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[type_name]).astype(np.float32))


def blocks(type_name: str, seed: int = 0, rows: int = ROWS) -> torch.Tensor:
    return torch.from_numpy(random_blocks(type_name, rows, INPUTS, np.random.default_rng(seed)))


def layer_of(raws: list[torch.Tensor], types: list[str]) -> QuantizedLinear:
    parts, first = [], 0
    for layout, count in gguf_parts(types):
        parts.append(pack_gguf_tensors(raws[first:first + count], types[first:first + count], [None] * count))
        first += count
    return QuantizedLinear.from_packed(parts, [layout for layout, _ in gguf_parts(types)])


@pytest.mark.parametrize("type_name", TYPES)
def test_layer_weights_equal_gguf_dequantization(type_name):
    raw = blocks(type_name)
    layer = layer_of([raw], [type_name])
    assert layer.layout == type_name
    assert torch.equal(layer.dequantized_weight(), dequantized(raw, type_name))


@pytest.mark.parametrize("type_name", TYPES)
def test_layer_follows_its_recipe(type_name):
    check_layer_recipe(layer_of([blocks(type_name, seed=1)], [type_name]))


@pytest.mark.parametrize("type_name", TYPES)
def test_negative_control_blocks_in_the_wrong_order(type_name):
    """A reader that walks each row's blocks in the wrong order (the likeliest decoding slip) gives
    other weights: the equality above can fail."""
    import gguf

    raw = blocks(type_name)
    size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][1]
    reversed_blocks = raw.reshape(ROWS, -1, size).flip(1).reshape(ROWS, -1).contiguous()
    assert not torch.equal(layer_of([reversed_blocks], [type_name]).dequantized_weight(), dequantized(raw, type_name))


@pytest.mark.parametrize("types", [["Q4_K", "Q4_K", "Q6_K"], ["Q2_K", "Q3_K"], ["Q4_0", "Q5_1"], ["Q5_K", "Q4_K"],
                                   ["Q5_0", "Q5_0", "Q8_0"], ["Q8_0", "Q4_K"], ["Q6_K", "Q4_0", "Q6_K"]])
def test_fused_layers_of_mixed_types_stay_exact(types):
    raws = [blocks(t, seed=i, rows=16 * (i + 1)) for i, t in enumerate(types)]
    layer = layer_of(raws, types)
    want = torch.cat([dequantized(r, t) for r, t in zip(raws, types)])
    assert torch.equal(layer.dequantized_weight(), want)
    check_layer_recipe(layer)


def test_fused_layers_keep_a_part_per_type():
    assert gguf_parts(["Q4_K", "Q4_K", "Q6_K"]) == [("Q4_K", 2), ("Q6_K", 1)]
    assert gguf_parts(["Q6_K", "Q4_0", "Q6_K"]) == [("Q6_K", 1), ("Q4_0", 1), ("Q6_K", 1)]
    assert gguf_parts(["Q8_0"]) == [("Q8_0", 1)]
    assert gguf_parts(["Q4_K", "F16"]) is None
    assert gguf_parts(["BF16"]) is None


def test_common_types_are_packed_at_their_file_size():
    """Q4_0, Q4_K, Q6_K and Q8_0 hold what the file holds and no more (no offsets Q4_0 and Q6_K do not
    have, Q4_K's scales in 6 bits): the packed bytes are the file's."""
    for type_name in ("Q4_0", "Q4_K", "Q6_K", "Q8_0"):
        raw = blocks(type_name)
        assert layer_of([raw], [type_name]).packed.numel() == raw.numel()


def row_mismatches(type_name: str) -> int:
    layer = layer_of([blocks(type_name, seed=2)], [type_name])
    x = torch.randn(17, INPUTS, generator=torch.Generator().manual_seed(3))
    alone = torch.cat([layer(x[i:i + 1]) for i in range(17)])
    return sum(int(not torch.equal(layer(x[:k]), alone[:k])) for k in range(1, 18))


@pytest.mark.parametrize("type_name", TYPES)
def test_rows_are_batch_invariant(type_name):
    assert row_mismatches(type_name) == 0


def fixed_outputs() -> list[list[float]]:
    """Each type's layer on fixed rows, for comparing builds bit for bit."""
    x = torch.randn(5, INPUTS, generator=torch.Generator().manual_seed(4))
    layers = [layer_of([blocks(t, seed=5)], [t]) for t in TYPES]
    layers.append(layer_of([blocks("Q8_0", seed=6), blocks("Q6_K", seed=7)], ["Q8_0", "Q6_K"]))  # two kinds of parts
    return [layer(x).flatten().tolist() for layer in layers]


@pytest.mark.slow
def test_generic_build_gives_the_same_bits():
    path, mismatches, outputs = on_generic_build(
        "from tests.test_gguf_types import fixed_outputs, row_mismatches, TYPES; "
        "result = [[row_mismatches(t) for t in TYPES], fixed_outputs()]")
    assert path == "avx2"
    assert mismatches == [0] * len(TYPES)
    assert outputs == fixed_outputs()


@pytest.fixture(scope="module")
def tokenizer_gguf(default_gguf):
    """The default model's GGUF, whose tokenizer the synthetic files borrow."""
    return default_gguf


SMALL = {"llama-3.2-1b": SHAPES["llama-3.2-1b"].small(), "qwen2.5-1.5b": SHAPES["qwen2.5-1.5b"].small(),
         "qwen3-0.6b": replace(SHAPES["qwen3-0.6b"].small(), vocab=49152)}  # (its own 151,936 tokens: 128 MB more)


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q8_0"])
@pytest.mark.parametrize("shape", list(SMALL))
def test_small_files_of_real_shapes_load_and_generate(tmp_path, tokenizer_gguf, shape, file_type, monkeypatch):
    from specdec.drafters import PromptLookupDrafter
    from specdec.decode.engine import Engine, GenerationConfig
    from specdec.runtime import gguf_convert, gguf_model, load_model

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / f"{shape}-{file_type}.gguf", SMALL[shape], file_type, tokenizer_gguf)
    monkeypatch.setattr(gguf_convert, "_convert_weights", lambda *a: pytest.fail("a float copy was written"))
    model = load_model(str(path))
    config = model.net.config
    assert (config.rope_freq_factors is not None) == (shape == "llama-3.2-1b")
    assert config.attention_bias == (shape == "qwen2.5-1.5b")
    small = SMALL[shape]
    assert config.qk_norm == (shape == "qwen3-0.6b") and config.head_dim == (small.head_dim or small.hidden // small.heads)
    layouts = model.weights.forms
    assert layouts == ({"Q8_0"} if file_type == "Q8_0" else {"Q4_K", "Q6_K", "Q4_K+Q6_K"})  # q|k Q4_K beside a Q6_K v
    kept = list((tmp_path / "cache").rglob("*.safetensors"))
    assert [f.name for f in kept] == [gguf_model.packed_file(model.folder).name]  # no float32 copy
    assert kept[0].stat().st_size < 1.05 * path.stat().st_size  # the types' own bytes, none widened
    text = "the cat sat on the mat. the cat sat on the mat. the cat"
    ids = Engine(model).encode(text, chat=False)
    settings = GenerationConfig(max_new_tokens=24, gamma=4, ignore_eos=True)
    plain = Engine(model).generate(ids, settings)
    lookup = Engine(model, PromptLookupDrafter()).generate(ids, settings)
    assert len(plain.token_ids) == 24
    assert lookup.token_ids == plain.token_ids
    # a second load maps the packed weights the first one kept, packs nothing, and runs the same
    monkeypatch.setattr(gguf_model, "pack_weights", lambda *a: pytest.fail("packed again"))
    again = load_model(str(path))
    assert Engine(again).generate(ids, settings).token_ids == plain.token_ids


def test_qwen3_layers_run_in_one_call_with_their_q_and_k_norms(tmp_path, tokenizer_gguf, monkeypatch):
    """Qwen3's q and k norms run inside the fused layers (`decoder_layers`, one call a pass), bit for bit
    as the layer-by-layer path runs them. Control: the fused call with the norms left out differs."""
    from specdec.runtime import load_model

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    net = load_model(str(write_gguf(tmp_path / "qwen3.gguf", SMALL["qwen3-0.6b"], "Q8_0", tokenizer_gguf))).net
    weights = net._fused_layer_weights()
    assert weights is not None and weights[10].numel() == net.config.head_dim  # the fused path, with the norms
    ids = torch.arange(100, 140)[None]
    fused = net.forward(ids, net.new_cache(64))
    monkeypatch.setattr(type(net), "_fused_layer_weights", lambda self: None)
    layered = net.forward(ids, net.new_cache(64))
    assert torch.equal(fused, layered)
    unnormed = [torch.empty(0) if i % LAYER_WEIGHTS in (10, 11) else w for i, w in enumerate(weights)]
    monkeypatch.setattr(type(net), "_fused_layer_weights", lambda self: unnormed)
    assert not torch.equal(net.forward(ids, net.new_cache(64)), fused)


def test_a_copy_installed_anew_finds_the_folder_made_for_its_content(tmp_path, tokenizer_gguf, monkeypatch, capsys):
    import os
    import shutil

    from specdec.runtime import gguf_convert

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "first").mkdir()
    path = write_gguf(tmp_path / "first" / "model.gguf", SMALL["llama-3.2-1b"], "Q8_0", tokenizer_gguf)
    size = path.stat().st_size
    earlier = [tmp_path / "cache" / "gguf" / f"model-{size}-{stamp}-v2" for stamp in (1, 2)]
    other = tmp_path / "cache" / "gguf" / f"model-{size + 1}-1-v2"  # another file's, by its size: kept
    for folder in (*earlier, other):
        folder.mkdir(parents=True)
    folder = gguf_convert.metadata_folder(path)
    assert not any(f.exists() for f in earlier) and other.is_dir()
    assert "removed 2 cached folder(s) of model.gguf" in capsys.readouterr().err

    copy = tmp_path / "installed-again" / "model.gguf"  # what a new install (or a clean clone) is
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    os.utime(copy, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    monkeypatch.setattr(gguf_convert, "_convert_tokenizer", lambda *a: pytest.fail("converted again"))
    assert gguf_convert.metadata_folder(copy) == folder
    monkeypatch.setattr(gguf_convert.hashlib, "sha256", lambda: pytest.fail("read through again"))
    assert gguf_convert.metadata_folder(copy) == folder  # its digest remembered

    # negative control: one weight byte changed, the same size, gets a folder of its own
    monkeypatch.undo()
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    changed = tmp_path / "changed" / "model.gguf"
    changed.parent.mkdir()
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(bytes(data))
    assert gguf_convert.content_key(changed) != folder.name


def test_packing_anew_removes_the_packed_files_of_earlier_layouts(tmp_path, capsys):
    from specdec.runtime import gguf_model

    folder = tmp_path / "packed"
    folder.mkdir()
    (folder / "0123456789ab.safetensors").write_bytes(b"an earlier layout")
    (folder / "notes.txt").write_text("not ours to remove")
    cache = folder / "ba9876543210.safetensors"
    gguf_model._write_packed(cache, {"norm.weight": torch.ones(4)}, {"embed": ["float32"]})
    assert sorted(f.name for f in folder.iterdir()) == ["ba9876543210.safetensors", "notes.txt"]
    assert "removed 1 packed file of an earlier layout" in capsys.readouterr().err
    gguf_model._write_packed(cache, {"norm.weight": torch.ones(4)}, {"embed": ["float32"]})  # nothing stale: silent
    assert "removed" not in capsys.readouterr().err


def test_unsupported_type_gets_one_line(tmp_path):
    import gguf

    from specdec.runtime.gguf_convert import hf_config, read_gguf
    from specdec.runtime.gguf_model import GgufTensors

    path = tmp_path / "iq.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    raw = np.zeros((16, 66), dtype=np.uint8)  # IQ2_XXS: 66 bytes per 256 inputs
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_shape=raw.shape, raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for read in (GgufTensors, lambda p: hf_config(read_gguf(p), p)):  # the loader, and the first read of a file
        with pytest.raises(ModelLoadError, match=r"blk\.0\.attn_q\.weight is stored as IQ2_XXS.*llama-quantize") as err:
            read(path)
        assert "\n" not in str(err.value)


def test_a_file_without_its_metadata_gets_one_line(tmp_path):
    import gguf

    from specdec.runtime.gguf_convert import hf_config, read_gguf

    path = tmp_path / "bare.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_q.weight", random_blocks("Q8_0", 16, 64, np.random.default_rng(0)),
                      raw_shape=(16, 68), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"bare\.gguf lacks the metadata field .*not a complete GGUF") as err:
        hf_config(read_gguf(path), path)
    assert "\n" not in str(err.value)


def test_unsupported_architecture_gets_one_line(tmp_path, tokenizer_gguf):
    from specdec.runtime.gguf_convert import hf_config, read_gguf

    path = write_gguf(tmp_path / "phi.gguf", Shape("llama", 1, 256, 512, 4, 2), "Q8_0", tokenizer_gguf)
    data = path.read_bytes().replace(b"llama.", b"phi3x.", ).replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama",
                                                                        b"\x05\x00\x00\x00\x00\x00\x00\x00phi3x")
    path.write_bytes(data)
    with pytest.raises(ModelLoadError, match=r"is a 'phi3x' model, which specdec's runtime does not run") as err:
        hf_config(read_gguf(path), path)
    assert "\n" not in str(err.value)


PHI3 = Shape("phi3", 2, 256, 512, 4, 2, rope_theta=10000.0, tied=False)  # q/k/v and gate/up stored fused


def _swap_gate_and_up(path, out):
    """A copy of a phi3 F32 file whose fused ffn_up holds [up; gate] instead of [gate; up]."""
    import gguf

    data = bytearray(path.read_bytes())
    for tensor in gguf.GGUFReader(str(path)).tensors:
        if tensor.name.endswith("ffn_up.weight"):  # F32 rows, gate's first: swap the two halves' bytes
            start, size = int(tensor.data_offset), int(tensor.n_bytes)
            half = size // 2
            data[start:start + size] = data[start + half:start + size] + data[start:start + half]
    out.write_bytes(bytes(data))
    return out


def test_phi3_files_equal_transformers_reading_of_the_same_file(tmp_path, tokenizer_gguf, monkeypatch):
    """A Phi-3 file (GGUF architecture phi3: q/k/v stored as one attn_qkv, gate and up as one ffn_up)
    runs as its rows are stored: its logits equal those of transformers loading the same file (its
    own GGUF reader and Phi3ForCausalLM, an independent reading) within float32 round-off. Control:
    the file with gate and up swapped inside ffn_up gives logits far outside that bound."""
    from transformers import AutoModelForCausalLM

    from specdec.runtime import load_model
    from tolerances import decoder_sums, max_difference, round_off

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "phi3.gguf", PHI3, "F32", tokenizer_gguf)
    ids = torch.arange(300, 340)[None]  # [1, 40]
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want = reference(ids).logits[0]  # [40, V]
    net = load_model(str(path), kv_cache="float32").net
    assert net.config.family == "phi3"
    bound = round_off(want, *decoder_sums(net.config))
    assert max_difference(net.forward(ids, net.new_cache(64))[0], want) <= bound
    swapped = _swap_gate_and_up(path, tmp_path / "phi3-swapped.gguf")
    other = load_model(str(swapped), kv_cache="float32").net
    assert max_difference(other.forward(ids, other.new_cache(64))[0], want) > 100 * bound


def test_a_phi3_file_runs_as_stored_and_speculates_exactly(tmp_path, tokenizer_gguf, monkeypatch):
    """A Phi-3 file in Q4_K_M's mix (its fused attn_qkv one step up, Q5_K, as llama.cpp's quantizer
    gives it) loads without a float copy, every linear in its stored type; greedy prompt lookup equals
    plain decoding on it."""
    from specdec.decode.engine import Engine, GenerationConfig
    from specdec.drafters import PromptLookupDrafter
    from specdec.runtime import gguf_convert, load_model

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "phi3-q4km.gguf", replace(PHI3, mlp=1024), "Q4_K_M", tokenizer_gguf)
    monkeypatch.setattr(gguf_convert, "_convert_weights", lambda *a: pytest.fail("a float copy was written"))
    model = load_model(str(path))
    assert model.weights.forms == {"Q4_K", "Q5_K", "Q6_K"}
    ids = Engine(model).encode("the cat sat on the mat. the cat sat on the mat. the cat", chat=False)
    settings = GenerationConfig(max_new_tokens=24, gamma=4, ignore_eos=True)
    plain = Engine(model).generate(ids, settings)
    assert Engine(model, PromptLookupDrafter()).generate(ids, settings).token_ids == plain.token_ids


def _phi3_reference(folder, plain, variant: Shape):
    """transformers' Phi3ForCausalLM of the weights of `plain` (an F32 phi3 file, read by transformers'
    own GGUF reader) with `variant`'s RoPE: LongRoPE's rope_parameters (the factors and attention
    factor gguf_synthetic writes) and partial_rotary_factor, as a Hugging Face config states them."""
    from transformers import AutoModelForCausalLM
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    from specdec.runtime.gguf_synthetic import LONG_ROPE_CONTEXT, LONG_ROPE_ORIGINAL, long_rope_attention_factor, long_rope_factors

    model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=plain.name, dtype=torch.float32).eval()
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    short, long = long_rope_factors(int(head_dim * variant.rotary))
    config.max_position_embeddings, config.original_max_position_embeddings = LONG_ROPE_CONTEXT, LONG_ROPE_ORIGINAL
    config.rope_parameters = {"rope_type": "longrope", "rope_theta": variant.rope_theta, "short_factor": short.tolist(),
                              "long_factor": long.tolist(), "original_max_position_embeddings": LONG_ROPE_ORIGINAL,
                              "attention_factor": long_rope_attention_factor(), "partial_rotary_factor": variant.rotary}
    model.model.rotary_emb = Phi3RotaryEmbedding(config=config)
    return model


@pytest.mark.parametrize("variant", [
    replace(PHI3, long_rope=True),  # Phi-3.5-mini's kind: LongRoPE over every dimension of a head
    replace(PHI3, long_rope=True, rotary=0.75),  # Phi-4-mini's: LongRoPE over 48 of each head's 64
], ids=["phi-3.5-mini", "phi-4-mini"])
def test_phi3_long_rope_and_partial_rope_equal_transformers(tmp_path, tokenizer_gguf, monkeypatch, variant):
    """LongRoPE (Phi-3.5-mini, Phi-4-mini: the short factors dividing the frequencies, the stored
    attention factor on cos and sin) and RoPE over part of each head (Phi-4-mini), in F32 phi3 files:
    a prefill of 30 tokens, then 10 passes of one token over the cache, through the kernels' fused pass,
    give the logits of transformers' Phi3ForCausalLM with the same weights and those settings in its
    config, within float32 round-off. The runtime runs up to the 4,096 tokens the short factors hold
    for; the layer-by-layer path (Python's RoPE) gives the fused pass's bits. Control: the same weights
    with plain RoPE over the whole head (transformers' reading of the file without the factors) differ
    by over 100 times the bound."""
    from transformers import AutoModelForCausalLM

    from specdec.runtime import load_model
    from tolerances import decoder_sums, max_difference, round_off

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "plain").mkdir()
    plain = write_gguf(tmp_path / "plain" / "phi3.gguf", PHI3, "F32", tokenizer_gguf)  # the same seed: the same weights
    path = write_gguf(tmp_path / "phi3-rope.gguf", variant, "F32", tokenizer_gguf)
    ids = torch.arange(300, 340)[None]  # [1, 40]
    with torch.no_grad():
        want = _phi3_reference(tmp_path / "plain", plain, variant)(ids).logits[0]  # [40, V]
        unscaled = AutoModelForCausalLM.from_pretrained(str(tmp_path / "plain"), gguf_file=plain.name,
                                                        dtype=torch.float32).eval()(ids).logits[0]
    net = load_model(str(path), kv_cache="float32").net
    assert net.config.max_context == 4096 and net.config.rope_dim == int(64 * variant.rotary)
    cache = net.new_cache(64)
    got = torch.cat([net.forward(ids[:, :30], cache)[0]] + [net.forward(ids[:, t:t + 1], cache)[0] for t in range(30, 40)])
    bound = round_off(want, *decoder_sums(net.config, positions=40))
    assert max_difference(got, want) <= bound
    assert max_difference(unscaled, want) > 100 * bound
    fused = net.forward(ids, net.new_cache(64))
    monkeypatch.setattr(type(net), "_fused_layer_weights", lambda self: None)  # layer by layer: the same bits
    assert net._invariant_kernels() is not None and torch.equal(net.forward(ids, net.new_cache(64)), fused)


@pytest.mark.parametrize("old, new, refused", [
    # the stored RoPE width, 64 (the head's), made 47: RoPE turns dimensions in pairs
    (b"phi3.rope.dimension_count" + (4).to_bytes(4, "little") + (64).to_bytes(4, "little"),
     b"phi3.rope.dimension_count" + (4).to_bytes(4, "little") + (47).to_bytes(4, "little"),
     r"turns 47 of each head's 64 dimensions; RoPE needs an even number"),
    (b"blk.0.attn_output.weight", b"rope_factors_long.weight", r"rope_factors_long without rope_factors_short"),
])
def test_phi3_variants_the_runtime_does_not_run_get_one_line(tmp_path, tokenizer_gguf, old, new, refused):
    """An odd RoPE width and LongRoPE's long factors without its short ones are refused by name, each
    in one line; the plain file is not (the control)."""
    from specdec.runtime.config import ModelConfig
    from specdec.runtime.gguf_convert import hf_config, read_gguf

    plain = write_gguf(tmp_path / "phi3.gguf", PHI3, "Q8_0", tokenizer_gguf)
    assert ModelConfig.from_hf(hf_config(read_gguf(plain), plain)).family == "phi3"
    data = plain.read_bytes()
    assert data.count(old) == 1
    path = tmp_path / "phi3-variant.gguf"
    path.write_bytes(data.replace(old, new))
    with pytest.raises(ModelLoadError, match=refused) as err:
        ModelConfig.from_hf(hf_config(read_gguf(path), path))
    assert "\n" not in str(err.value)
