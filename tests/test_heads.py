"""Heads and their training on tiny models: batched self-distillation equals one-by-one decoding,
the unrolled training chain equals drafting step by step, train → save → load → generate (greedy
output equal to plain decoding), a stopped training resumes to the same weights, a trained folder holds
the result only (no checkpoints), bad heads are refused."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from specdec.drafters import build_drafters
from specdec.decode.engine import Engine, GenerationConfig
from specdec.errors import ConfigError, SpecdecError
from specdec.heads.eagle import EagleConfig, EagleHead
from specdec.runtime.kv_cache import StaticKVCache
from specdec.runtime.llama import Segment, cache_attention_mask
from specdec.train.distill import distill, generate, load_sequences
from specdec.train.eagle import train_eagle
from specdec.train.loop import (
    CHECKPOINT_STATE,
    CHECKPOINT_WEIGHTS,
    default_checkpoint_dir,
)
from specdec.train.unroll import GrowingCache, unrolled_predictions
from tolerances import both_kept_in_float16, kept_in_float16, max_difference, round_off


def word_prompts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"t{rng.randrange(2, 64)}" for _ in range(rng.randint(3, 12))) for _ in range(count)]


def test_batched_generation_equals_one_by_one(tiny_target):
    """Rows of different lengths, joining and leaving, decode exactly as alone; features equal a plain
    pass's (final and the inputs of the aux layers); a sampled answer is the same whatever is beside it."""
    prompts = {0: [5, 9, 12], 1: [7, 30, 5, 9, 12, 7, 8, 3, 44], 2: [2], 3: [8, 8, 8, 8, 8], 4: [3, 4]}
    net = tiny_target.net
    eos = set(tiny_target.eos_token_ids)
    greedy = generate(net, prompts, 12, eos, batch_size=2, aux_layers=(0, 1))
    for i, prompt in prompts.items():
        seq = greedy[i]
        alone = Engine(tiny_target).generate(prompt, GenerationConfig(max_new_tokens=12))
        assert seq.tokens == prompt + alone.token_ids and seq.answer_start == len(prompt)
        _, hidden, aux = net.forward_segments(torch.tensor(seq.tokens), [Segment(net.new_cache(64), len(seq.tokens))],
                                              aux_layers=(0, 1))
        assert seq.features.shape == (len(seq.tokens), net.config.hidden_size)
        layers = (max(net.config.hidden_size, net.config.intermediate_size),) * net.config.num_layers
        # stored in float16 (within half a float16 step of each value) from a float32 pass in another order
        assert kept_in_float16(seq.features, hidden, *layers)
        assert kept_in_float16(seq.aux_features, torch.cat((aux[0], aux[1]), -1), *layers)
        assert torch.equal(aux[0], net.embed(torch.tensor(seq.tokens)))  # the input of layer 0: the embeddings
    temperatures = dict.fromkeys(prompts, 1.0)
    sampled = [generate(net, prompts, 12, eos, batch_size=b, temperatures=temperatures, seed=3) for b in (1, 4)]
    assert all(sampled[0][i].tokens == sampled[1][i].tokens for i in prompts)
    other_seed = generate(net, prompts, 12, eos, batch_size=4, temperatures=temperatures, seed=4)
    assert any(other_seed[i].tokens != sampled[0][i].tokens for i in prompts)  # the control: the seed matters


def test_unrolled_chain_equals_drafting_step_by_step():
    """Block d of the training pass at t must be exactly the head's d-th draft after true pairs ≤ t − d."""
    torch.manual_seed(0)
    config = EagleConfig(hidden_size=32, intermediate_size=64, num_heads=4, num_kv_heads=2, head_dim=8,
                         rms_norm_eps=1e-5, rope_theta=10000.0, vocab_size=50, draft_vocab=50)
    head = EagleHead(config).eval()
    features, embeds = torch.randn(1, 10, 32), torch.randn(1, 10, 32)
    with torch.no_grad():
        blocks = unrolled_predictions(head, features, embeds, depth=3)
        assert_blocks_equal_drafting(head, blocks, features, embeds, starts=(0, 4, 6))
        # the negative control: a block that saw the future (plain causal attention) differs, past the bound
        wrong = head(blocks[0][:, :-1], embeds[:, 1:], torch.arange(1, 10)[None], GrowingCache(), None, True)
        assert max_difference(wrong[0, 5], blocks[1][0, 6]) > round_off(blocks[1][0, 6], *head_sums(head, 1))


