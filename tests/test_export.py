"""`specdec export`: the written folders against the engines' pinned tables, and a numeric round trip
through reference forward passes written from the engines' model code (vLLM llama_eagle3.py and
medusa.py), which read only the exported config.json + model.safetensors. No engine is run."""

from __future__ import annotations

import json
import math
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from conftest import tiny_hf_config
from tolerances import max_difference, round_off
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.export import eagle3 as export_eagle3
from specdec.export import tables
from specdec.export.exporter import export_head
from specdec.export.gamma import ASSUMED_COST_RATIO, MAX_GAMMA
from specdec.heads.files import save_head
from specdec.control.theory import best_gamma

AUX = [2, 4, 5]  # the default [2, L//2, L-3] of the 8-layer target below
ALPHAS = [0.6, 0.5, 0.4]


# ---- fixtures: a config-only 8-layer target (EAGLE-3 needs three layers) and seeded random heads ----

@pytest.fixture(scope="module")
def target8(tmp_path_factory):
    """The tiny target's config with 8 layers: an EAGLE-3 export reads the target's config only."""
    folder = tmp_path_factory.mktemp("target8")
    hf = tiny_hf_config("llama").to_dict()
    hf.update(num_hidden_layers=8, architectures=["LlamaForCausalLM"])
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def random_eagle3_head(target_folder, aux=AUX, seed=0):
    from specdec.heads.eagle3 import Eagle3Config, Eagle3Head
    from specdec.runtime.config import ModelConfig

    torch.manual_seed(seed)
    target = ModelConfig.from_hf(json.loads((target_folder / "config.json").read_text()))
    head = Eagle3Head(Eagle3Config.for_target(target, draft_vocab=40, aux_layers=tuple(aux)))
    head.set_vocabulary(torch.randperm(64, generator=torch.Generator().manual_seed(seed))[:40].sort().values)
    with torch.no_grad():
        for name, param in head.named_parameters():
            param.copy_(torch.randn_like(param) * 0.3 if param.dim() == 2 else 1 + 0.2 * torch.randn_like(param))
    return head.eval()


def save_eagle3(folder, head, target_folder, history=True):
    info = {"target": str(target_folder), "history": [{"alpha_per_depth": ALPHAS}] if history else []}
    save_head(folder, "eagle3", head.config.to_dict(), head.state_dict(), info)
    return folder


@pytest.fixture
def eagle3_folder(tmp_path, target8):
    head = random_eagle3_head(target8)
    return save_eagle3(tmp_path / "head", head, target8), head


# ---- reference forward passes, written from the engines' model code, reading only the exported folder ----

