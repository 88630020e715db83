"""Models whose branches join: composition, shapes, accounting, stages, and the errors that name the node."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FRAMEWORKS

import multigpu
from multigpu import models
from multigpu.errors import ModelError, ParamsError
from multigpu.models import INPUT, Chain, Model, Node, Parallel, Residual

CPU = multigpu.Device("cpu", 0)
Add, BatchNorm2d, Concat, Conv2d, Dense = models.Add, models.BatchNorm2d, models.Concat, models.Conv2d, models.Dense
Flatten, GlobalAvgPool2d, Identity, MaxPool2d, ReLU = (
    models.Flatten,
    models.GlobalAvgPool2d,
    models.Identity,
    models.MaxPool2d,
    models.ReLU,
)


def tiny_resnet() -> Model:
    """Two stages of one basic block: BatchNorm, an identity and a projected shortcut, a padded max pool."""
    return models.resnet((1, 1), (4, 8), 5, (3, 12, 12), "tiny")


def inception_dense() -> Model:
    """Inception-style towers joined by concat, then a DenseNet-style x -> concat(x, f(x))."""
    towers = Parallel(
        [
            Conv2d(4, 1, name="b1x1"),
            Chain([Conv2d(2, 1, name="reduce"), Conv2d(4, 3, padding=1, name="conv")], name="b3x3"),
            Chain([MaxPool2d(3, 1, 1, name="pool"), Conv2d(2, 1, name="proj")], name="bpool"),
        ],
        join="concat",
        name="mixed",
    )
    dense = Parallel(
        [
            Identity(),
            Chain([BatchNorm2d(name="bn"), ReLU(name="relu"), Conv2d(3, 3, padding=1, bias=False, name="conv")]),
        ],
        join="concat",
        name="dense",
    )
    return Model(
        [
            Conv2d(6, 3, padding=1, name="stem"),
            towers,
            dense,
            GlobalAvgPool2d(name="gap"),
            Flatten(name="flat"),
            Dense(4, name="fc"),
        ],
        input_shape=(2, 8, 8),
        name="mixed",
    )


def test_blocks_flatten_to_named_nodes_with_their_inputs():
    m = inception_dense()
    by = {n.name: n for n in m.nodes}
    assert by["mixed.concat1"].inputs == ("mixed.b1x1", "mixed.b3x3.conv", "mixed.bpool.proj")
    assert by["mixed.b3x3.reduce"].inputs == by["mixed.bpool.pool"].inputs == ("stem",)
    assert by["dense.concat1"].inputs == ("mixed.concat1", "dense.conv")  # the identity branch is the input itself
    assert m.shapes["mixed.concat1"] == (10, 8, 8) and m.shapes["dense.concat1"] == (13, 8, 8)
    assert m.output_shape == (4,) and m.nodes[0].inputs == (INPUT,)
    order = [n.name for n in m.nodes]
    for n in m.nodes:  # one topological order
        assert all(order.index(i) < order.index(n.name) for i in n.inputs if i != INPUT)
    stats = {s.name: s for s in m.layer_stats(2)}
    assert stats["dense.concat1"].inputs == ("mixed.concat1", "dense.conv")
    assert stats["mixed.b3x3.conv"].macs == 2 * 8 * 8 * 4 * 2 * 9
    assert stats["dense.conv"].params == 3 * 10 * 9  # no bias
    assert stats["gap"].output_bytes == 2 * 13 * 4


def test_explicit_nodes_in_any_order_equal_the_composed_model(ref):
    nodes = [
        Node("out", Dense(3), ("flat",)),
        Node("flat", Flatten(), ("join",)),
        Node("join", Add(), ("b", "a")),
        Node("b", Conv2d(2, 1, bias=False), (INPUT,)),
        Node("a", Conv2d(2, 3, padding=1), (INPUT,)),
    ]
    m = Model.from_nodes(nodes, (1, 4, 4), output="out")
    assert [n.name for n in m.nodes] == ["b", "a", "join", "flat", "out"]  # stable topological order
    composed = Model(
        [
            Parallel(
                [Conv2d(2, 1, bias=False, name="b"), Conv2d(2, 3, padding=1, name="a")], join="add", join_name="join"
            ),
            Flatten(name="flat"),
            Dense(3, name="out"),
        ],
        (1, 4, 4),
    )
    assert [(n.name, n.inputs) for n in composed.nodes] == [(n.name, n.inputs) for n in m.nodes]
    assert m.param_shapes == composed.param_shapes


@pytest.mark.parametrize(
    "build, match",
    [
        (
            lambda: Model(Residual([Conv2d(4, 3, stride=2, padding=1, name="conv")]), (2, 6, 6), "m"),
            r"node 'add1' \(add, inputs 'conv' \(4, 3, 3\), 'input' \(2, 6, 6\)\): "
            r"adds inputs of shapes .*1x1 convolution",
        ),
        (
            lambda: Model(Parallel([Conv2d(2, 3, name="a"), Conv2d(2, 1, name="b")]), (1, 5, 5), "m"),
            r"node 'concat1' .*'a' \(2, 3, 3\), 'b' \(2, 5, 5\).*equal H and W",
        ),
        (
            lambda: Model.from_nodes(
                [Node("a", ReLU(), ("b",)), Node("b", ReLU(), ("a",)), Node("c", ReLU(), ("b",))], (1, 2, 2), "m"
            ),
            r"nodes .*'?a'? -> .*b.* form a cycle",
        ),
        (
            lambda: Model.from_nodes([Node("a", ReLU(), (INPUT,)), Node("b", ReLU(), ("x",))], (1, 2, 2), "m"),
            r"node 'b' consumes 'x', which is neither a node nor 'input'",
        ),
        (
            lambda: Model.from_nodes([Node("a", ReLU(), (INPUT,)), Node("b", ReLU(), (INPUT,))], (1, 2, 2), "m"),
            r"the output of node\(s\) \['a'\] is used by no node",
        ),
        (
            lambda: Model.from_nodes([Node("a", ReLU(), (INPUT,)), Node("a", ReLU(), ("a",))], (1, 2, 2), "m"),
            r"two nodes are called 'a'",
        ),
        (
            lambda: Model([Chain([ReLU(name="r")], name="x"), Chain([ReLU(name="r")], name="x")], (1, 2, 2), "m"),
            r"two nodes are called 'x.r'",
        ),
        (lambda: Model.from_nodes([Node(INPUT, ReLU(), (INPUT,))], (1, 2, 2), "m"), r"no node may be called 'input'"),
        (lambda: Model.from_nodes([Node("j", Add(), (INPUT,))], (1, 2, 2), "m"), r"node 'j' \(add\) joins .*2 inputs"),
        (
            lambda: Model.from_nodes([Node("a", ReLU(), (INPUT,)), Node("b", ReLU(), (INPUT, "a"))], (1, 2, 2), "m"),
            r"node 'b' \(relu\) takes one input.*Add or Concat",
        ),
        (
            lambda: Model.from_nodes(
                [Node("a", ReLU(), (INPUT,)), Node("b", ReLU(), ("a",))], (1, 2, 2), "m", output="a"
            ),
            r"node\(s\) \['b'\] do not lead to the output 'a'|used by no node",
        ),
        (lambda: Model(Parallel([Identity(), Identity()], join="add"), (1, 2, 2), "m"), "two identity branches"),
        (lambda: Model([Dense(3)], (1, 4, 4), "m"), r"node 'dense1' .*add Flatten first"),
        (lambda: Parallel([ReLU()]), "a join needs at least 2"),
        (lambda: Parallel([ReLU(), ReLU()], join="mul"), "join='mul' is unknown"),
        (lambda: BatchNorm2d(momentum=0.9 + 0.2), r"momentum=1.1.* \(0, 1\]"),
        (lambda: BatchNorm2d(eps=0), r"eps=0 must be a finite number > 0"),
    ],
)
def test_bad_graphs_are_refused_naming_the_node(build, match):
    with pytest.raises(ModelError, match=match):
        build()


def test_stages_run_from_the_tensors_they_consume(ref):
    """A stage that cuts through a residual block (main path apart from the shortcut) gives the
    model's own output, in inference and in training mode."""
    m = tiny_resnet()
    params = [ref.from_numpy(p, CPU) for p in m.init_params(seed=2)]
    state = [ref.from_numpy(s + 0.5, CPU) for s in m.init_state()]
    x = ref.from_numpy(np.random.default_rng(0).random((3, 3, 12, 12), dtype=np.float32), CPU)
    full = ref.to_numpy(m.run(ref, params, {INPUT: x}, state=state)[m.output])
    names = [n.name for n in m.nodes]
    cut = names.index("layer2.0.bn2")  # layer2's main path up to bn2; its shortcut and the rest later
    first = m.run(ref, params, {INPUT: x}, names[:cut], state=state)
    assert set(first) == {"layer1.0.relu2", "layer2.0.conv2"}  # both sides of the block leave the stage
    rest = m.run(ref, params, first, names[cut:], state=state)
    np.testing.assert_allclose(ref.to_numpy(rest[m.output]), full, rtol=1e-6)
    with pytest.raises(ModelError, match=r"consumes \['layer1.0.relu2'\], which it does not compute; pass"):
        m.run(ref, params, {"layer2.0.conv2": first["layer2.0.conv2"]}, names[cut:], state=state)
    with pytest.raises(ModelError, match="has BatchNorm: pass state="):
        m.run(ref, params, {INPUT: x})
    mode = models.BatchStatistics()
    train_full = ref.to_numpy(m.apply(ref, [params], [x], mode)[0])
    assert len(mode.stats[0]) == len(m.state_shapes)
    part = m.run(ref, params, {INPUT: x}, names[:cut], bn=models.BatchStatistics())
    rest = m.run(ref, params, part, names[cut:], bn=models.BatchStatistics())
    np.testing.assert_allclose(ref.to_numpy(rest[m.output]), train_full, rtol=1e-6)