def head_sums(head, depth: int) -> tuple[int, ...]:
    """The longest float32 sums behind a head's block `depth` (its depth + 1 steps): per step, its input
    projection's (EAGLE's fuse, EAGLE-3's fc) and its layer's (q/k/v over [embeds, hidden] or the MLP's
    down projection); at most, as EAGLE-3's later steps skip fc."""
    c = head.config
    projection = (head.fuse if hasattr(head, "fuse") else head.fc).in_features
    return (projection, max(2 * c.hidden_size, c.intermediate_size)) * (depth + 1)


def assert_blocks_equal_drafting(head, blocks, features, embeds, starts) -> None:
    """Block d of the unrolled pass at t = start + d equals the head's d-th step when drafting one
    step at a time through its own cache after the true pairs 0..start (features [1, T, ...], embeds
    [1, T, hidden])."""
    for start in starts:
        cache = StaticKVCache(1, head.config.num_kv_heads, head.config.head_dim, 32)

        def feed(f, e, position):
            past, n = cache.length, f.shape[0]
            causal = past == 0 and n > 1
            mask = None if causal else cache_attention_mask(past, n, None, "cpu")
            out = head(f[None], e[None], torch.arange(position, position + n)[None], cache, mask, causal)
            cache.advance(n)
            return out[0, -1]

        # the same float32 head in two orders (one pass, or step by step): round-off of |features| through its sums
        predicted = feed(features[0, : start + 1], embeds[0, : start + 1], 0)  # true pairs 0..start
        assert max_difference(predicted, blocks[0][0, start]) <= round_off(blocks[0][0, start], *head_sums(head, 0))
        for d in range(1, len(blocks)):
            t = start + d
            predicted = feed(predicted[None], embeds[0, t : t + 1], t)
            assert max_difference(predicted, blocks[d][0, t]) <= round_off(blocks[d][0, t], *head_sums(head, d))


@pytest.fixture(scope="module")
def tiny_data(tiny_target, tmp_path_factory):
    folder = tmp_path_factory.mktemp("distill")
    meta = distill(tiny_target, word_prompts(40), folder, max_new_tokens=24, batch_size=8, shard_size=16)
    assert meta["sequences"] == meta["generated_this_run"] == 40
    assert len(list(folder.glob("shard-*.safetensors"))) == 3
    return folder


def test_distillation_resumes_and_refuses_other_settings(tiny_target, tiny_data):
    before = load_sequences(tiny_data)
    meta = distill(tiny_target, word_prompts(40), tiny_data, max_new_tokens=24, batch_size=8, shard_size=16)
    assert meta["generated_this_run"] == 0 and len(load_sequences(tiny_data)) == 40  # nothing regenerated
    assert [s.tokens for s in load_sequences(tiny_data)] == [s.tokens for s in before]
    with pytest.raises(SpecdecError, match="other settings"):
        distill(tiny_target, word_prompts(40), tiny_data, max_new_tokens=30, batch_size=8, shard_size=16)


def test_train_save_load_generate(tiny_target, tiny_data, tmp_path):
    info = train_eagle(tiny_target, tiny_data, tmp_path / "head", draft_vocab=48, depth=2, epochs=3,
                       batch_tokens=256, lr=3e-3, log=lambda *_: None)
    meta = json.loads((tmp_path / "head" / "head.json").read_text())
    assert meta["kind"] == "eagle" and meta["config"]["draft_vocab"] == 48 and len(meta["history"]) == 3
    first, last = info["history"][0], info["history"][-1]
    assert last["loss"] < first["loss"]  # it learned something on held-out sequences
    assert_greedy_equal(tiny_target, build_drafters(f"eagle:{tmp_path / 'head'}", tiny_target))
    assert_greedy_equal(tiny_target, build_drafters(f"eagle-tree:{tmp_path / 'head'}", tiny_target))


