"""Bad input to text models: each mistake is a named error that gives the value and the fix,
with the same type and message on every backend."""

from __future__ import annotations

import numpy as np
import pytest

from multigpu.contract.protocol import Device
from multigpu.errors import InputError, ModelError, ParamsError
from multigpu.models import Input, Model, MultiHeadAttention, Node, RunContext, bert, gpt
from multigpu.models.checkpoints import load_safetensors, params_from_tensors
from multigpu.models.inputs import check_tokens
from multigpu.parallel import DataParallel

DEV = Device("cpu", 0)
TINY = dict(vocab_size=50, hidden=16, layers=1, heads=4, ffn=32, max_positions=12, seq_len=8)


def _run(be, model, ids, mask=None):
    feeds = {"input_ids": be.from_numpy(ids, DEV)}
    if mask is not None:
        feeds["attention_mask"] = be.from_numpy(mask, DEV)
    params = [be.from_numpy(p, DEV) for p in model.init_params()]
    return model.run(be, params, feeds, context=RunContext(devices=[DEV]))


def _message(be, ref, model, ids, mask=None) -> str:
    """The InputError the run raises on ``be``, checked to be the reference's too."""
    with pytest.raises(InputError) as got:
        _run(be, model, ids, mask)
    with pytest.raises(InputError) as want:
        _run(ref, model, ids, mask)
    assert str(got.value) == str(want.value)
    return str(got.value)


IDS = np.arange(8, dtype=np.int64).reshape(1, 8)


def test_a_token_id_outside_the_vocabulary(be, ref):
    bad = IDS.copy()
    bad[0, 3] = 50
    with pytest.raises(InputError, match=r"token id 50 at \(0, 3\) is outside the vocabulary of bert \(ids 0..49\)"):
        check_tokens(bert(**TINY, mask=False), bad)
    msg = _message(be, ref, bert(**TINY, mask=False), bad)
    assert "50" in msg and "49" in msg
    bad[0, 3] = -1  # below the table: no framework's lookup may wrap or clamp it
    msg = _message(be, ref, bert(**TINY, mask=False), bad)
    assert msg.startswith("embedding id -1 is out of range: a table of 50 rows takes ids 0..49")


def test_a_sequence_longer_than_the_position_table(be, ref):
    model = bert(**TINY, mask=False)
    long = np.zeros((1, 13), np.int64)
    msg = _message(be, ref, model, long)
    assert msg.startswith("a sequence of 13 tokens is longer than the position table (12 positions)")
    assert "truncate the input to 12 tokens" in msg
    with pytest.raises(InputError, match="a sequence of 13 tokens is longer"):
        check_tokens(model, long)
    with pytest.raises(ModelError, match=r"seq_len=13 is longer than the position table \(max_positions=12\)"):
        bert(**{**TINY, "seq_len": 13})


def test_a_mask_whose_shape_does_not_match_the_ids(be, ref):
    model = bert(**TINY)
    mask = np.ones((1, 7), np.int64)
    msg = _message(be, ref, model, IDS, mask)
    assert msg.startswith("attention_mask has shape (1, 7) but input_ids (1, 8); pass one 0/1 per token")
    with pytest.raises(InputError, match=r"attention_mask has shape \(1, 7\) but input_ids \(1, 8\)"):
        check_tokens(model, IDS, mask)
    with pytest.raises(InputError, match="other than 0 and 1"):
        check_tokens(model, IDS, np.full((1, 8), 2))


def test_a_head_count_that_does_not_divide_the_hidden_size():
    with pytest.raises(ModelError, match=r"bert 'bert': 5 heads do not divide the hidden size 16; choose heads"):
        bert(**{**TINY, "heads": 5})
    with pytest.raises(ModelError, match=r"gpt 'gpt': 3 heads do not divide the hidden size 16"):
        gpt(vocab_size=9, hidden=16, layers=1, heads=3)
    with pytest.raises(
        ModelError, match=r"node 'att' .*: MultiHeadAttention: 3 heads do not divide the hidden size 10"
    ):
        Model.from_nodes([Node("att", MultiHeadAttention(3), ("x",))], inputs=[Input("x", (4, 10))])


def test_float_ids(be, ref):
    model = bert(**TINY, mask=False)
    msg = _message(be, ref, model, IDS.astype(np.float32))
    assert (
        msg
        == "input_ids has dtype float32; token ids must be integers: pass ids.astype('int64') (a tokenizer's input_ids)"
    )
    with pytest.raises(InputError, match=r"input_ids have dtype float64; token ids must be integers"):
        check_tokens(model, IDS.astype(np.float64))


def test_weights_that_lack_a_tensor_or_have_one_of_the_wrong_shape(tmp_path):
    model = bert(**TINY)
    tensors = {k: (p.T if t else p) for k, p, t in zip(model.param_keys(), model.init_params(), model.torch_layouts())}
    np.testing.assert_array_equal(params_from_tensors(model, tensors)[5], model.init_params()[5])
    del tensors["encoder.layer.0.attention.self.key.bias"]
    tensors["embeddings.LayerNorm.weight"] = np.ones(15, np.float32)
    with pytest.raises(ParamsError) as err:
        params_from_tensors(model, tensors)
    msg = str(err.value)
    assert "lacks 1 tensor(s): encoder.layer.0.attention.self.key.bias" in msg
    assert "has 1 of the wrong shape: embeddings.LayerNorm.weight (15,) (needs (16,))" in msg
    st = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "model.safetensors"
    st.save_file(tensors, str(path))
    with pytest.raises(ParamsError, match=r"the weights in model.safetensors do not fit bert: it lacks 1 tensor"):
        load_safetensors(model, path)
    with pytest.raises(ParamsError, match="does not exist"):
        load_safetensors(model, tmp_path / "absent.safetensors")


def test_a_gpt_training_batch_refuses_bad_ids_the_same_on_every_backend(backend_name):
    """The training entry point (DataParallel.train_batch) names each bad batch as the NumPy reference does."""
    model = gpt(vocab_size=20, hidden=16, layers=1, heads=4, max_positions=8, seq_len=8)
    ids = np.arange(16, dtype=np.int64).reshape(2, 8)
    labels = np.roll(ids, -1, axis=1)
    bad = {
        "token id 20 at (1, 2) is outside the vocabulary of gpt (ids 0..19)": (np.where(ids == 10, 20, ids), labels),
        "token id -3 at (0, 4) is outside the vocabulary of gpt (ids 0..19)": (np.where(ids == 4, -3, ids), labels),
        "a sequence of 9 tokens is longer than the position table (8 positions)": (
            np.zeros((2, 9), np.int64),
            np.zeros((2, 9), np.int64),
        ),
        "input_ids have dtype float32; token ids must be integers": (ids.astype(np.float32), labels),
    }
    messages = {}
    for name in (backend_name, "numpy"):
        dp = DataParallel(model, backend=name, devices=1, optimizer="adamw", lr=1e-3)
        for start, (x, y) in bad.items():
            with pytest.raises(InputError) as err:
                dp.train_batch(x, y)
            assert str(err.value).startswith(start)
            messages.setdefault(start, set()).add(str(err.value))
        assert dp.steps == 0  # nothing was trained on a refused batch
    assert all(len(m) == 1 for m in messages.values())  # the same message on this backend and the reference
