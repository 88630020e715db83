"""Built-in model specs: the textbook's LeNet, the original AlexNet, ResNet-18 (two layouts),
ResNet-50 and GoogLeNet.

``resnet18``, ``resnet50`` and ``googlenet`` are torchvision's layouts (``resnet18`` is also
``paddle.vision.models``' and the Gluon zoo's); their nodes are named as torchvision names
the modules, so ``Model.param_keys()`` lists torchvision's ``named_parameters()`` names in
its order, and the BatchNorm state comes in torchvision's buffer order (running mean,
running variance per BatchNorm; no batch counter): weights move between them by position
(transpose ``fc``: torch's Linear stores (out, in), ``Dense`` (in, out)). ``resnet18_textbook`` is the
chapter's small variant for 28x28 Fashion-MNIST (d2l's ``resnet18(num_classes,
in_channels=1)``): a 3x3 stride-1 stem without max pool, and d2l's ``Residual``, whose
convolutions have biases and whose 1x1 shortcut has no BatchNorm.

The text models are registered too: ``gpt`` (the 3.2 M-parameter GPT ``multigpu train``
trains on the fortunes corpus), ``bert`` (BERT-base) and ``minilm`` (all-MiniLM-L6-v2's
encoder, measured on a 16-token sentence), so the planner and the executor take them by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from multigpu.errors import ModelError
from multigpu.models.blocks import Chain, Parallel, Residual
from multigpu.models.dropout import Dropout
from multigpu.models.graph import Model
from multigpu.models.layers import AvgPool2d, BatchNorm2d, Conv2d, Dense, Flatten, GlobalAvgPool2d, MaxPool2d, ReLU
from multigpu.models.sequential import Sequential
from multigpu.models.text_models import bert_base, gpt_small, minilm


def lenet() -> Sequential:
    """The textbook's LeNet variant on 1x28x28 input (params W1,b1..W4,b4), with the textbook's
    init (N(0, 0.01^2) weights, zero biases), which its published results assume."""
    return Sequential(
        [
            Conv2d(out_channels=20, kernel=3, name="conv1"),
            ReLU(name="relu1"),
            AvgPool2d(kernel=2, stride=2, name="pool1"),
            Conv2d(out_channels=50, kernel=5, name="conv2"),
            ReLU(name="relu2"),
            AvgPool2d(kernel=2, stride=2, name="pool2"),
            Flatten(name="flatten"),
            Dense(out_features=128, name="fc3"),
            ReLU(name="relu3"),
            Dense(out_features=10, name="fc4"),
        ],
        input_shape=(1, 28, 28),
        name="lenet",
        init="textbook",
    )


def alexnet(num_classes: int = 1000) -> Sequential:
    """The original two-group Caffe AlexNet on 3x227x227 input (LRN and dropout omitted:
    neither has parameters, and neither is a layer kind here), with the paper's N(0, 0.01^2) weights."""
    return Sequential(
        [
            Conv2d(out_channels=96, kernel=11, stride=4, name="conv1"),
            ReLU(name="relu1"),
            MaxPool2d(kernel=3, stride=2, name="pool1"),
            Conv2d(out_channels=256, kernel=5, padding=2, groups=2, name="conv2"),
            ReLU(name="relu2"),
            MaxPool2d(kernel=3, stride=2, name="pool2"),
            Conv2d(out_channels=384, kernel=3, padding=1, name="conv3"),
            ReLU(name="relu3"),
            Conv2d(out_channels=384, kernel=3, padding=1, groups=2, name="conv4"),
            ReLU(name="relu4"),
            Conv2d(out_channels=256, kernel=3, padding=1, groups=2, name="conv5"),
            ReLU(name="relu5"),
            MaxPool2d(kernel=3, stride=2, name="pool5"),
            Flatten(name="flatten"),
            Dense(out_features=4096, name="fc6"),
            ReLU(name="relu6"),
            Dense(out_features=4096, name="fc7"),
            ReLU(name="relu7"),
            Dense(out_features=num_classes, name="fc8"),
        ],
        input_shape=(3, 227, 227),
        name="alexnet",
        init="textbook",
    )