def test_forward_slices_chain_cuts_and_refuses_others(ref):
    m = tiny_resnet()
    params = [ref.from_numpy(p, CPU) for p in m.init_params()]
    state = [ref.from_numpy(s, CPU) for s in m.init_state()]
    x = ref.from_numpy(np.random.default_rng(1).random((2, 3, 12, 12), dtype=np.float32), CPU)
    names = [n.name for n in m.nodes]
    cut = names.index("layer2.0.conv1")  # between blocks: one tensor crosses
    mid = m.forward(ref, params, x, 0, cut, state=state)
    np.testing.assert_allclose(
        ref.to_numpy(m.forward(ref, params, mid, cut, state=state)),
        ref.to_numpy(m.forward(ref, params, x, state=state)),
        rtol=1e-6,
    )
    with pytest.raises(ModelError, match="does not compute"):
        m.forward(ref, params, mid, names.index("layer2.0.bn1"), state=state)


def test_resnet18_is_torchvisions_layout():
    m = models.resnet18()
    assert m.num_params() == 11_689_512 and len(m.param_shapes) == 62 and len(m.state_shapes) == 40
    assert sum(s.macs for s in m.layer_stats(1)) == 1_814_073_344  # torchvision's 1.81 GMACs
    names = [n for n in m.param_names()]
    assert names[:6] == ["conv1.0", "bn1.0", "bn1.1", "layer1.0.conv1.0", "layer1.0.bn1.0", "layer1.0.bn1.1"]
    i = names.index("layer2.0.downsample.0.0")
    assert names[i - 3 : i + 3] == [
        "layer2.0.conv2.0",
        "layer2.0.bn2.0",
        "layer2.0.bn2.1",
        "layer2.0.downsample.0.0",
        "layer2.0.downsample.1.0",
        "layer2.0.downsample.1.1",
    ]
    assert m.param_shapes[0] == (64, 3, 7, 7) and m.param_shapes[-2:] == [(512, 1000), (1000,)]
    by = {s.name: s for s in m.layer_stats(1)}
    assert by["maxpool"].output_shape == (64, 56, 56) and by["layer4.1.relu2"].output_shape == (512, 7, 7)
    assert by["layer3.0.add"].inputs == ("layer3.0.bn2", "layer3.0.downsample.1")
    small = models.resnet18_textbook()
    assert small.input_shape == (1, 28, 28) and small.param_shapes[:2] == [(64, 1, 3, 3), (64,)]
    assert "maxpool" not in small.index and small.shapes["layer4.1.relu2"] == (512, 4, 4)
    assert any(n.endswith("conv3") for n in small.index)  # d2l's 1x1 shortcut without BatchNorm
    assert models.get("resnet18", num_classes=10, input_shape=(1, 28, 28)).param_shapes[0] == (64, 1, 7, 7)


