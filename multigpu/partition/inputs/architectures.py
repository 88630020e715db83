"""Layer graphs of published architectures, computed from their definitions: ResNet-18,
ResNet-50 (He et al. 2016, in torchvision's layout: the stride on the 3x3 convolution
of a bottleneck) and GoogLeNet, the Inception v1 network (Szegedy et al. 2015, in
torchvision's layout: BatchNorm after every convolution, 3x3 instead of 5x5 in the
third branch, ceil-mode max pools, no auxiliary classifiers). The shipped graph files
(``multigpu/partition/inputs/graphs/``) are written by this module, never by hand:

    python -m multigpu.partition.inputs.architectures            # rewrite the files
    python -m multigpu.partition.inputs.architectures --check    # exit 1 if they differ

One node per operation, named as torchvision names the modules (``layer2.0.conv1``,
``inception4a.branch2.1.conv``), with ``add`` and ``cat`` nodes where branches join.
Accounting, per node for a batch (the conventions of ``multigpu.models``' layer stats):
FLOPs = 2 x multiply-accumulates for convolutions and dense layers (biases not
counted), 2 per element for BatchNorm, 1 per element for ReLU and for a global average
pool's input, k x k per output element for a k x k pool, one per element and extra
input for an add, none for a concatenation or a flatten; parameter bytes = 4 per
weight, bias and BatchNorm scale and shift (the running statistics are state, not
parameters); output bytes = 4 per output element (float32).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from multigpu.partition.inputs.graph import INPUT, Graph, LayerSpec

__all__ = ["ARCHITECTURES", "googlenet", "resnet18", "resnet50", "write_shipped"]

BYTES = 4
Shape = tuple[int, int, int]


class _Builder:
    """Appends nodes, tracking each output's (C, H, W)."""

    def __init__(self, image: int, batch: int) -> None:
        self.batch = batch
        self.layers: list[LayerSpec] = []
        self.shape: dict[str, Shape] = {INPUT: (3, image, image)}

    def _add(self, name: str, inputs: Sequence[str], out: Shape, flops: float, params: int) -> str:
        self.layers.append(
            LayerSpec(
                name=name,
                flops=float(self.batch * flops),
                param_bytes=float(params * BYTES),
                output_bytes=float(self.batch * math.prod(out) * BYTES),
                inputs=tuple(inputs),
            )
        )
        self.shape[name] = out
        return name

    def conv(self, name: str, x: str, cout: int, k: int, stride: int = 1, pad: int = 0, bias: bool = False) -> str:
        c, h, w = self.shape[x]
        out = (cout, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
        return self._add(name, [x], out, 2 * math.prod(out) * c * k * k, cout * c * k * k + (cout if bias else 0))

    def bn(self, name: str, x: str) -> str:
        s = self.shape[x]
        return self._add(name, [x], s, 2 * math.prod(s), 2 * s[0])

    def relu(self, name: str, x: str) -> str:
        s = self.shape[x]
        return self._add(name, [x], s, math.prod(s), 0)

    def maxpool(self, name: str, x: str, k: int, stride: int, pad: int = 0, ceil: bool = False) -> str:
        c, h, w = self.shape[x]

        def size(n: int) -> int:
            span = n + 2 * pad - k
            out = (-(-span // stride) if ceil else span // stride) + 1
            # A ceil-mode window must start inside the input (torch's rule).
            return out - 1 if ceil and (out - 1) * stride >= n + pad else out

        out = (c, size(h), size(w))
        return self._add(name, [x], out, math.prod(out) * k * k, 0)

    def avgpool(self, name: str, x: str) -> str:
        s = self.shape[x]
        return self._add(name, [x], (s[0], 1, 1), math.prod(s), 0)

    def flatten(self, name: str, x: str) -> str:
        return self._add(name, [x], (math.prod(self.shape[x]), 1, 1), 0, 0)

    def dense(self, name: str, x: str, out: int) -> str:
        cin = math.prod(self.shape[x])
        return self._add(name, [x], (out, 1, 1), 2 * cin * out, cin * out + out)

    def add(self, name: str, xs: Sequence[str]) -> str:
        s = self.shape[xs[0]]
        return self._add(name, xs, s, (len(xs) - 1) * math.prod(s), 0)

    def cat(self, name: str, xs: Sequence[str]) -> str:
        c = sum(self.shape[x][0] for x in xs)
        return self._add(name, xs, (c, *self.shape[xs[0]][1:]), 0, 0)

    def graph(self, name: str) -> Graph:
        return Graph(
            tuple(self.layers), input_bytes=float(self.batch * math.prod(self.shape[INPUT]) * BYTES), name=name
        )


def _resnet_stem(b: _Builder) -> str:
    x = b.conv("conv1", INPUT, 64, 7, 2, 3)
    x = b.relu("relu", b.bn("bn1", x))
    return b.maxpool("maxpool", x, 3, 2, 1)


def _resnet_head(b: _Builder, x: str, classes: int) -> None:
    b.dense("fc", b.flatten("flatten", b.avgpool("avgpool", x)), classes)


def _shortcut(b: _Builder, p: str, x: str, cout: int, stride: int) -> str:
    if stride == 1 and b.shape[x][0] == cout:
        return x
    return b.bn(f"{p}.downsample.1", b.conv(f"{p}.downsample.0", x, cout, 1, stride))


def resnet18(batch: int = 1, image: int = 224, classes: int = 1000) -> Graph:
    """ResNet-18's graph: basic blocks (two 3x3 convolutions) of 64, 128, 256, 512 channels."""
    b = _Builder(image, batch)
    x = _resnet_stem(b)
    for s, width in enumerate((64, 128, 256, 512)):
        for i in range(2):
            p, stride = f"layer{s + 1}.{i}", (2 if s and not i else 1)
            y = b.relu(f"{p}.relu1", b.bn(f"{p}.bn1", b.conv(f"{p}.conv1", x, width, 3, stride, 1)))
            y = b.bn(f"{p}.bn2", b.conv(f"{p}.conv2", y, width, 3, 1, 1))
            x = b.relu(f"{p}.relu2", b.add(f"{p}.add", [y, _shortcut(b, p, x, width, stride)]))
    _resnet_head(b, x, classes)
    return b.graph("resnet18")


def resnet50(batch: int = 1, image: int = 224, classes: int = 1000) -> Graph:
    """ResNet-50's graph: bottlenecks (1x1, 3x3, 1x1 to four times the width) of widths
    64, 128, 256, 512, three, four, six and three of them."""
    b = _Builder(image, batch)
    x = _resnet_stem(b)
    for s, (width, count) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for i in range(count):
            p, stride = f"layer{s + 1}.{i}", (2 if s and not i else 1)
            y = b.relu(f"{p}.relu1", b.bn(f"{p}.bn1", b.conv(f"{p}.conv1", x, width, 1)))
            y = b.relu(f"{p}.relu2", b.bn(f"{p}.bn2", b.conv(f"{p}.conv2", y, width, 3, stride, 1)))
            y = b.bn(f"{p}.bn3", b.conv(f"{p}.conv3", y, 4 * width, 1))
            x = b.relu(f"{p}.relu3", b.add(f"{p}.add", [y, _shortcut(b, p, x, 4 * width, stride)]))
    _resnet_head(b, x, classes)
    return b.graph("resnet50")


def _basic(b: _Builder, p: str, x: str, cout: int, k: int, stride: int = 1, pad: int = 0) -> str:
    """torchvision's BasicConv2d: convolution without bias, BatchNorm, ReLU."""
    return b.relu(f"{p}.relu", b.bn(f"{p}.bn", b.conv(f"{p}.conv", x, cout, k, stride, pad)))


# (1x1, 3x3 reduce, 3x3, 3x3 reduce, 3x3, pool projection) per module: torchvision's GoogLeNet.
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


def googlenet(batch: int = 1, image: int = 224, classes: int = 1000) -> Graph:
    """GoogLeNet (Inception v1): a stem, nine Inception modules of four branches each joined
    by a concatenation, max pools between stages, a global pool and the classifier."""
    b = _Builder(image, batch)
    x = _basic(b, "conv1", INPUT, 64, 7, 2, 3)
    x = b.maxpool("maxpool1", x, 3, 2, ceil=True)
    x = _basic(b, "conv2", x, 64, 1)
    x = _basic(b, "conv3", x, 192, 3, 1, 1)
    x = b.maxpool("maxpool2", x, 3, 2, ceil=True)
    for name, (c1, r3, c3, r5, c5, cp) in INCEPTION.items():
        p = f"inception{name}"
        one = _basic(b, f"{p}.branch1", x, c1, 1)
        two = _basic(b, f"{p}.branch2.1", _basic(b, f"{p}.branch2.0", x, r3, 1), c3, 3, 1, 1)
        three = _basic(b, f"{p}.branch3.1", _basic(b, f"{p}.branch3.0", x, r5, 1), c5, 3, 1, 1)
        four = _basic(b, f"{p}.branch4.1", b.maxpool(f"{p}.branch4.0", x, 3, 1, 1, ceil=True), cp, 1)
        x = b.cat(f"{p}.cat", [one, two, three, four])
        if name == "3b":
            x = b.maxpool("maxpool3", x, 3, 2, ceil=True)
        elif name == "4e":
            x = b.maxpool("maxpool4", x, 2, 2, ceil=True)
    b.dense("fc", b.flatten("flatten", b.avgpool("avgpool", x)), classes)
    return b.graph("inception")


ARCHITECTURES: dict[str, Callable[..., Graph]] = {"resnet18": resnet18, "resnet50": resnet50, "inception": googlenet}
#: The shipped files: batch 1 at 224 x 224 (an ImageNet inference), 1000 classes.
SHIPPED = ARCHITECTURES


def _text(graph: Graph) -> str:
    return json.dumps(graph.to_dict(), indent=1) + "\n"


def write_shipped(folder: Path, check: bool = False) -> list[str]:
    """Write (or with ``check`` compare) every shipped graph file in ``folder``; return the
    names that were written (or differ)."""
    out = []
    for name, build in SHIPPED.items():
        path = folder / f"{name}.json"
        text = _text(build())
        if path.exists() and path.read_text() == text:
            continue
        out.append(name)
        if not check:
            path.write_text(text)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the shipped graph files, or with ``--check`` report whether they differ."""
    p = argparse.ArgumentParser(
        prog="python -m multigpu.partition.inputs.architectures",
        description="Write the shipped graph files from the published architectures.",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("graphs"), help="folder (default: shipped)")
    p.add_argument("--check", action="store_true", help="exit 1 if a file differs from what would be written")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    changed = write_shipped(args.out, check=args.check)
    for name in changed:
        print(f"{'differs' if args.check else 'wrote'}: {args.out / (name + '.json')}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