def basic_block(channels: int, stride: int, project: bool, name: str, textbook: bool = False) -> Chain:
    """A ResNet basic block: two 3x3 convolutions with BatchNorm, plus the input, then ReLU.

    ``project`` gives the shortcut a 1x1 convolution of ``stride`` (torchvision's
    ``downsample``: convolution without bias and BatchNorm; the textbook's ``conv3``:
    convolution with bias). ``textbook`` also gives the 3x3 convolutions biases.
    """
    main = [
        Conv2d(channels, 3, stride, 1, bias=textbook, name="conv1"),
        BatchNorm2d(name="bn1"),
        ReLU(name="relu1"),
        Conv2d(channels, 3, 1, 1, bias=textbook, name="conv2"),
        BatchNorm2d(name="bn2"),
    ]
    shortcut: Any = None
    if project and textbook:
        shortcut = Conv2d(channels, 1, stride, 0, bias=True, name="conv3")
    elif project:
        shortcut = Chain(
            [Conv2d(channels, 1, stride, 0, bias=False, name="0"), BatchNorm2d(name="1")], name="downsample"
        )
    return Chain([Residual(main, shortcut, join_name="add"), ReLU(name="relu2")], name=name)


def bottleneck_block(width: int, stride: int, project: bool, name: str) -> Chain:
    """A ResNet bottleneck (torchvision's ``Bottleneck``, ResNet v1.5): 1x1 to ``width``, 3x3 of
    ``stride``, 1x1 to ``4 * width``, each convolution without bias and with BatchNorm, plus
    the input, then ReLU.

    ``project`` gives the shortcut torchvision's ``downsample``: a 1x1 convolution of
    ``stride`` to ``4 * width`` channels without bias, and BatchNorm.
    """
    main = [
        Conv2d(width, 1, 1, 0, bias=False, name="conv1"),
        BatchNorm2d(name="bn1"),
        ReLU(name="relu1"),
        Conv2d(width, 3, stride, 1, bias=False, name="conv2"),
        BatchNorm2d(name="bn2"),
        ReLU(name="relu2"),
        Conv2d(BOTTLENECK_EXPANSION * width, 1, 1, 0, bias=False, name="conv3"),
        BatchNorm2d(name="bn3"),
    ]
    shortcut: Any = None
    if project:
        shortcut = Chain(
            [Conv2d(BOTTLENECK_EXPANSION * width, 1, stride, 0, bias=False, name="0"), BatchNorm2d(name="1")],
            name="downsample",
        )
    return Chain([Residual(main, shortcut, join_name="add"), ReLU(name="relu3")], name=name)


#: A bottleneck's output channels per unit of its width (torchvision's ``Bottleneck.expansion``).
BOTTLENECK_EXPANSION = 4