@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="needs torch")
def test_parameters_and_buffers_move_to_torchvisions_module_by_position():
    from multigpu.benchmarks.resnet_references import torch_module

    net, m = torch_module(1000), models.resnet18()
    theirs = [tuple(p.shape) for p in net.parameters()]
    ours = m.param_shapes
    assert ours[:-2] == theirs[:-2] and ours[-2] == theirs[-2][::-1] and ours[-1] == theirs[-1]
    buffers = [tuple(b.shape) for name, b in net.named_buffers() if not name.endswith("num_batches_tracked")]
    assert buffers == m.state_shapes


def test_init_is_he_for_convolutions_and_batchnorm_starts_at_one_and_zero():
    m = models.resnet18(10, (3, 32, 32))
    params = m.init_params(seed=0)
    names = m.param_names()
    conv = params[names.index("layer3.0.conv2.0")]
    assert abs(conv.std() - np.sqrt(2 / (256 * 9))) < 0.02 * np.sqrt(2 / (256 * 9))
    assert (params[names.index("layer3.0.bn2.0")] == 1).all() and not params[names.index("layer3.0.bn2.1")].any()
    state = m.init_state()
    assert not state[0].any() and (state[1] == 1).all()
    bound = 1 / np.sqrt(512)
    assert np.abs(params[-2]).max() <= bound and np.abs(params[-2]).max() > 0.9 * bound
    layers = [Conv2d(2, 3), BatchNorm2d(), ReLU(), Flatten(), Dense(2)]
    seq = multigpu.Sequential(layers, (1, 4, 4), init="textbook")
    p = seq.init_params()  # the textbook's scheme, but gamma = 1
    assert abs(p[0].std() - 0.01) < 0.005 and not p[1].any() and (p[2] == 1).all() and not p[3].any()


