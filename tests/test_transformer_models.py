"""Transformer layers and text models on every backend: shapes and costs, named inputs, masks,
causality, dropout drawn in the core, gradients, and a tiny BERT against transformers' BertModel."""

from __future__ import annotations

import numpy as np
import pytest
from torchvision_models import torchvision_or_none

from multigpu.contract.protocol import Device
from multigpu.errors import ModelError
from multigpu.models import (
    GELU,
    AttentionMask,
    Dense,
    Dropout,
    Embedding,
    Input,
    LayerNorm,
    Model,
    MultiHeadAttention,
    Node,
    PositionEmbedding,
    RunContext,
    Sigmoid,
    Tanh,
    bert,
    dropout_mask,
    gpt,
)
from multigpu.models.checkpoints import params_from_tensors

DEV = Device("cpu", 0)
TINY = dict(vocab_size=50, hidden=16, layers=2, heads=4, ffn=32, max_positions=12, seq_len=8)


def tiny_bert(**kw) -> Model:
    return bert(**{**TINY, **kw})


def tiny_gpt(**kw) -> Model:
    return gpt(**{**dict(vocab_size=30, hidden=16, layers=2, heads=2, max_positions=16, seq_len=8), **kw})


def tokens(vocab: int = 50, shape: tuple[int, int] = (2, 8), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int64)


def run(be, model, params, ids, mask=None, context=None, device=DEV):
    """The model's output for numpy ``ids`` (and ``mask``) on backend ``be``, as numpy."""
    feeds = {"input_ids": be.from_numpy(ids, device)}
    if mask is not None:
        feeds["attention_mask"] = be.from_numpy(mask, device)
    tensors = [be.from_numpy(p, device) for p in params]
    context = RunContext(devices=[device]) if context is None else context
    return be.to_numpy(model.run(be, tensors, feeds, context=context)[model.output])


# -- the spec: shapes, parameters, costs ------------------------------------------------
def test_layer_shapes_parameters_and_costs():
    s, d, h = 8, 16, 4
    att = MultiHeadAttention(h)
    assert att.output_shape((s, d)) == (s, d)
    assert att.param_shapes((s, d)) == [(d, d), (d,)] * 4
    assert att.param_labels((s, d))[::2] == [
        f"{p}.weight" for p in ("self.query", "self.key", "self.value", "output.dense")
    ]
    # Four projections plus the two matrix products of attention.
    assert att.macs((s, d)) == 4 * s * d * d + 2 * s * s * d
    assert att.flops((s, d)) == 2 * att.macs((s, d)) + 4 * s * d + 5 * h * s * s
    assert Dense(7).output_shape((s, d)) == (s, 7) and Dense(7).macs((s, d)) == s * d * 7
    assert Embedding(50, d).output_shape((s,)) == (s, d) and Embedding(50, d).param_shapes((s,)) == [(50, d)]
    assert PositionEmbedding(12).param_shapes((s, d)) == [(12, d)]
    assert LayerNorm(1e-12).param_shapes((s, d)) == [(d,), (d,)]
    assert LayerNorm().flops((s, d)) == 8 * s * d
    assert [k(name=None).flops((s, d)) for k in (Tanh, Sigmoid)] == [4 * s * d] * 2
    assert GELU(True).flops((s, d)) == 8 * s * d
    assert AttentionMask().output_shape((s,)) == (1, 1, s)


def test_bert_layer_stats_price_every_node_for_the_planner():
    m = tiny_bert()
    stats = {st.name: st for st in m.layer_stats(3)}
    att = stats["encoder.layer.0.attention"]
    assert att.inputs == ("embeddings.dropout", "extended_attention_mask")
    assert att.input_shape == (8, 16) and att.output_shape == (8, 16)
    assert att.macs == 3 * (4 * 8 * 16 * 16 + 2 * 8 * 8 * 16)
    assert att.params == 4 * (16 * 16 + 16) and att.param_bytes == 4 * att.params
    assert stats["extended_attention_mask"].inputs == ("input_ids", "attention_mask")
    assert stats["embeddings.word_embeddings"].output_bytes == 3 * 8 * 16 * 4
    assert sum(st.params for st in stats.values()) == m.num_params()
    # Inputs are int64: 8 bytes per id and per mask value.
    assert m.input_bytes(3) == 2 * 3 * 8 * 8 and m.input_bytes(3, "input_ids") == 3 * 8 * 8