def resnet(
    blocks: Sequence[int],
    widths: Sequence[int],
    num_classes: int,
    input_shape: Sequence[int],
    name: str,
    stem: str = "imagenet",
    block: str = "basic",
) -> Model:
    """A ResNet: ``blocks[i]`` blocks of ``widths[i]`` channels in stage i.

    ``block="basic"``: two 3x3 convolutions (``basic_block``); ``"bottleneck"``: 1x1, 3x3, 1x1
    to four times the width (``bottleneck_block``). ``stem="imagenet"``: 7x7/2 convolution
    without bias, BatchNorm, ReLU and a 3x3/2 max pool with padding 1 (torchvision);
    ``"textbook"``: 3x3/1 convolution with bias, BatchNorm and ReLU, no max pool, and d2l's
    residual blocks (basic blocks only). Stages after the first start with stride 2; a
    block whose input and output shapes differ has a projected shortcut.
    """
    if len(blocks) != len(widths) or not blocks or min(blocks) < 1 or min(widths) < 1:
        raise ModelError(
            f"resnet needs one block count >= 1 per stage width, got blocks={list(blocks)}, widths={list(widths)}"
        )
    if block not in ("basic", "bottleneck"):
        raise ModelError(f"resnet block={block!r} is unknown; use 'basic' or 'bottleneck'")
    textbook = stem == "textbook"
    if stem == "imagenet":
        body: list[Any] = [
            Conv2d(widths[0], 7, 2, 3, bias=False, name="conv1"),
            BatchNorm2d(name="bn1"),
            ReLU(name="relu"),
            MaxPool2d(3, 2, 1, name="maxpool"),
        ]
    elif textbook:
        if block != "basic":
            raise ModelError("resnet stem='textbook' has basic blocks only (d2l's Residual); use block='basic'")
        body = [Conv2d(widths[0], 3, 1, 1, bias=True, name="conv1"), BatchNorm2d(name="bn1"), ReLU(name="relu")]
    else:
        raise ModelError(f"resnet stem={stem!r} is unknown; use 'imagenet' or 'textbook'")
    cin = widths[0]
    for s, (count, width) in enumerate(zip(blocks, widths)):
        stage = []
        for b in range(count):
            stride = 2 if s > 0 and b == 0 else 1
            if block == "bottleneck":
                out = BOTTLENECK_EXPANSION * width
                stage.append(bottleneck_block(width, stride, stride != 1 or cin != out, str(b)))
            else:
                out = width
                stage.append(basic_block(width, stride, stride != 1 or cin != width, str(b), textbook))
            cin = out
        body.append(Chain(stage, name=f"layer{s + 1}"))
    body += [GlobalAvgPool2d(name="avgpool"), Flatten(name="flatten"), Dense(num_classes, name="fc")]
    return Model(body, input_shape, name=name, init="he")


def resnet18(num_classes: int = 1000, input_shape: Sequence[int] = (3, 224, 224)) -> Model:
    """ResNet-18 in the layout of torchvision, paddle.vision and the Gluon zoo (11,689,512
    parameters with 1000 classes); ``input_shape`` may be any (C, H, W) it fits, e.g. (1, 28, 28)."""
    return resnet((2, 2, 2, 2), (64, 128, 256, 512), num_classes, input_shape, "resnet18")


def resnet50(num_classes: int = 1000, input_shape: Sequence[int] = (3, 224, 224)) -> Model:
    """ResNet-50 in torchvision's layout (v1.5: the stride on the 3x3 convolution of a
    bottleneck): 3, 4, 6 and 3 bottlenecks of widths 64, 128, 256, 512 (25,557,032 parameters
    with 1000 classes); ``input_shape`` may be any (C, H, W) it fits, e.g. (3, 64, 64)."""
    return resnet((3, 4, 6, 3), (64, 128, 256, 512), num_classes, input_shape, "resnet50", block="bottleneck")


def basic_conv(out_channels: int, kernel: int, name: str, stride: int = 1, padding: int = 0) -> Chain:
    """torchvision's ``BasicConv2d`` (GoogLeNet's unit): a convolution without bias, BatchNorm
    with eps 1e-3, ReLU; nodes ``name.conv``, ``name.bn``, ``name.relu``."""
    return Chain(
        [
            Conv2d(out_channels, kernel, stride, padding, bias=False, name="conv"),
            BatchNorm2d(eps=1e-3, name="bn"),
            ReLU(name="relu"),
        ],
        name=name,
    )