def test_weights_of_the_wrong_shape_name_the_node():
    m = tiny_resnet()
    params = m.init_params()
    params[m.param_names().index("layer2.0.downsample.1.0")] = np.ones(3)
    with pytest.raises(
        ParamsError,
        match=r"params\[\d+\] has shape \(3,\); node 'layer2.0.downsample.1''s gamma "
        r"of tiny needs \(8,\)",
    ):
        m.check_params(params)
    state = m.init_state()
    state[3] = -state[3]
    with pytest.raises(ParamsError, match=r"state\[3\] \(node 'layer1.0.bn1''s running variance\) holds a negative"):
        m.check_state(state)
    with pytest.raises(ParamsError, match="state has 2 arrays but tiny needs"):
        m.check_state(state[:2])


def test_sequential_stays_the_chain_case():
    with pytest.raises(ModelError, match="Sequential is a chain"):
        multigpu.Sequential([Conv2d(2, 1), Concat()], (1, 4, 4))
    with pytest.raises(ModelError, match="go into multigpu.models.Model"):
        multigpu.Sequential([Residual([ReLU()])], (1, 4, 4))
    m = models.lenet()
    assert [s.inputs for s in m.layer_stats()][:2] == [(INPUT,), ("conv1",)]
    assert isinstance(m, Model) and len(m) == 10