def test_bert_parameters_follow_transformers_names_and_init():
    m = tiny_bert()
    keys = m.param_keys()
    assert keys[:5] == [
        "embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight",
        "embeddings.token_type_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias",
    ]
    assert keys[-2:] == ["encoder.layer.1.output.LayerNorm.weight", "encoder.layer.1.output.LayerNorm.bias"]
    assert len(keys) == 5 + 2 * 16 and len(set(keys)) == len(keys)
    params = dict(zip(keys, m.init_params(seed=3)))
    assert np.std(params["encoder.layer.0.attention.self.query.weight"]) == pytest.approx(0.02, rel=0.2)
    assert not params["encoder.layer.0.attention.self.query.bias"].any()
    assert (params["embeddings.LayerNorm.weight"] == 1).all()


def test_gpt_is_pre_norm_causal_with_an_untied_head():
    m = tiny_gpt()
    by = {n.name: n for n in m.nodes}
    assert by["h.0.ln_1"].inputs == ("drop",) and by["h.0.attn"].inputs == ("h.0.ln_1",)
    assert by["h.0.add_1"].inputs == ("h.0.attn_dropout", "drop")  # the residual skips the norm
    assert by["h.0.attn"].layer.causal and by["h.0.attn"].layer.dropout == 0.1
    assert m.output == "lm_head" and m.output_shape == (8, 30)
    assert "lm_head.weight" in m.param_keys() and m.param_shapes[m.param_keys().index("lm_head.weight")] == (16, 30)
    assert m.input_names == ("input_ids",)


def test_named_inputs_are_checked_when_the_model_is_built():
    ids = Input("input_ids", (4,), "int64")
    with pytest.raises(ModelError, match=r"no node consumes the model input\(s\) \['attention_mask'\]"):
        Model.from_nodes(
            [Node("e", Embedding(5, 2), ("input_ids",))], inputs=[ids, Input("attention_mask", (4,), "int64")]
        )
    with pytest.raises(ModelError, match=r"consumes 'mask', which is neither a node nor 'input_ids'"):
        Model.from_nodes(
            [Node("e", Embedding(5, 2), ("input_ids",)), Node("m", AttentionMask(), ("input_ids", "mask"))],
            inputs=[ids],
        )
    with pytest.raises(ModelError, match="give input_shape or inputs, not both"):
        Model.from_nodes([Node("e", Embedding(5, 2), ("input_ids",))], (4,), inputs=[ids])
    with pytest.raises(ModelError, match="dtype='int32' is unknown"):
        Input("input_ids", (4,), "int32")
    with pytest.raises(ModelError, match=r"takes 2..2 inputs"):
        Model.from_nodes([Node("m", AttentionMask(), ("input_ids",))], inputs=[ids])
    with pytest.raises(ModelError, match="the attention mask has shape"):
        Model.from_nodes(
            [Node("m", AttentionMask(), ("input_ids", "attention_mask"))],
            inputs=[ids, Input("attention_mask", (5,), "int64")],
        )


def test_feeds_must_name_the_models_inputs(ref):
    m = tiny_bert()
    params = [ref.from_numpy(p, DEV) for p in m.init_params()]
    x = ref.from_numpy(tokens(), DEV)
    with pytest.raises(ModelError, match=r"the feeds lack \['attention_mask'\]"):
        m.apply(ref, [params], [{"input_ids": x}])
    with pytest.raises(ModelError, match=r"pass each replica's feeds as a dict"):
        m.apply(ref, [params], [x])
    with pytest.raises(ModelError, match=r"stage consumes \['attention_mask'\]"):
        m.run(ref, params, {"input_ids": x})


def test_constants_need_the_replicas_device(ref):
    m = tiny_gpt()
    params = [ref.from_numpy(p, DEV) for p in m.init_params()]
    with pytest.raises(ModelError, match=r"pass context=RunContext\(devices=\[device\]\)"):
        m.run(ref, params, {"input_ids": ref.from_numpy(tokens(30), DEV)})


# -- running: every backend computes the same model ----------------------------------------
def test_bert_agrees_with_the_reference_on_every_backend(be, ref):
    m = tiny_bert()
    params, ids = m.init_params(seed=1, scale=0.2), tokens()
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    want = run(ref, m, params, ids, mask)
    np.testing.assert_allclose(run(be, m, params, ids, mask), want, rtol=1e-4, atol=1e-5)


