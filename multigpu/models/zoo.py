"""Built-in model specs: the textbook's LeNet variant and the original AlexNet."""
from __future__ import annotations

from typing import Callable

from multigpu.errors import ModelError
from multigpu.models.layers import AvgPool2d, Conv2d, Dense, Flatten, MaxPool2d, ReLU
from multigpu.models.sequential import Sequential


def lenet() -> Sequential:
    """The textbook's LeNet variant on 1x28x28 input (params W1,b1..W4,b4)."""
    return Sequential([
        Conv2d(out_channels=20, kernel=3, name="conv1"), ReLU(name="relu1"),
        AvgPool2d(kernel=2, stride=2, name="pool1"),
        Conv2d(out_channels=50, kernel=5, name="conv2"), ReLU(name="relu2"),
        AvgPool2d(kernel=2, stride=2, name="pool2"),
        Flatten(name="flatten"),
        Dense(out_features=128, name="fc3"), ReLU(name="relu3"),
        Dense(out_features=10, name="fc4"),
    ], input_shape=(1, 28, 28), name="lenet")


def alexnet(num_classes: int = 1000) -> Sequential:
    """The original two-group Caffe AlexNet on 3x227x227 input (LRN and dropout omitted:
    neither has parameters, and neither is a layer kind here)."""
    return Sequential([
        Conv2d(out_channels=96, kernel=11, stride=4, name="conv1"), ReLU(name="relu1"),
        MaxPool2d(kernel=3, stride=2, name="pool1"),
        Conv2d(out_channels=256, kernel=5, padding=2, groups=2, name="conv2"), ReLU(name="relu2"),
        MaxPool2d(kernel=3, stride=2, name="pool2"),
        Conv2d(out_channels=384, kernel=3, padding=1, name="conv3"), ReLU(name="relu3"),
        Conv2d(out_channels=384, kernel=3, padding=1, groups=2, name="conv4"), ReLU(name="relu4"),
        Conv2d(out_channels=256, kernel=3, padding=1, groups=2, name="conv5"), ReLU(name="relu5"),
        MaxPool2d(kernel=3, stride=2, name="pool5"),
        Flatten(name="flatten"),
        Dense(out_features=4096, name="fc6"), ReLU(name="relu6"),
        Dense(out_features=4096, name="fc7"), ReLU(name="relu7"),
        Dense(out_features=num_classes, name="fc8"),
    ], input_shape=(3, 227, 227), name="alexnet")


MODELS: dict[str, Callable[[], Sequential]] = {"lenet": lenet, "alexnet": alexnet}


def get(name: str) -> Sequential:
    """Return the built-in model called ``name``; raise ModelError listing the choices."""
    try:
        return MODELS[name]()
    except KeyError:
        raise ModelError(f"unknown model {name!r}; choose one of {sorted(MODELS)}") from None