def assert_greedy_equal(target, drafter) -> None:
    """A trained drafter's greedy output equals plain decoding's, and some of its drafts were accepted."""
    prompt = target.tokenizer.encode(word_prompts(1, seed=5)[0])
    config = GenerationConfig(max_new_tokens=40, gamma=3, ignore_eos=True)
    spec = Engine(target, drafter).generate(prompt, config)
    assert spec.token_ids == Engine(target).generate(prompt, config).token_ids
    assert spec.stats.accepted > 0


def test_medusa_train_save_load_generate(tiny_target, tiny_data, tmp_path):
    from specdec.train.medusa import train_medusa

    info = train_medusa(tiny_target, tiny_data, tmp_path / "medusa", num_heads=3, draft_vocab=48, epochs=3,
                        batch_tokens=256, lr=3e-3, log=lambda *_: None)
    first, last = info["history"][0], info["history"][-1]
    assert len(last["top1_per_head"]) == 3 and last["chain_mat"] >= 1.0
    assert sum(last["top1_per_head"]) >= sum(first["top1_per_head"])
    [drafter] = build_drafters(f"medusa:{tmp_path / 'medusa'}", tiny_target)  # the default tree, cut to 3 deep
    assert drafter.max_nodes == 14
    assert_greedy_equal(tiny_target, drafter)


def test_draft_model_starts_as_the_cut_target(tiny_target, tiny_folder):
    """The draft's start is the target's first layer with its final norm and LM head (the early-exit
    drafter's model), checked against transformers' own full model; more layers than the target has
    are refused."""
    from transformers import AutoModelForCausalLM

    from specdec.train.draft import truncated_target

    ids = torch.tensor([[5, 9, 12, 7, 30, 2, 8]])
    full = AutoModelForCausalLM.from_pretrained(str(tiny_folder)).float().eval()
    cut = truncated_target(tiny_target, 1).eval()
    with torch.no_grad():
        first_layer = full(ids, output_hidden_states=True).hidden_states[1]  # [1, 7, hidden], before the norm
        expected = full.lm_head(full.model.norm(first_layer))
        c = tiny_target.net.config
        sums = (max(c.hidden_size, c.intermediate_size), c.hidden_size)  # one layer's longest sum, the LM head's
        assert max_difference(cut(ids).logits, expected) <= round_off(expected, *sums)  # float32 round-off of |logits|
        assert max_difference(cut(ids).logits, full(ids).logits) > round_off(expected, *sums)  # the control: not the whole model
    assert [n for n, p in cut.named_parameters() if p.requires_grad and "embed" in n] == []  # shared, frozen
    with pytest.raises(ConfigError, match="--layers must be between 1 and 1"):
        truncated_target(tiny_target, 2)


def test_draft_model_distils_saves_loads_generates(tiny_target, tiny_data, tmp_path):
    """Distillation lowers the held-out KL and raises the acceptance from the cut start; the folder
    loads as `draft:PATH` (the lean runtime) and its greedy output equals plain decoding."""
    from specdec.train.draft import train_draft

    info = train_draft(tiny_target, tiny_data, tmp_path / "draft", layers=1, epochs=3, lr=3e-3, batch_tokens=256,
                       log=lambda *_: None)
    before, after = info["before"], info["history"][-1]
    assert after["kl"] < before["kl"] and after["alpha_t1"] > before["alpha_t1"]
    assert json.loads((tmp_path / "draft" / "training.json").read_text())["layers"] == 1
    assert sorted(p.name for p in (tmp_path / "draft").glob("*.safetensors")) == ["model.safetensors"]
    model_folder = {p.name for p in (tmp_path / "draft").iterdir()}  # a model folder with the target's tokenizer files
    assert model_folder == {p.name for p in Path(tiny_target.folder).iterdir()} | {"training.json"}  # no checkpoints
    assert not default_checkpoint_dir(tmp_path / "draft").exists()  # deleted once the model folder is written
    assert_greedy_equal(tiny_target, build_drafters(f"draft:{tmp_path / 'draft'}", tiny_target))


