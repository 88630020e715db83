"""The Python API: ``train(model, *, ...)`` over a ``Trainer`` with callbacks, one set of defaults
shared with ``DataParallel`` and the command line, He init for user models, the README's layers
exported, and no long functions in ``multigpu/training``."""

from __future__ import annotations

import ast
import inspect
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from idx_files import write_learnable_set

import multigpu
from multigpu.cli.main import build_parser
from multigpu.contract.registry import default_backend
from multigpu.data import load_fashion_mnist
from multigpu.errors import InputError, ModelError
from multigpu.parallel.data_parallel import DEFAULT_LR
from multigpu.training import Callback, Trainer
from multigpu.training.trainer import DEFAULT_BATCH_SIZE

ROOT = Path(__file__).resolve().parents[1]
#: The most lines a function in multigpu/training may take (the issue's "about 60"), from its
#: ``def`` to its last line, the docstring not counted.
MAX_LINES = 60


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = write_learnable_set(tmp_path_factory.mktemp("fm"), n_train=192, n_test=48)
    return load_fashion_mnist(folder, verify=False)


def _kw(data, **extra):
    return dict(backend="numpy", devices="cpu:2", batch_size=64, lr=0.3, data=data, progress=False, **extra)


def test_train_takes_the_model_first_and_everything_else_by_keyword():
    params = list(inspect.signature(multigpu.train).parameters.values())
    assert params[0].name == "model" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])
    assert "devices" in {p.name for p in params}
    with pytest.raises(TypeError):
        multigpu.train("lenet", "numpy")  # type: ignore[misc]
    with pytest.raises(ModelError, match="is a backend, not a model.*backend='torch'"):
        multigpu.train("torch")


def test_one_set_of_defaults_in_train_dataparallel_and_the_cli():
    train = inspect.signature(multigpu.train).parameters
    trainer = inspect.signature(Trainer).parameters
    dp = inspect.signature(multigpu.DataParallel).parameters
    cli = build_parser().parse_args(["train"])
    assert train["lr"].default == trainer["lr"].default == dp["lr"].default == cli.lr == DEFAULT_LR
    assert train["batch_size"].default == trainer["batch_size"].default == cli.batch_size == DEFAULT_BATCH_SIZE
    # no backend means the same rule everywhere: the launched job's, else the first installed framework
    assert train["backend"].default is None and dp["backend"].default is None and cli.backend is None
    launch = build_parser().parse_args(["launch", "--", "train"])
    assert launch.backend is None
    tr = multigpu.DataParallel(multigpu.models.lenet(), devices="cpu:1")
    assert tr.backend.name == default_backend() and tr.lr == DEFAULT_LR