def test_resnet50_is_torchvisions_layout():
    m = models.resnet50()
    # torchvision's resnet50: 25,557,032 parameters in 161 tensors, 53 BatchNorms, 4.09 GMACs.
    assert m.num_params() == 25_557_032 and len(m.param_shapes) == 161 and len(m.state_shapes) == 106
    assert sum(s.macs for s in m.layer_stats(1)) == pytest.approx(4.09e9, rel=2e-3)
    keys = m.param_keys()
    i = keys.index("layer2.0.downsample.0.weight")
    assert keys[i - 3 : i + 4] == [
        "layer2.0.conv3.weight",
        "layer2.0.bn3.weight",
        "layer2.0.bn3.bias",
        "layer2.0.downsample.0.weight",
        "layer2.0.downsample.1.weight",
        "layer2.0.downsample.1.bias",
        "layer2.1.conv1.weight",
    ]
    shapes = dict(zip(keys, m.param_shapes))
    # The stride sits on the 3x3 (v1.5); layer1 projects 64 -> 256 channels at stride 1.
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1) and shapes["fc.weight"] == (2048, 1000)
    by = {s.name: s for s in m.layer_stats(1)}
    assert by["layer2.0.conv1"].output_shape == (128, 56, 56) and by["layer2.0.conv2"].output_shape == (128, 28, 28)
    assert by["layer4.2.relu3"].output_shape == (2048, 7, 7)
    assert by["layer1.0.add"].inputs == ("layer1.0.bn3", "layer1.0.downsample.1")
    assert by["layer1.1.add"].inputs == ("layer1.1.bn3", "layer1.0.relu3")  # identity shortcut
    assert models.get("resnet50", num_classes=10).param_shapes[-1] == (10,)


def test_googlenet_is_torchvisions_layout():
    m = models.googlenet()
    # torchvision's googlenet(aux_logits=False): 6,624,904 parameters in 173 tensors, 57 BatchNorms.
    assert m.num_params() == 6_624_904 and len(m.param_shapes) == 173 and len(m.state_shapes) == 114
    keys = m.param_keys()
    assert keys[:3] == ["conv1.conv.weight", "conv1.bn.weight", "conv1.bn.bias"] and keys[-2:] == [
        "fc.weight",
        "fc.bias",
    ]
    shapes = dict(zip(keys, m.param_shapes))
    assert shapes["inception3a.branch3.1.conv.weight"] == (32, 16, 3, 3)  # torchvision's 3x3, not the paper's 5x5
    assert shapes["inception5b.branch4.1.conv.weight"] == (128, 832, 1, 1)
    assert {n.layer.eps for n in m.nodes if isinstance(n.layer, BatchNorm2d)} == {1e-3}
    assert all(not n.layer.bias for n in m.nodes if isinstance(n.layer, Conv2d))
    # Ceil-mode pools: 112 -> 56 (floor would give 55), 56 -> 28, 28 -> 14, 14 -> 7.
    out = {s.name: s.output_shape for s in m.layer_stats(1)}
    assert out["maxpool1"] == (64, 56, 56) and out["maxpool2"] == (192, 28, 28)
    assert out["maxpool3"] == (480, 14, 14) and out["maxpool4"] == (832, 7, 7)
    assert out["inception3a.cat"] == (256, 28, 28) and out["inception5b.cat"] == (1024, 7, 7)
    assert [n.name for n in m.nodes[-4:]] == ["avgpool", "flatten", "dropout", "fc"]


@pytest.mark.parametrize(
    ("factory", "shapes"),
    [
        (models.resnet50, {"maxpool": (64, 16, 16), "layer4.2.relu3": (2048, 2, 2)}),
        # Ceil mode: 32 -> 16 (floor 15), 16 -> 8 (floor 7), 8 -> 4 (floor 3), 4 -> 2.
        (models.googlenet, {"maxpool1": (64, 16, 16), "maxpool2": (192, 8, 8), "maxpool3": (480, 4, 4)}),
    ],
)
def test_resnet50_and_googlenet_run_on_the_reference_at_64_pixels(ref, factory, shapes):
    m = factory(num_classes=7, input_shape=(3, 64, 64))
    assert {k: m.shapes[k] for k in shapes} == shapes
    params = [ref.from_numpy(p, CPU) for p in m.init_params(seed=1)]
    state = [ref.from_numpy(s, CPU) for s in m.init_state()]
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    out = ref.to_numpy(m.forward(ref, params, ref.from_numpy(x, CPU), state=state))
    # GoogLeNet's N(0, 0.01^2) init shrinks the activations (to about 1e-12 at the classifier,
    # with the initial running statistics): compare the two examples relatively.
    assert out.shape == (2, 7) and np.isfinite(out).all() and not np.allclose(out[0], out[1], rtol=1e-3, atol=0)