def test_padding_changes_nothing_at_the_real_tokens(be):
    m = tiny_bert()
    params, ids = m.init_params(seed=2, scale=0.2), tokens()
    short = run(be, m, params, ids[:1, :5], np.ones((1, 5), np.int64))
    padded_ids = ids[:1].copy()
    padded_ids[0, 5:] = 0
    mask = np.array([[1] * 5 + [0] * 3])
    padded = run(be, m, params, padded_ids, mask)
    np.testing.assert_allclose(padded[:, :5], short, rtol=1e-4, atol=1e-5)


def test_gpt_never_looks_ahead(be):
    m = tiny_gpt()
    params, ids = m.init_params(seed=4, scale=0.2), tokens(30)
    changed = ids.copy()
    changed[:, 5] = (ids[:, 5] + 1) % 30
    a, b = run(be, m, params, ids), run(be, m, params, changed)
    np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-5, atol=1e-6)
    assert np.abs(a[:, 5:] - b[:, 5:]).max() > 1e-3


def test_gpt_with_a_padding_mask_agrees_with_the_reference(be, ref):
    m = tiny_gpt(mask=True)
    params, ids = m.init_params(seed=5, scale=0.2), tokens(30)
    mask = np.ones_like(ids)
    mask[0, 6:] = 0
    np.testing.assert_allclose(run(be, m, params, ids, mask), run(ref, m, params, ids, mask), rtol=1e-4, atol=1e-5)


# -- dropout: drawn in the core, the same units on every backend -------------------------------
def test_dropout_masks_depend_on_seed_step_and_node_alone():
    a = dropout_mask((64, 32), 0.25, seed=7, step=3, node=5)
    assert a.dtype == np.float32 and set(np.unique(a)) <= {0.0, 1.0}
    assert abs(1 - a.mean() - 0.25) < 0.03
    assert np.array_equal(a, dropout_mask((64, 32), 0.25, seed=7, step=3, node=5))
    for other in ({"seed": 8}, {"step": 4}, {"node": 6}, {"stream": 1}):
        args = {"seed": 7, "step": 3, "node": 5, **other}
        assert not np.array_equal(a, dropout_mask((64, 32), 0.25, **args)), other
    assert dropout_mask((4, 4), 0.0, 0, 0, 0).all()
    with pytest.raises(ModelError, match=r"rate=1.0 must be in \[0, 1\)"):
        dropout_mask((2,), 1.0, 0, 0, 0)


def test_dropout_is_off_in_inference_and_deterministic_in_training(be, ref):
    m = tiny_bert(dropout=0.3, attention_dropout=0.2)
    plain = tiny_bert(dropout=0.0, attention_dropout=0.0)
    params, ids = m.init_params(seed=1, scale=0.2), tokens()
    mask = np.ones_like(ids)
    evals = run(be, m, params, ids, mask)
    np.testing.assert_allclose(evals, run(be, plain, params, ids, mask), rtol=1e-6, atol=1e-6)

    def train(backend, step):
        return run(backend, m, params, ids, mask, RunContext(training=True, seed=11, step=step, devices=[DEV]))

    first = train(be, 0)
    np.testing.assert_array_equal(first, train(be, 0))  # the same seed and step give the same run
    assert np.abs(first - train(be, 1)).max() > 1e-3  # another step drops other units
    assert np.abs(first - evals).max() > 1e-3
    np.testing.assert_allclose(first, train(ref, 0), rtol=1e-4, atol=1e-5)  # every backend drops the same units


def test_dropout_on_shards_equals_dropout_on_the_whole_batch(ref):
    layer = Dropout(0.5)
    m = Model.from_nodes(
        [Node("e", Embedding(9, 6), ("input_ids",)), Node("d", layer, ("e",))],
        inputs=[Input("input_ids", (5,), "int64")],
    )
    params = [ref.from_numpy(p, DEV) for p in m.init_params()]
    ids = tokens(9, (4, 5))
    whole = RunContext(training=True, seed=1, step=2, devices=[DEV])
    one = ref.to_numpy(m.apply(ref, [params], [{"input_ids": ref.from_numpy(ids, DEV)}], context=whole)[0])
    split = RunContext(training=True, seed=1, step=2, devices=[DEV, DEV], shards=[(0, 1), (1, 4)], batch=4)
    feeds = [{"input_ids": ref.from_numpy(ids[:1], DEV)}, {"input_ids": ref.from_numpy(ids[1:], DEV)}]
    two = [ref.to_numpy(y) for y in m.apply(ref, [params, params], feeds, context=split)]
    np.testing.assert_array_equal(np.concatenate(two), one)