def test_a_stopped_training_resumes_to_the_same_weights(tiny_target, tiny_data, tmp_path):
    settings = dict(draft_vocab=48, depth=2, epochs=2, batch_tokens=256, noise=0.0, checkpoint_every=3, log=lambda *_: None)
    train_eagle(tiny_target, tiny_data, tmp_path / "straight", **settings)

    class Stop(Exception):
        pass

    def stop_at_seven(step, total, loss):
        if step == 7:
            raise Stop

    with pytest.raises(Stop):
        train_eagle(tiny_target, tiny_data, tmp_path / "stopped", progress=stop_at_seven, **settings)
    checkpoints = default_checkpoint_dir(tmp_path / "stopped")  # kept for the resumption, outside the output folder
    assert {p.name for p in checkpoints.iterdir()} == {CHECKPOINT_WEIGHTS, CHECKPOINT_STATE}
    assert not any((tmp_path / "stopped").iterdir())
    logged = []
    train_eagle(tiny_target, tiny_data, tmp_path / "stopped", **{**settings, "log": logged.append})
    assert logged[0].startswith("resuming at step 6")  # the last checkpoint before the stop
    assert not checkpoints.exists()  # the head is written: the checkpoints are gone
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "straight" / "head.safetensors"))
    b = load_file(str(tmp_path / "stopped" / "head.safetensors"))
    # the same float32 steps in the same order after the resumption: the same bits (as for EAGLE-3 below)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_trained_head_folder_holds_the_head_only(tiny_folder, tmp_path, capsys):
    """`specdec train eagle --out DIR` leaves the head's files in DIR (its weights, its JSON and its
    target's probe features); the checkpoints it kept
    elsewhere during training (the folder it printed) are deleted once the head is written."""
    from specdec.cli import main

    out = tmp_path / "head"
    code = main(["train", "eagle", "--model", str(tiny_folder), "--data", str(tmp_path / "data"), "--out", str(out),
                 "--prompts", "8", "--max-new-tokens", "8", "--batch-size", "8", "--draft-vocab", "48", "--depth", "2",
                 "--epochs", "1"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert sorted(p.name for p in out.iterdir()) == ["head.json", "head.safetensors", "target_probe.safetensors"]
    checkpoints = default_checkpoint_dir(out)
    assert f"checkpoints: {checkpoints} (" in printed
    assert not checkpoints.exists()
    custom = tmp_path / "my-checkpoints"
    assert main(["train", "eagle", "--model", str(tiny_folder), "--data", str(tmp_path / "data"), "--out",
                 str(tmp_path / "head2"), "--checkpoint-dir", str(custom), "--prompts", "8", "--max-new-tokens", "8",
                 "--batch-size", "8", "--draft-vocab", "48", "--depth", "2", "--epochs", "1"]) == 0
    assert f"checkpoints: {custom} (" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "head2").iterdir()) == ["head.json", "head.safetensors", "target_probe.safetensors"]
    assert not custom.exists()