def test_num_gpus_still_works_with_a_future_warning(data):
    with pytest.warns(FutureWarning, match="num_gpus=.*use devices="):
        old = multigpu.train(num_gpus="cpu:2", num_epochs=1, **{k: v for k, v in _kw(data).items() if k != "devices"})
    new = multigpu.train(num_epochs=1, **_kw(data))
    assert old.devices == new.devices and old.train_loss == new.train_loss
    with pytest.raises(InputError, match="give devices only"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        multigpu.train(num_gpus=2, **_kw(data))


def test_user_models_default_to_he_init_and_lenet_keeps_the_textbooks():
    net = multigpu.Sequential([multigpu.Flatten(), multigpu.Dense(out_features=10)], input_shape=(1, 28, 28))
    assert net.init == "he" and multigpu.Model([multigpu.Flatten(), multigpu.Dense(10)], (1, 4, 4)).init == "he"
    assert multigpu.models.lenet().init == "textbook"
    w = multigpu.models.lenet().init_params(0)[0]
    assert abs(w.std() - 0.01) < 0.002  # N(0, 0.01^2)
    asked = multigpu.Sequential([multigpu.Flatten(), multigpu.Dense(10)], (1, 28, 28), init="textbook")
    assert abs(asked.init_params(0)[0].std() - 0.01) < 0.002


def test_every_layer_and_block_the_readme_names_is_exported():
    text = (ROOT / "README.md").read_text()
    para = text[text.index("What a model may contain") :]
    para = para[: para.index("\n\n")]
    names = set(re.findall(r"`([A-Z][A-Za-z0-9]+)`", para))
    assert {"BatchNorm2d", "GlobalAvgPool2d", "Residual", "Parallel", "AvgPool2d"} <= names
    assert sorted(n for n in names if not hasattr(multigpu, n)) == []
    for name in ("Chain", "Add", "Concat", "Identity", "Trainer", "Callback"):
        assert name in multigpu.__all__


class Recorder(Callback):
    """Records every hook in order; stops after ``stop_after`` epochs."""

    def __init__(self, stop_after=None):
        self.calls, self.stop_after = [], stop_after

    def on_fit_start(self, trainer):
        self.calls.append(("fit_start", len(trainer.result.test_acc)))

    def on_epoch_start(self, trainer, epoch, steps):
        self.calls.append(("epoch_start", epoch, steps))

    def on_batch_end(self, trainer, epoch, step, loss):
        self.calls.append(("batch", epoch, step))

    def on_epoch_end(self, trainer, epoch, logs):
        self.calls.append(("epoch_end", epoch, round(logs["test_acc"], 6), len(trainer.result.test_acc)))
        if self.stop_after is not None and epoch + 1 >= self.stop_after:
            trainer.stop_training = True

    def on_checkpoint(self, trainer, epoch, path):
        self.calls.append(("checkpoint", epoch, Path(path).name))

    def on_fit_end(self, trainer, result):
        self.calls.append(("fit_end", len(result.test_acc)))


def test_trainer_calls_the_callbacks_in_keras_order_and_stops_when_asked(data, tmp_path):
    rec = Recorder(stop_after=2)
    trainer = Trainer(
        "lenet",
        num_epochs=5,
        checkpoint=tmp_path,
        callbacks=[rec],
        **{k: v for k, v in _kw(data).items() if k != "data"},
    )
    result = trainer.fit(data)
    assert len(result.test_acc) == 2  # stop_training after epoch 2 of 5
    accs = [round(a, 6) for a in result.test_acc]
    assert rec.calls == [
        ("fit_start", 0),
        ("epoch_start", 0, 3),
        ("batch", 0, 0),
        ("batch", 0, 1),
        ("batch", 0, 2),
        ("checkpoint", 0, "checkpoint.npz"),  # the built-in checkpoint runs before the user's callbacks
        ("epoch_end", 0, accs[0], 1),
        ("epoch_start", 1, 3),
        ("batch", 1, 0),
        ("batch", 1, 1),
        ("batch", 1, 2),
        ("checkpoint", 1, "checkpoint.npz"),  # the built-in checkpoint runs before the user's callbacks
        ("epoch_end", 1, accs[1], 2),
        ("fit_end", 2),
    ]
    with pytest.raises(InputError, match="already fitted"):
        trainer.fit(data)


def test_train_is_the_trainer_in_one_call(data):
    via_train = multigpu.train(num_epochs=2, **_kw(data))
    via_trainer = Trainer(num_epochs=2, **{k: v for k, v in _kw(data).items() if k != "data"}).fit(data)
    assert via_train.train_loss == via_trainer.train_loss and via_train.test_acc == via_trainer.test_acc
    for a, b in zip(via_train.params, via_trainer.params):
        np.testing.assert_array_equal(a, b)


def test_a_callback_that_is_not_one_is_refused_up_front(data):
    with pytest.raises(InputError, match="must be multigpu.training.Callback instances"):
        multigpu.train(callbacks=[print], **_kw(data))


def test_the_readme_small_cnn_learns_with_the_default_init(data):
    net = multigpu.Sequential(
        [
            multigpu.Conv2d(out_channels=8, kernel=3, padding=1),
            multigpu.ReLU(),
            multigpu.MaxPool2d(kernel=2),
            multigpu.Flatten(),
            multigpu.Dense(out_features=64),
            multigpu.ReLU(),
            multigpu.Dense(out_features=10),
        ],
        input_shape=(1, 28, 28),
        name="small_cnn",
    )
    result = multigpu.train(net, num_epochs=2, **_kw(data))
    assert result.train_loss[1] < result.train_loss[0] < np.log(10) and result.test_acc[-1] > 0.3


def _long_functions(folder: Path) -> list[str]:
    out = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                doc = node.body[0]
                if (
                    isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)
                ):
                    length -= doc.end_lineno - doc.lineno + 1
                if length > MAX_LINES:
                    out.append(f"{path.name}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_in_training_is_longer_than_about_60_lines():
    assert _long_functions(ROOT / "multigpu" / "training") == []


def test_the_length_check_finds_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    doc = '    """A docstring\n    of three lines,\n    not counted."""'
    (tmp_path / "long.py").write_text(f"def long():\n{doc}\n{body}\n\n\ndef short():\n{doc}\n{body[:-10]}\n")
    assert _long_functions(tmp_path) == [f"long.py:1 long ({MAX_LINES + 1} lines)"]