def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def neox_rope(x, positions, theta, head_dim):
    """vLLM's get_rope(is_neox_style=True): x [T, heads, hd]; the two halves rotate as pairs."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = positions[:, None].float() * inv_freq  # [T, hd/2]
    cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class VllmEagle3:
    """vLLM llama_eagle3.py (Eagle3LlamaForCausalLM, norm_before_residual false) over one sequence with
    its own KV cache: combine_hidden_states = fc; layer 0: cat([input_layernorm(embeds),
    hidden_norm(h)]), q/k/v projections, neox RoPE, GQA causal attention, o_proj, residual = h,
    post_attention_layernorm (fused add), SiLU MLP, final norm returning (normed, prenorm);
    compute_logits: lm_head, scattered into [V] at arange(Vd) + d2t."""

    def __init__(self, folder):
        self.c = json.loads((folder / "config.json").read_text())
        self.w = load_file(str(folder / "model.safetensors"))
        self.keys, self.values = [], []

    def step(self, hidden, embeds, positions):  # hidden [T, 3Ht] or [T, H], embeds [T, H], positions [T]
        c, w, p = self.c, self.w, "midlayer."
        eps, nh, nkv, hd = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        if hidden.shape[-1] != c["hidden_size"]:
            hidden = hidden @ w["fc.weight"].T
        residual = hidden
        x = torch.cat([rms_norm(embeds, w[p + "input_layernorm.weight"], eps),
                       rms_norm(hidden, w[p + "hidden_norm.weight"], eps)], dim=-1)  # [T, 2H]
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(-1, nh, hd)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(-1, nkv, hd)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(-1, nkv, hd)
        q, k = neox_rope(q, positions, c["rope_theta"], hd), neox_rope(k, positions, c["rope_theta"], hd)
        past = sum(len(t) for t in self.keys)
        self.keys.append(k)
        self.values.append(v)
        keys, values = torch.cat(self.keys), torch.cat(self.values)  # [S, nkv, hd]
        group = nh // nkv  # query head i reads KV head i // group
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = torch.einsum("thd,shd->hts", q, keys) / math.sqrt(hd)  # [nh, T, S]
        visible = torch.arange(len(keys))[None] <= past + torch.arange(len(q))[:, None]  # causal
        attn = torch.einsum("hts,shd->thd", scores.masked_fill(~visible, -torch.inf).softmax(-1), values)
        h = attn.reshape(len(q), nh * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = h + residual
        residual = h
        gate = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        mlp = (F.silu(gate @ w[p + "mlp.gate_proj.weight"].T) * (gate @ w[p + "mlp.up_proj.weight"].T))
        prenorm = mlp @ w[p + "mlp.down_proj.weight"].T + residual
        return prenorm, self.logits(rms_norm(prenorm, w["norm.weight"], eps))

    def logits(self, normed):
        draft = normed @ self.w["lm_head.weight"].T  # [T, Vd]
        full = torch.full((len(draft), self.c["vocab_size"]), -torch.inf)
        full[:, torch.arange(draft.shape[-1]) + self.w["d2t"]] = draft
        return full


def ours_eagle3(head, aux, embeds, drafted_embed):
    """Our head: a prefill over the T pairs, then one step fed its own prenorm h of the last one."""
    from specdec.runtime.kv_cache import StaticKVCache

    c = head.config
    cache = StaticKVCache(1, c.num_kv_heads, c.head_dim, 64)
    T = len(aux)
    with torch.no_grad():
        h1 = head(aux[None], embeds[None], torch.arange(T)[None], cache, causal=True)[0]
        cache.advance(T)
        h2 = head(h1[-1:][None], drafted_embed[None], torch.tensor([[T]]), cache)[0]
    full = []
    for h in (h1, h2):
        logits = torch.full((len(h), c.vocab_size), -torch.inf)
        logits[:, head.vocab_ids] = head.logits(h).detach()
        full.append(logits)
    return h1, full[0], h2, full[1]


def reference_eagle3(folder, aux, embeds, drafted_embed):
    ref = VllmEagle3(folder)
    h1, l1 = ref.step(aux, embeds, torch.arange(len(aux)))
    h2, l2 = ref.step(h1[-1:], drafted_embed, torch.tensor([len(aux)]))
    return h1, l1, h2, l2


def random_inputs(head, T=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    c = head.config
    aux = torch.randn(T, 3 * c.target_hidden_size, generator=g)
    return aux, torch.randn(T, c.hidden_size, generator=g), torch.randn(1, c.hidden_size, generator=g)


def eagle3_sums(c):
    """The longest float32 sums behind each output of `ours_eagle3` (h1, logits1, h2, logits2), one per
    layer on the way: fc over the three target layers, the decoder layer's longest (q/k/v over
    [embeds, hidden] or the MLP's down projection), the LM head's over the hidden size; the second
    step reads the first one's h, so passes the layer twice."""
    fc, layer, head = 3 * c.target_hidden_size, max(2 * c.hidden_size, c.intermediate_size), c.hidden_size
    return (fc, layer), (fc, layer, head), (fc, layer, layer), (fc, layer, layer, head)


# ---- (a) the pinned tables ----

@pytest.mark.parametrize("fmt", ["vllm", "sglang", "llama.cpp"])
def test_eagle3_export_matches_the_engine_table(eagle3_folder, target8, tmp_path, fmt):
    folder, head = eagle3_folder
    export_head(str(folder), fmt, tmp_path / "out", model=str(target8))
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    c = head.config
    dims = dict(H=c.hidden_size, Ht=c.target_hidden_size, I=c.intermediate_size, nh=c.num_heads, nkv=c.num_kv_heads,
                hd=c.head_dim, V=c.vocab_size, Vd=c.draft_vocab)
    want = tables.expand(tables.EAGLE3_TABLES[fmt], dims)
    assert set(weights) == set(want)
    for name, (shape, dtype) in want.items():
        assert tuple(weights[name].shape) == shape, name
        assert weights[name].dtype == (torch.float32 if dtype == tables.FLOAT else dtype), name
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == 40 and config["vocab_size"] == 64 and config["target_hidden_size"] == 48
    assert config["max_position_embeddings"] == 256 and config["tie_word_embeddings"] is False
    stored = {weights[name].dtype for name in weights if weights[name].is_floating_point()}
    assert stored == {getattr(torch, config["torch_dtype"])}  # torch_dtype names the dtype the folder holds
    ids = [a - 1 for a in AUX] if fmt == "sglang" else AUX  # SGLang: output of layer id (it adds 1 when capturing)
    assert config["eagle_aux_hidden_state_layer_ids"] == ids  # top level: llama.cpp's converter (PR #25794), some vLLMs
    if fmt != "llama.cpp":
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ids
    launch = (tmp_path / "out" / "launch.sh").read_text()
    subprocess.run(["bash", "-n", str(tmp_path / "out" / "launch.sh")], check=True)
    g, _ = best_gamma(sum(ALPHAS) / 3, ASSUMED_COST_RATIO, MAX_GAMMA)
    if fmt == "sglang":  # an explicit dtype: `auto` would make the float32 draft float16 beside a bfloat16 target
        assert re.search(r"--dtype (bfloat16|float16|float32) ", launch)
    assert {"vllm": f'"num_speculative_tokens": {g}', "sglang": f"--speculative-num-steps {g}",
            "llama.cpp": f"--spec-draft-n-max {g}"}[fmt] in launch