def test_bad_heads_are_refused(tiny_target, tmp_path):
    with pytest.raises(ConfigError, match="not a trained head"):
        build_drafters(f"eagle:{tmp_path}", tiny_target)
    (tmp_path / "head.json").write_text(json.dumps({"kind": "medusa", "config": {}}))
    (tmp_path / "head.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="'medusa' head, not 'eagle'"):
        build_drafters(f"eagle:{tmp_path}", tiny_target)
    config = {**EagleConfig.for_target(tiny_target.net.config, 10).to_dict(), "hidden_size": 99}
    (tmp_path / "head.json").write_text(json.dumps({"kind": "eagle", "config": config, "target": "other"}))
    with pytest.raises(ConfigError, match="trained for a model"):
        build_drafters(f"eagle:{tmp_path}", tiny_target)
    config["hidden_size"] = tiny_target.net.config.hidden_size
    (tmp_path / "head.json").write_text(json.dumps({"kind": "eagle", "config": config}))
    with pytest.raises(ConfigError, match="not a readable safetensors file"):
        build_drafters(f"eagle:{tmp_path}", tiny_target)
    with pytest.raises(ConfigError, match="no shipped eagle head fits"):
        build_drafters("eagle", tiny_target)


def test_eagle_tree_leaves_out_tokens_the_sampling_transform_cuts(tiny_target):
    """Under top-k = 2 only two tokens have q > 0 at each node: log q is −inf elsewhere and the tree
    gives every node at most those two children, though it asks for four (with log q clamped to 1e-30
    it took all four, wasting two nodes on tokens that can never be accepted). Seen in the trees of a
    sampled run's trace; without top-k the same drafter does give a node four children."""
    from collections import Counter

    from random_heads import random_eagle_head
    from specdec.drafters.eagle import EagleDrafter
    from specdec.decode.engine import Engine, GenerationConfig
    from specdec.sampling import SamplingParams

    drafter = EagleDrafter(tiny_target, random_eagle_head(tiny_target), name="eagle-tree", tree_budget=16, top_k=4)

    def most_children(top_k: int) -> int:
        config = GenerationConfig(max_new_tokens=30, gamma=3, ignore_eos=True, trace=True,
                                  sampling=SamplingParams(temperature=1.0, top_k=top_k, seed=0))
        trees = [r.tree for r in Engine(tiny_target, drafter).generate([5, 9, 12, 7, 5, 9], config).rounds if r.tree]
        assert trees
        return max(count for tree in trees for count in Counter(tree.parents).values())

    assert most_children(2) == 2
    assert most_children(0) == 4  # the control: the bound is the transform's, not the tree's


def test_eagle3_unrolled_chain_equals_drafting_step_by_step(tiny_target):
    """EAGLE-3's training-time test: block 0 reads the fused aux features, block d the head's own
    output; block d at t must be exactly the drafter's d-th step after true pairs ≤ t − d."""
    from random_heads import small_eagle3_head

    head = small_eagle3_head(tiny_target)
    hidden = tiny_target.net.config.hidden_size
    torch.manual_seed(1)
    aux, embeds = torch.randn(1, 10, 2 * hidden), torch.randn(1, 10, hidden)
    with torch.no_grad():
        blocks = unrolled_predictions(head, aux, embeds, depth=3)
        assert_blocks_equal_drafting(head, blocks, aux, embeds, starts=(0, 5))
        # the negative control: feeding block d the target's features again (EAGLE-1's training) differs, past the bound
        wrong = head(aux, embeds, torch.arange(10)[None], GrowingCache(), None, True)
        assert max_difference(wrong[0, 6], blocks[1][0, 6]) > round_off(blocks[1][0, 6], *head_sums(head, 1))


@pytest.fixture(scope="module")
def tiny_aux_data(tiny_target, tmp_path_factory):
    """Greedy and sampled answers with the inputs of both tiny layers (what EAGLE-3 reads)."""
    folder = tmp_path_factory.mktemp("distill-aux")
    meta = distill(tiny_target, word_prompts(40), folder, max_new_tokens=24, batch_size=8, shard_size=16,
                   temperatures=(0.0, 1.0), aux_layers=(0, 1))
    assert meta["sequences"] == 40 and meta["aux_layers"] == [0, 1]
    return folder


def test_eagle3_train_save_load_generate(tiny_target, tiny_aux_data, tmp_path):
    from specdec.train.eagle3 import train_eagle3

    info = train_eagle3(tiny_target, tiny_aux_data, tmp_path / "head", draft_vocab=48, depth=2, epochs=3,
                        batch_tokens=256, lr=3e-3, validation_share=0.1, log=lambda *_: None)
    meta = json.loads((tmp_path / "head" / "head.json").read_text())
    assert meta["kind"] == "eagle3" and meta["config"]["aux_layers"] == [0, 1] and len(meta["history"]) == 3
    first, last = info["history"][0], info["history"][-1]
    assert last["loss"] < first["loss"]  # it learned something on held-out sequences
    assert len(last["alpha_t1_per_depth"]) == 2 and all(0 <= a <= 1 for a in last["alpha_t1_per_depth"])
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "head" / "head.safetensors"))
    d2t, t2d = weights["d2t"], weights["t2d"]
    vocab = torch.arange(len(d2t)) + d2t  # target id = draft id + d2t[draft id]
    assert len(d2t) == 48 and int(t2d.sum()) == 48 and bool(t2d[vocab].all())
    assert {k.split(".")[0] for k in weights} == {"fc", "midlayer", "norm", "lm_head", "d2t", "t2d"}
    assert_greedy_equal(tiny_target, build_drafters(f"eagle3:{tmp_path / 'head'}", tiny_target))
    assert_greedy_equal(tiny_target, build_drafters(f"eagle3-chain:{tmp_path / 'head'}", tiny_target))


