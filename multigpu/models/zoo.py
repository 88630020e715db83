"""Built-in model specs: the textbook's LeNet, the original AlexNet and ResNet-18 (two layouts).

``resnet18`` is the layout torchvision, ``paddle.vision.models`` and the Gluon model zoo
share; its parameters come in torchvision's ``named_parameters()`` order and its
BatchNorm state in torchvision's buffer order (running mean, running variance per
BatchNorm; no batch counter), so weights move between them by position (transpose
``fc``: torch's Linear stores (out, in), ``Dense`` (in, out)). ``resnet18_textbook`` is the
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
from multigpu.models.blocks import Chain, Residual
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


def resnet(
    blocks: Sequence[int],
    widths: Sequence[int],
    num_classes: int,
    input_shape: Sequence[int],
    name: str,
    stem: str = "imagenet",
) -> Model:
    """A ResNet of basic blocks: ``blocks[i]`` blocks of ``widths[i]`` channels in stage i.

    ``stem="imagenet"``: 7x7/2 convolution without bias, BatchNorm, ReLU and a 3x3/2 max
    pool with padding 1 (torchvision); ``"textbook"``: 3x3/1 convolution with bias,
    BatchNorm and ReLU, no max pool, and d2l's residual blocks. Stages after the first
    start with stride 2 and a projected shortcut.
    """
    if len(blocks) != len(widths) or not blocks or min(blocks) < 1 or min(widths) < 1:
        raise ModelError(
            f"resnet needs one block count >= 1 per stage width, got blocks={list(blocks)}, widths={list(widths)}"
        )
    textbook = stem == "textbook"
    if stem == "imagenet":
        body: list[Any] = [
            Conv2d(widths[0], 7, 2, 3, bias=False, name="conv1"),
            BatchNorm2d(name="bn1"),
            ReLU(name="relu"),
            MaxPool2d(3, 2, 1, name="maxpool"),
        ]
    elif textbook:
        body = [Conv2d(widths[0], 3, 1, 1, bias=True, name="conv1"), BatchNorm2d(name="bn1"), ReLU(name="relu")]
    else:
        raise ModelError(f"resnet stem={stem!r} is unknown; use 'imagenet' or 'textbook'")
    cin = widths[0]
    for s, (count, width) in enumerate(zip(blocks, widths)):
        stage = []
        for b in range(count):
            stride = 2 if s > 0 and b == 0 else 1
            stage.append(basic_block(width, stride, stride != 1 or cin != width, str(b), textbook))
            cin = width
        body.append(Chain(stage, name=f"layer{s + 1}"))
    body += [GlobalAvgPool2d(name="avgpool"), Flatten(name="flatten"), Dense(num_classes, name="fc")]
    return Model(body, input_shape, name=name, init="he")


def resnet18(num_classes: int = 1000, input_shape: Sequence[int] = (3, 224, 224)) -> Model:
    """ResNet-18 in the layout of torchvision, paddle.vision and the Gluon zoo (11,689,512
    parameters with 1000 classes); ``input_shape`` may be any (C, H, W) it fits, e.g. (1, 28, 28)."""
    return resnet((2, 2, 2, 2), (64, 128, 256, 512), num_classes, input_shape, "resnet18")


def resnet18_textbook(num_classes: int = 10, input_shape: Sequence[int] = (1, 28, 28)) -> Model:
    """The chapter's small ResNet-18 for Fashion-MNIST (d2l's ``resnet18(num_classes, in_channels=1)``)."""
    return resnet((2, 2, 2, 2), (64, 128, 256, 512), num_classes, input_shape, "resnet18_textbook", stem="textbook")


MODELS: dict[str, Callable[..., Model]] = {
    "lenet": lenet,
    "alexnet": alexnet,
    "resnet18": resnet18,
    "resnet18_textbook": resnet18_textbook,
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