# ---- (b) the numeric round trip ----

def test_eagle3_round_trip_equals_our_head(eagle3_folder, target8, tmp_path):
    folder, head = eagle3_folder
    export_head(str(folder), "vllm", tmp_path / "out", model=str(target8))
    inputs = random_inputs(head)
    for ours, ref, sums in zip(ours_eagle3(head, *inputs), reference_eagle3(tmp_path / "out", *inputs),
                               eagle3_sums(head.config)):
        # one float32 head in two orders of operations: round-off relative to |values| (h ≈ 30) and the sums' lengths
        assert max_difference(ours, ref) <= round_off(ref, *sums)


def test_medusa_round_trip_equals_our_heads(tiny_target, tiny_folder, tmp_path):
    from random_heads import random_medusa_heads

    heads = random_medusa_heads(tiny_target)
    save_head(tmp_path / "head", "medusa", heads.config.to_dict(), heads.state_dict(),
              {"target": str(tiny_folder), "history": [{"alpha_per_depth": [0.5, 0.4, 0.3]}]})
    export_head(str(tmp_path / "head"), "vllm", tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    w = load_file(str(tmp_path / "out" / "model.safetensors"))
    K, H, Vd = 3, 48, 40
    want = tables.expand(tables.VLLM_MEDUSA, dict(H=H, V=64, Vd=Vd, K=K))
    assert {n: (tuple(t.shape), t.dtype) for n, t in w.items()} == {
        n: (s, torch.float32 if d == tables.FLOAT else d) for n, (s, d) in want.items()}
    assert config["model_type"] == "medusa" and config["num_heads"] == K and config["truncated_vocab_size"] == Vd
    features = torch.randn(5, H, generator=torch.Generator().manual_seed(3))
    # vLLM medusa.py: blocks[k] = x + SiLU(layers.0(x)); lm_heads[k]; logits scattered to [V] at token_map
    reference = []
    for k in range(config["num_heads"]):
        x = features + F.silu(features @ w[f"blocks.{k}.layers.0.weight"].T + w[f"blocks.{k}.layers.0.bias"])
        full = torch.full((5, config["vocab_size"]), -torch.inf)
        full[:, w["token_map"]] = x @ w[f"lm_heads.{k}.weight"].T
        reference.append(full)
    rows = tiny_target.net.lm_head_weight().float()[heads.vocab_ids]
    with torch.no_grad():
        for k, h in enumerate(heads(features)):
            ours = torch.full((5, 64), -torch.inf)
            ours[:, heads.vocab_ids] = h @ rows.T
            assert max_difference(ours, reference[k]) <= round_off(reference[k], H, H)  # float32 sums over H, twice


# ---- (c) negative controls ----

def test_swapped_qkv_columns_fail_the_round_trip(eagle3_folder, target8, tmp_path, monkeypatch):
    """An export writing q/k/v's columns as [hidden, embeds] instead of [embeds, hidden] passes the
    table (same shapes) but not the round trip."""
    folder, head = eagle3_folder
    split = export_eagle3.split_qkv
    H = head.config.hidden_size
    monkeypatch.setattr(export_eagle3, "split_qkv",
                        lambda w, c: tuple(torch.cat((p[:, H:], p[:, :H]), dim=1) for p in split(w, c)))
    export_head(str(folder), "vllm", tmp_path / "out", model=str(target8))
    inputs = random_inputs(head)
    ours, ref = ours_eagle3(head, *inputs), reference_eagle3(tmp_path / "out", *inputs)
    assert max_difference(ours[1], ref[1]) > round_off(ref[1], *eagle3_sums(head.config)[1])  # the round trip's bound


def test_absolute_d2t_is_caught(eagle3_folder, target8, tmp_path):
    folder, head = eagle3_folder
    tensors = export_eagle3.engine_tensors(head.state_dict(), head.config, torch.float32)
    tensors["d2t"] = head.vocab_ids.clone()  # absolute ids, as in a GGUF, not offsets
    with pytest.raises(SpecdecError, match="offsets|t2d"):
        export_eagle3.check_vocabulary(tensors["d2t"], tensors["t2d"], 64)
    # written anyway, past the check: the round trip scatters to the wrong ids
    export_head(str(folder), "vllm", tmp_path / "out", model=str(target8))
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    weights["d2t"] = torch.minimum(head.vocab_ids.clone(), torch.tensor(63) - torch.arange(40))  # stay in range
    save_file(weights, str(tmp_path / "out" / "model.safetensors"))
    inputs = random_inputs(head)
    assert max_difference(ours_eagle3(head, *inputs)[1], reference_eagle3(tmp_path / "out", *inputs)[1]) == math.inf


def test_eagle1_head_is_refused(tiny_target, tiny_folder, tmp_path):
    from random_heads import random_eagle_head

    head = random_eagle_head(tiny_target)
    save_head(tmp_path / "head", "eagle", head.config.to_dict(), head.state_dict(), {"target": str(tiny_folder)})
    with pytest.raises(SpecdecError, match="bias.*attn_norm"):
        export_head(str(tmp_path / "head"), "vllm", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_tensor_without_counterpart_is_refused(target8, tmp_path):
    head = random_eagle3_head(target8)
    state = {**head.state_dict(), "midlayer.self_attn.qkv.bias": torch.zeros(48 + 2 * 16)}
    save_head(tmp_path / "head", "eagle3", head.config.to_dict(), state, {"target": str(target8), "history": []})
    with pytest.raises(SpecdecError, match="midlayer.self_attn.qkv.bias"):
        export_head(str(tmp_path / "head"), "vllm", tmp_path / "out", gamma_arg=3)


def test_unexportable_heads_are_refused(target8, tmp_path):
    two = random_eagle3_head(target8, aux=[2, 5])
    save_eagle3(tmp_path / "two", two, target8)
    with pytest.raises(SpecdecError, match="exactly 3"):
        export_head(str(tmp_path / "two"), "sglang", tmp_path / "out")
    with pytest.raises(SpecdecError, match="vLLM only"):
        medusa = tmp_path / "medusa"
        save_head(medusa, "medusa", {"hidden_size": 48, "vocab_size": 64, "num_heads": 2, "draft_vocab": 8}, {}, {})
        export_head(str(medusa), "llama.cpp", tmp_path / "out")


def test_llama_cpp_notes_non_default_layers(target8, tmp_path):
    save_eagle3(tmp_path / "head", random_eagle3_head(target8, aux=[1, 3, 6]), target8)
    done = export_head(str(tmp_path / "head"), "llama.cpp", tmp_path / "out")
    assert done.notes and "PR #25794" in (tmp_path / "out" / "launch.sh").read_text()


def test_gamma_rule_and_override(eagle3_folder, target8, tmp_path):
    folder, _ = eagle3_folder
    done = export_head(str(folder), "vllm", tmp_path / "a")
    assert done.gamma == best_gamma(sum(ALPHAS) / 3, ASSUMED_COST_RATIO, MAX_GAMMA)[0] and "best_gamma" in done.gamma_rule
    assert export_head(str(folder), "vllm", tmp_path / "b", gamma_arg=5).gamma == 5
    save_eagle3(tmp_path / "bare", random_eagle3_head(target8), target8, history=False)
    with pytest.raises(SpecdecError, match="--gamma"):
        export_head(str(tmp_path / "bare"), "vllm", tmp_path / "c")


def test_non_empty_out_needs_force(eagle3_folder, tmp_path):
    folder, _ = eagle3_folder
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    with pytest.raises(SpecdecError, match="--force"):
        export_head(str(folder), "vllm", tmp_path / "out")
    export_head(str(folder), "vllm", tmp_path / "out", force=True)
    assert (tmp_path / "out" / "model.safetensors").is_file()


# ---- the command line ----

def test_cli_writes_the_folder(eagle3_folder, tmp_path, capsys):
    folder, _ = eagle3_folder
    code = main(["export", str(folder), "--format", "sglang", "--out", str(tmp_path / "out"), "--gamma", "3"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"config.json", "model.safetensors", "launch.sh"}
    assert "γ = 3" in out


@pytest.mark.parametrize("argv,code,message", [
    (["export", "/no/such/head", "--format", "vllm", "--out", "X"], 1, "neither a head folder"),
    (["export", "eagle3", "--format", "tgi", "--out", "X"], 2, "invalid choice"),
])
def test_cli_bad_input_is_one_line(capsys, tmp_path, argv, code, message):
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and message in err and err.strip().count("\n") == 0