def test_eagle3_needs_aux_features(tiny_target, tiny_data, tmp_path):
    from specdec.train.eagle3 import train_eagle3

    with pytest.raises(SpecdecError, match="no aux-layer features"):
        train_eagle3(tiny_target, tiny_data, tmp_path / "head", draft_vocab=48, epochs=1, log=lambda *_: None)


class Stop(Exception):
    pass


def test_a_stopped_distillation_resumes_to_the_same_data(tiny_target, tmp_path):
    """Stopped once its first shard is written (sampled and greedy answers, aux features; other answers
    in flight are lost), the run resumes and
    gives the data an uninterrupted run gives: each prompt's answer comes from its own random stream."""
    settings = dict(max_new_tokens=16, batch_size=4, shard_size=8, temperatures=(0.0, 1.0), aux_layers=(0, 1), seed=5)
    distill(tiny_target, word_prompts(20), tmp_path / "straight", **settings)

    def stop_after_the_first_shard(done, total, tokens, seconds):
        if (tmp_path / "stopped" / "shard-00000.safetensors").exists():
            raise Stop

    with pytest.raises(Stop):
        distill(tiny_target, word_prompts(20), tmp_path / "stopped", progress=stop_after_the_first_shard, **settings)
    assert len(list((tmp_path / "stopped").glob("shard-*.safetensors"))) == 1  # the first 8 prompts
    meta = distill(tiny_target, word_prompts(20), tmp_path / "stopped", **settings)
    assert meta["generated_this_run"] == 12
    straight, resumed = load_sequences(tmp_path / "straight"), load_sequences(tmp_path / "stopped")
    assert [s.tokens for s in straight] == [s.tokens for s in resumed]
    assert {s.temperature for s in resumed} == {0.0, 1.0}
    # features agree to float16 storage (a float32 pass's linears may round differently with other rows beside)
    c = tiny_target.net.config
    layers = (max(c.hidden_size, c.intermediate_size),) * c.num_layers
    assert all(both_kept_in_float16(a.aux_features, b.aux_features, *layers) for a, b in zip(straight, resumed))