def test_gradients_through_a_tiny_gpt_agree_with_the_reference(be, ref):
    m = tiny_gpt(mask=True, dropout=0.1, attention_dropout=0.1)
    params, ids = m.init_params(seed=6, scale=0.2), tokens(30)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    labels = np.roll(ids, -1, axis=1)
    labels[:, -1] = -100
    labels[mask == 0] = -100

    def grads(backend):
        feeds = [backend.from_numpy(a, DEV) for a in (ids, mask, labels)]

        def loss(ps, x, mk, y):
            ctx = RunContext(training=True, seed=3, step=1, devices=[DEV])
            logits = m.run(backend, ps, {"input_ids": x, "attention_mask": mk}, context=ctx)[m.output]
            return backend.sum(backend.cross_entropy(logits, y, -100))

        return backend.to_numpy(backend.value_and_grad(loss, [backend.from_numpy(p, DEV) for p in params], *feeds))

    got, want = grads(be), grads(ref)
    assert np.isfinite(want).all() and np.abs(want[:-1]).max() > 0
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


# -- a reference we did not write --------------------------------------------------------------
@pytest.mark.slow  # importing transformers takes 10-15 s on 2 cores; the run itself well under a second
def test_tiny_bert_equals_transformers_bert_model(be):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torchvision_or_none()  # transformers imports an installed torchvision, whose compiled ops may not load here
    cfg = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
        max_position_embeddings=12, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu",
    )  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    tensors = {k: v.detach().numpy() for k, v in reference.state_dict().items()}
    m = tiny_bert()
    params = params_from_tensors(m, tensors)
    ids, mask = tokens(), np.ones((2, 8), np.int64)
    mask[0, 6:] = 0
    with torch.no_grad():
        want = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    got = run(be, m, params, ids, mask)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # Two segments: token types as a third named input.
    types = (np.arange(8) >= 3).astype(np.int64)[None].repeat(2, 0)
    with torch.no_grad():
        want = reference(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types)
        ).last_hidden_state.numpy()
    segmented = tiny_bert(token_types=True)
    assert segmented.input_names == ("input_ids", "attention_mask", "token_type_ids")
    feeds = {k: be.from_numpy(v, DEV) for k, v in zip(segmented.input_names, (ids, mask, types))}
    tensors = [be.from_numpy(p, DEV) for p in params]
    got = be.to_numpy(segmented.run(be, tensors, feeds, context=RunContext(devices=[DEV]))[segmented.output])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_model_runs_in_stages_that_consume_model_inputs_and_earlier_nodes(ref):
    m = tiny_bert()
    params = [ref.from_numpy(p, DEV) for p in m.init_params(seed=8, scale=0.2)]
    ids, mask = tokens(), np.ones((2, 8), np.int64)
    mask[0, 4:] = 0
    feeds = {"input_ids": ref.from_numpy(ids, DEV), "attention_mask": ref.from_numpy(mask, DEV)}
    ctx = RunContext(devices=[DEV])
    whole = ref.to_numpy(m.run(ref, params, feeds, context=ctx)[m.output])
    names = [n.name for n in m.nodes]
    cut = names.index("encoder.layer.1.attention")
    first = m.run(ref, params, feeds, names[:cut], context=ctx)
    # The first stage hands on what the second consumes: the hidden state and the padding mask.
    assert sorted(first) == ["encoder.layer.0.output.LayerNorm", "extended_attention_mask"]
    second = m.run(ref, params, first, names[cut:], context=ctx)
    np.testing.assert_array_equal(ref.to_numpy(second[m.output]), whole)


def test_param_keys_of_a_resnet_are_torchvisions_names():
    from multigpu.models import resnet18

    keys = resnet18(10, (3, 32, 32)).param_keys()
    assert keys[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]
    assert "layer2.0.downsample.0.weight" in keys and "layer2.0.downsample.1.bias" in keys
    assert keys[-2:] == ["fc.weight", "fc.bias"] and len(keys) == 62


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"training": 1}, "training=1 must be True or False"),
        ({"seed": -1}, "seed=-1 must be an integer >= 0"),
        ({"step": 1.5}, "step=1.5 must be an integer >= 0"),
        ({"devices": ["cpu:0"]}, "devices holds 'cpu:0'"),
        ({"shards": [(0, 2)]}, "give shards and batch together"),
    ],
)
def test_a_bad_run_context_is_refused(kwargs, match):
    with pytest.raises(ModelError, match=match):
        RunContext(**kwargs)
