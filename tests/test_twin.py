"""The dear twin (runtime/gguf_twin.py): the default model with MLPs widened by zero blocks gives the
default model's logits bit for bit, run as stored; one non-zero added block changes them."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
import torch

from specdec.errors import ConfigError
from specdec.runtime import load_model
from specdec.runtime.gguf_synthetic import SHAPES
from specdec.runtime.gguf_twin import TWINS, file_pass_bytes, pass_bytes, twin_width, width_for, write_twin

WIDER = 1536 + 256  # the default model's MLP (1536) and one K-quant block more: a small file, the same code


@pytest.fixture
def loaded():
    """load(path): the model of a GGUF written by the test; the user's cache keeps nothing of it (its
    tokenizer and packed weights, under a key of the file's name, size and time, are removed when the
    test ends)."""
    folders = []

    def load(path):
        model = load_model(str(path))
        folders.append(model.folder)
        return model

    yield load
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def logits_of(net, ids: list[int]) -> torch.Tensor:
    """[len(ids) + 3, V]: a prefill of `ids`, then three one-token passes (greedy), run as stored."""
    cache = net.new_cache(64)
    rows = [net.forward(torch.tensor([ids]), cache)[0]]
    for _ in range(3):
        token = int(rows[-1][-1].argmax())
        rows.append(net.forward(torch.tensor([[token]]), cache)[0])
    return torch.cat(rows)


def test_the_twin_gives_the_default_models_logits_bit_for_bit(tmp_path, default_gguf, loaded):
    twin = write_twin(tmp_path / "twin.gguf", default_gguf, WIDER)
    reader = gguf.GGUFReader(str(twin))
    assert int(reader.fields["llama.feed_forward_length"].contents()) == WIDER
    assert file_pass_bytes(reader) == file_pass_bytes(gguf.GGUFReader(str(default_gguf)), mlp=WIDER)
    ids = [1, 504, 3458, 282, 253, 1345, 28, 357, 1345, 338, 9080, 30, 378, 3458, 282]
    narrow, wide = logits_of(load_model(str(default_gguf)).net, ids), logits_of(loaded(twin).net, ids)
    assert torch.equal(narrow, wide)

    # control: the first added unit of blk.3 made live (one block of its gate and up rows, and of every
    # down row at its input, given scale and minimum 0.5 in Q4_1): its output is no longer 0 and the
    # logits move (a later load packs the edited file anew: its modification time is part of the key)
    edited = gguf.GGUFReader(str(twin), "r+")
    live = np.array([0.5, 0.5], dtype=np.float16).view(np.uint8)
    for name in ("blk.3.ffn_gate.weight", "blk.3.ffn_up.weight", "blk.3.ffn_down.weight"):
        tensor = next(t for t in edited.tensors if t.name == name)
        assert tensor.tensor_type.name == "Q4_1"
        if name.endswith("ffn_down.weight"):
            block = 1536 // 32 * 20  # the bytes of each row's first added block
            assert not tensor.data[:, block:].any()  # the added inputs are zeros
            tensor.data[:, block:block + 4] = live
        else:
            assert not tensor.data[1536:].any()  # the added rows are zeros
            tensor.data[1536, :4] = live
    edited.data.flush()
    del edited
    assert not torch.equal(narrow, logits_of(loaded(twin).net, ids))


def test_widths_match_the_models_pass_bytes(default_gguf):
    reader = gguf.GGUFReader(str(default_gguf))
    narrow = file_pass_bytes(reader)
    assert 80e6 < narrow < 110e6  # the layers' Q4_1 blocks and the Q8_0 head a pass reads: ~100 MB
    widths = {twin: twin_width(reader, twin) for twin in TWINS}
    for twin, width in widths.items():
        target = pass_bytes(SHAPES[TWINS[twin]])
        assert width % 256 == 0
        assert file_pass_bytes(reader, mlp=width - 256) < target <= file_pass_bytes(reader, mlp=width)
    assert widths["1b"] < widths["3b"] < widths["8b"]
    # Llama-3.2-1B's Q4_K_M file is 808 MB, its head (tied, Q6_K, 128,256 tokens) read every pass
    assert 0.75e9 < pass_bytes(SHAPES["llama-3.2-1b"]) < 0.85e9
    # Llama-3.1-8B's is 4.92 GB, of which the token embedding (Q4_K, 0.30 GB) is not read by a pass
    assert 4.55e9 < pass_bytes(SHAPES["llama-3.1-8b"]) < 4.7e9


def test_bad_widths_and_files_are_refused(tmp_path, default_gguf):
    with pytest.raises(ConfigError, match="multiple of 256 above the file's 1536"):
        write_twin(tmp_path / "t.gguf", default_gguf, 1536 + 100)
    with pytest.raises(ConfigError, match="multiple of 256 above the file's 1536"):
        write_twin(tmp_path / "t.gguf", default_gguf, 1280)
    reader = gguf.GGUFReader(str(default_gguf))
    with pytest.raises(ConfigError, match=r"reads \d+ MB already"):
        width_for(reader, 1000)
    with pytest.raises(ConfigError, match="unknown twin '70b'"):
        twin_width(reader, "70b")


def test_the_shipped_heads_fit_the_default_model_and_its_twin_and_auto_takes_them(tmp_path, default_gguf, loaded,
                                                                                    monkeypatch):
    """Each shipped head fits the default model and its twin (bit for bit the same features), so
    `auto` on the twin drafts with the shipped EAGLE-3 head as on the default model, and `eagle3`
    without a path finds it; where a pass reads DEAR_PASS_BYTES or more, `auto` takes the head's chain
    beside its tree (the twin here is just wider than the default model: the bound is moved between
    them, and the default model stays without the chain). Control: a file of the default model's shape
    with random weights fits none, and `auto` leaves the head out."""
    from specdec.drafters import build
    from specdec.drafters.build import auto_drafter_specs, build_drafters
    from specdec.runtime.weight_formats import weight_bytes
    from specdec.heads.shipped import SHIPPED_HEADS
    from specdec.heads.files import fits
    from specdec.runtime.gguf_synthetic import Shape, write_gguf

    heads = sorted(SHIPPED_HEADS.iterdir())
    assert [h.name for h in heads] == ["smollm2-135m-eagle", "smollm2-135m-eagle3", "smollm2-135m-medusa"]
    default = load_model(str(default_gguf))
    twin = loaded(write_twin(tmp_path / "twin.gguf", default_gguf, WIDER))
    for model in (default, twin):
        assert all(fits(head, model) for head in heads)
        assert [str(spec) for spec in auto_drafter_specs(model)] == ["suffix", "early:7", "eagle3"]
    assert [d.name for d in build_drafters("eagle3-chain", twin)] == ["eagle3-chain"]
    # the weights counted are the file's blocks as packed (a layer's parts in a list: not a third of them)
    assert 0.95 * default_gguf.stat().st_size < weight_bytes(default.net) < 1.05 * default_gguf.stat().st_size
    # where a pass reads DEAR_PASS_BYTES or more (moved here between the two files' sizes), the chain too
    monkeypatch.setattr(build, "DEAR_PASS_BYTES", (weight_bytes(default.net) + weight_bytes(twin.net)) // 2)
    assert [str(spec) for spec in auto_drafter_specs(twin)] == ["suffix", "early:7", "eagle3-chain", "eagle3"]
    assert [str(spec) for spec in auto_drafter_specs(default)] == ["suffix", "early:7", "eagle3"]

    shape = Shape("llama", 30, 576, 1536, 9, 3, rope_theta=100000.0)
    stranger = loaded(write_gguf(tmp_path / "random.gguf", shape, "Q8_0", default_gguf))
    assert not any(fits(head, stranger) for head in heads)
    assert [str(spec) for spec in auto_drafter_specs(stranger)] == ["suffix", "early:7"]
    with pytest.raises(ConfigError, match="no shipped eagle3 head fits"):
        build_drafters("eagle3", stranger)