def test_a_stopped_eagle3_training_resumes_to_the_same_weights(tiny_target, tiny_aux_data, tmp_path):
    from safetensors.torch import load_file

    from specdec.train.eagle3 import train_eagle3

    settings = dict(draft_vocab=48, depth=2, epochs=2, batch_tokens=256, checkpoint_every=3, validation_share=0.1,
                    log=lambda *_: None)
    train_eagle3(tiny_target, tiny_aux_data, tmp_path / "straight", **settings)

    def stop_at_seven(step, total, loss):
        if step == 7:
            raise Stop

    with pytest.raises(Stop):
        train_eagle3(tiny_target, tiny_aux_data, tmp_path / "stopped", progress=stop_at_seven, **settings)
    train_eagle3(tiny_target, tiny_aux_data, tmp_path / "stopped", **settings)
    a = load_file(str(tmp_path / "straight" / "head.safetensors"))
    b = load_file(str(tmp_path / "stopped" / "head.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("tree", [False, True])
def test_an_eagle3_drafter_that_sat_out_rounds_drafts_as_if_fed_every_round(tiny_target, tree):
    """A proposal after rounds the drafter sat out first feeds every committed pair it had not read, in
    one feed that computes draft logits for its last pair only (a probe after a long rest reads
    hundreds). It proposes what the same drafter proposing every round proposes: a chain the same
    tokens and q (sampled, T = 1), a tree the same nodes. The control: the same catch-up with the
    feature of the last unread pair (whose prediction the draft starts from) changed proposes a
    different q."""
    from random_heads import small_eagle3_head

    from specdec.drafters.eagle import EagleDrafter
    from specdec.sampling import SamplingParams

    drafter = EagleDrafter(tiny_target, small_eagle3_head(tiny_target), tree_budget=8 if tree else 0, top_k=2)
    rng = torch.Generator().manual_seed(3)
    tokens = torch.randint(2, tiny_target.vocab_size, (30,), generator=rng).tolist()
    features = torch.randn(len(tokens), drafter.feature_size, generator=rng) * 3  # [30, feature_size]
    params = SamplingParams(temperature=1.0)
    prompt = 6

    def last_proposal(every_round: bool, changed: int | None = None):
        request = drafter.for_request()
        request.begin(tokens[:prompt], 64)
        request.accept_features(features[:prompt - 1])
        for length in range(prompt, len(tokens)):
            if every_round:
                request.propose(tokens[:length], 3, params, torch.Generator().manual_seed(length))
            row = features[length - 1:length].clone()
            if length - 1 == changed:
                row += 1.0
            request.accept_features(row)
        assert request.catch_up_tokens(tokens) == (0 if every_round else len(tokens) - 2)  # all but the last pair
        return request.propose(tokens, 3, params, torch.Generator().manual_seed(99))

    fed, caught_up = last_proposal(True), last_proposal(False)
    assert caught_up.tokens == fed.tokens and caught_up.parents == fed.parents
    if not tree:
        # probabilities (≤ 1), from float32 head logits of rows fed in one pass or one at a time: 1e-5 ≈ 84 eps of 1
        assert torch.allclose(caught_up.q, fed.q, rtol=0, atol=1e-5)
        changed = last_proposal(False, changed=len(tokens) - 2)
        assert not torch.allclose(changed.q, fed.q, atol=1e-3)  # the control


def test_a_head_fits_the_targets_whose_features_it_reads(tiny_target, tiny_folder, tmp_path):
    """A head saved with its target keeps that target's features on the probe; it fits the same model
    loaded again (cosine 1) and not a model of the same shape with other weights (seed 1: far below
    PROBE_FIT, the control). An EAGLE-3 head's probe reads the inputs of its aux layers; a head saved
    without its target keeps no probe and fits nothing (an explicit path still loads it)."""
    from conftest import make_tiny_model
    from random_heads import random_eagle_head

    from specdec.heads.files import PROBE, PROBE_FIT, PROBE_TOKENS, fits, probe_fit, save_head
    from specdec.heads.eagle3 import Eagle3Config
    from specdec.runtime import load_model

    head = random_eagle_head(tiny_target)
    save_head(tmp_path / "eagle", "eagle", head.config.to_dict(), head.state_dict(), {}, tiny_target.net)
    again = load_model(str(tiny_folder))
    assert probe_fit(tmp_path / "eagle", again) == pytest.approx(1.0, abs=1e-6) and fits(tmp_path / "eagle", again)
    other = load_model(str(make_tiny_model(tmp_path / "other", seed=1)))
    assert other.net.config.hidden_size == tiny_target.net.config.hidden_size
    assert probe_fit(tmp_path / "eagle", other) < 0.5 * PROBE_FIT and not fits(tmp_path / "eagle", other)

    config = Eagle3Config.for_target(tiny_target.net.config, 40, (0, 1)).to_dict()
    save_head(tmp_path / "eagle3", "eagle3", config, {}, {}, tiny_target.net)
    from safetensors.torch import load_file

    features = load_file(str(tmp_path / "eagle3" / PROBE))["features"]
    assert features.shape == (PROBE_TOKENS, 2 * tiny_target.net.config.hidden_size)
    assert fits(tmp_path / "eagle3", again) and not fits(tmp_path / "eagle3", other)

    save_head(tmp_path / "bare", "eagle", head.config.to_dict(), head.state_dict(), {})
    assert not (tmp_path / "bare" / PROBE).exists()
    assert probe_fit(tmp_path / "bare", tiny_target) is None and not fits(tmp_path / "bare", tiny_target)
    assert build_drafters(f"eagle:{tmp_path / 'bare'}", tiny_target)[0].name == f"eagle:{tmp_path / 'bare'}"