def _torchvision_modules():
    """torchvision's ResNet-50 and GoogLeNet (aux_logits=False, transform_input=False) as plain
    ``nn.Module``s written from its source (torchvision itself is not a dependency)."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, 4 * width, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(4 * width)
            self.relu = nn.ReLU()
            self.downsample = None
            if stride != 1 or cin != 4 * width:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, 4 * width, 1, stride, bias=False), nn.BatchNorm2d(4 * width)
                )

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet50(nn.Module):
        def __init__(self, classes):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            cin = 64
            for i, (width, count) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
                blocks = []
                for b in range(count):
                    blocks.append(Bottleneck(cin, width, 2 if i and not b else 1))
                    cin = 4 * width
                setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(2048, classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    class BasicConv2d(nn.Module):
        def __init__(self, cin, cout, **kwargs):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, bias=False, **kwargs)
            self.bn = nn.BatchNorm2d(cout, eps=0.001)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    class Inception(nn.Module):
        def __init__(self, cin, c1, r3, c3, r5, c5, pool):
            super().__init__()
            self.branch1 = BasicConv2d(cin, c1, kernel_size=1)
            self.branch2 = nn.Sequential(
                BasicConv2d(cin, r3, kernel_size=1), BasicConv2d(r3, c3, kernel_size=3, padding=1)
            )
            self.branch3 = nn.Sequential(
                BasicConv2d(cin, r5, kernel_size=1), BasicConv2d(r5, c5, kernel_size=3, padding=1)
            )
            self.branch4 = nn.Sequential(
                nn.MaxPool2d(kernel_size=3, stride=1, padding=1, ceil_mode=True), BasicConv2d(cin, pool, kernel_size=1)
            )

        def forward(self, x):
            return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)

    class GoogLeNet(nn.Module):
        def __init__(self, classes):
            super().__init__()
            self.conv1 = BasicConv2d(3, 64, kernel_size=7, stride=2, padding=3)
            self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
            self.conv2 = BasicConv2d(64, 64, kernel_size=1)
            self.conv3 = BasicConv2d(64, 192, kernel_size=3, padding=1)
            self.maxpool2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
            self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
            self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
            self.maxpool3 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
            self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
            self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
            self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
            self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
            self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
            self.maxpool4 = nn.MaxPool2d(2, stride=2, ceil_mode=True)
            self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
            self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.dropout = nn.Dropout(0.2)
            self.fc = nn.Linear(1024, classes)

        def forward(self, x):
            x = self.maxpool2(self.conv3(self.conv2(self.maxpool1(self.conv1(x)))))
            x = self.maxpool3(self.inception3b(self.inception3a(x)))
            for name in ("4a", "4b", "4c", "4d", "4e"):
                x = getattr(self, f"inception{name}")(x)
            x = self.inception5b(self.inception5a(self.maxpool4(x)))
            return self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))

    return {"resnet50": ResNet50, "googlenet": GoogLeNet}


@pytest.mark.slow
@pytest.mark.skipif("torch" not in FRAMEWORKS, reason="needs torch")
@pytest.mark.parametrize("name", ["resnet50", "googlenet"])
def test_resnet50_and_googlenet_equal_torchvisions_modules(ref, name):
    """Names and order of ``named_parameters()`` and the buffers, and the inference output on
    2x3x64x64 (where three of GoogLeNet's ceil-mode pools keep a window floor would drop)
    with our weights and BatchNorm state loaded by position."""
    import torch

    m = models.get(name, num_classes=5, input_shape=(3, 64, 64))
    net = _torchvision_modules()[name](5).eval()
    assert [k for k, _ in net.named_parameters()] == m.param_keys()
    buffers = [b for k, b in net.named_buffers() if not k.endswith("num_batches_tracked")]
    assert [tuple(b.shape) for b in buffers] == m.state_shapes
    rng = np.random.default_rng(3)
    params = m.init_params(seed=2)
    # Running statistics away from 0 and 1, so a wrong eps or a swapped buffer shows.
    state = [
        (rng.standard_normal(s) * 0.1 if i % 2 == 0 else rng.uniform(0.5, 1.5, s)).astype(np.float32)
        for i, s in enumerate(m.state_shapes)
    ]
    with torch.no_grad():
        for p, a, transposed in zip(net.parameters(), params, m.torch_layouts()):
            p.copy_(torch.from_numpy(a.T.copy() if transposed else a))
        for b, a in zip(buffers, state):
            b.copy_(torch.from_numpy(a))
        x = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
        want = net(torch.from_numpy(x)).numpy()
    got = ref.to_numpy(
        m.forward(
            ref,
            [ref.from_numpy(p, CPU) for p in params],
            ref.from_numpy(x, CPU),
            state=[ref.from_numpy(s, CPU) for s in state],
        )
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_decisions_see_every_window_of_a_ceil_mode_pool():
    """``decisions`` (the discrete choices a step agreement compares) reads a ceil-mode pool's
    last, partial windows too: one argmax per output element, the same as the backend's max."""
    from multigpu.parallel.agreement import decisions

    m = Model(
        [Conv2d(2, 1, name="c"), MaxPool2d(3, 2, ceil_mode=True, name="pool"), Flatten(name="f"), Dense(3, name="fc")],
        input_shape=(1, 6, 6),
        name="ceil",
    )
    assert m.shapes["pool"] == (2, 3, 3)  # floor gives 2 x 2
    params = m.init_params(seed=0)
    x = np.random.default_rng(0).standard_normal((2, 1, 6, 6)).astype(np.float32)
    got = decisions(m, "numpy", params, [x])
    assert got.shape == (2 * 2 * 3 * 3,)
    # The argmax of each window, read back: the pool's output is the conv output at that position.
    ref = multigpu.backend("numpy")
    conv = ref.to_numpy(m.forward(ref, [ref.from_numpy(p, CPU) for p in params], ref.from_numpy(x, CPU), 0, 1))
    pooled = ref.to_numpy(m.forward(ref, [ref.from_numpy(p, CPU) for p in params], ref.from_numpy(x, CPU), 0, 2))
    padded = np.pad(conv, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=-np.inf)
    rows, cols = np.divmod(got.reshape(2, 2, 3, 3), 3)
    i = np.arange(3)[:, None] * 2 + rows
    j = np.arange(3)[None, :] * 2 + cols
    b, c = np.meshgrid(np.arange(2), np.arange(2), indexing="ij")
    values = padded[b[..., None, None], c[..., None, None], i, j]
    np.testing.assert_array_equal(values, pooled)


def test_a_ceil_mode_kernel_larger_than_its_input_is_refused_when_built():
    """torch would pool a 1x1 plane with a 2x2 ceil-mode window; the contract (as MXNet)
    refuses a kernel larger than the padded input, so the model refuses it when built."""
    with pytest.raises(ModelError, match=r"MaxPool2d kernel 2 does not fit input \(832, 1, 1\) with padding 0"):
        models.googlenet(10, (1, 28, 28))
    assert models.googlenet(10, (1, 32, 32)).shapes["maxpool4"] == (832, 1, 1)


def test_a_tiny_bottleneck_resnet_and_its_refusals(ref):
    m = models.resnet((1, 1), (2, 4), 3, (3, 16, 16), "tiny50", block="bottleneck")
    # Stage 1 projects 2 -> 8 channels at stride 1; stage 2 projects 8 -> 16 at stride 2 on the 3x3.
    assert m.shapes["layer1.0.relu3"] == (8, 4, 4) and m.shapes["layer2.0.conv2"] == (4, 2, 2)
    assert m.shapes["layer2.0.downsample.1"] == (16, 2, 2)
    params = [ref.from_numpy(p, CPU) for p in m.init_params()]
    state = [ref.from_numpy(s, CPU) for s in m.init_state()]
    x = ref.from_numpy(np.ones((1, 3, 16, 16), np.float32), CPU)
    assert ref.shape(m.forward(ref, params, x, state=state)) == (1, 3)
    with pytest.raises(ModelError, match="block='wide' is unknown; use 'basic' or 'bottleneck'"):
        models.resnet((1,), (2,), 3, (3, 16, 16), "x", block="wide")
    with pytest.raises(ModelError, match="stem='textbook' has basic blocks only"):
        models.resnet((1,), (2,), 3, (3, 16, 16), "x", stem="textbook", block="bottleneck")