def inception_block(c1: int, r3: int, c3: int, r5: int, c5: int, pool: int, name: str) -> Parallel:
    """torchvision's ``Inception`` module: four branches joined along channels (``name.cat``).

    ``branch1`` a 1x1 to ``c1``; ``branch2`` a 1x1 to ``r3`` then a 3x3 to ``c3``;
    ``branch3`` a 1x1 to ``r5`` then a 3x3 (not the paper's 5x5: torchvision's known
    deviation, kept for its weights) to ``c5``; ``branch4`` a 3x3/1 ceil-mode max pool with
    padding 1, then a 1x1 to ``pool``.
    """
    return Parallel(
        [
            basic_conv(c1, 1, "branch1"),
            Chain([basic_conv(r3, 1, "0"), basic_conv(c3, 3, "1", padding=1)], name="branch2"),
            Chain([basic_conv(r5, 1, "0"), basic_conv(c5, 3, "1", padding=1)], name="branch3"),
            Chain([MaxPool2d(3, 1, 1, ceil_mode=True, name="0"), basic_conv(pool, 1, "1")], name="branch4"),
        ],
        join="concat",
        name=name,
        join_name="cat",
    )


#: Per Inception module (1x1, 3x3 reduce, 3x3, "5x5" reduce, "5x5", pool projection): torchvision's GoogLeNet.
INCEPTION = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def googlenet(num_classes: int = 1000, input_shape: Sequence[int] = (3, 224, 224), dropout: float = 0.2) -> Model:
    """GoogLeNet (Inception v1, Szegedy et al. 2015) as torchvision builds it, without the
    auxiliary classifiers and with ``transform_input=False`` (6,624,904 parameters with 1000
    classes): ``BasicConv2d`` units (BatchNorm after every convolution), nine Inception
    modules (``inception_block``), ceil-mode max pools between the stages, a global
    average pool, dropout of ``dropout`` and the classifier.

    Its init is torchvision's: N(0, 0.01^2) convolution and dense weights (torchvision
    truncates at +-2, 200 standard deviations out), except that the dense bias starts at 0
    (torchvision keeps Linear's uniform default there).
    """
    body: list[Any] = [
        basic_conv(64, 7, "conv1", stride=2, padding=3),
        MaxPool2d(3, 2, ceil_mode=True, name="maxpool1"),
        basic_conv(64, 1, "conv2"),
        basic_conv(192, 3, "conv3", padding=1),
        MaxPool2d(3, 2, ceil_mode=True, name="maxpool2"),
    ]
    for key, widths in INCEPTION.items():
        body.append(inception_block(*widths, name=f"inception{key}"))
        if key == "3b":
            body.append(MaxPool2d(3, 2, ceil_mode=True, name="maxpool3"))
        elif key == "4e":
            body.append(MaxPool2d(2, 2, ceil_mode=True, name="maxpool4"))
    body += [
        GlobalAvgPool2d(name="avgpool"),
        Flatten(name="flatten"),
        Dropout(dropout, name="dropout"),
        Dense(num_classes, name="fc"),
    ]
    return Model(body, input_shape, name="googlenet", init="textbook")


def resnet18_textbook(num_classes: int = 10, input_shape: Sequence[int] = (1, 28, 28)) -> Model:
    """The chapter's small ResNet-18 for Fashion-MNIST (d2l's ``resnet18(num_classes, in_channels=1)``)."""
    return resnet((2, 2, 2, 2), (64, 128, 256, 512), num_classes, input_shape, "resnet18_textbook", stem="textbook")


MODELS: dict[str, Callable[..., Model]] = {
    "lenet": lenet,
    "alexnet": alexnet,
    "resnet18": resnet18,
    "resnet18_textbook": resnet18_textbook,
    "resnet50": resnet50,
    "googlenet": googlenet,
    "gpt": gpt_small,
    "bert": bert_base,
    "minilm": minilm,
}


def get(name: str, num_classes: int | None = None, input_shape: Sequence[int] | None = None) -> Model:
    """Return the built-in model called ``name``, built for ``num_classes`` and ``input_shape``
    where its factory takes them (LeNet's are fixed); raise ModelError listing the choices."""
    try:
        factory = MODELS[name]
    except KeyError:
        raise ModelError(f"unknown model {name!r}; choose one of {sorted(MODELS)}") from None
    takes = inspect.signature(factory).parameters
    kwargs = {
        k: v for k, v in (("num_classes", num_classes), ("input_shape", input_shape)) if v is not None and k in takes
    }
    return factory(**kwargs)
