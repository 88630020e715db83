"""Text from a causal language model: greedy decoding and sampling with a temperature, on any backend.

Each new token runs the model on the tokens so far (the last ``max_positions`` of them; no
key/value cache: the models this serves are small) and takes the logits of the last position.
Greedy decoding (``temperature=0``) takes the argmax; sampling divides the logits by the
temperature and draws from their softmax with a numpy generator seeded by ``seed``, on the
host, so the same seed gives the same text on every backend whose logits agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from multigpu.checks import check_count, check_number
from multigpu.contract.protocol import Device
from multigpu.errors import ModelError
from multigpu.models.context import RunContext
from multigpu.models.graph import Model
from multigpu.models.inputs import check_tokens
from multigpu.models.transformer_layers import PositionEmbedding


def _positions(model: Model) -> int:
    for node in model.nodes:
        if isinstance(node.layer, PositionEmbedding):
            return int(node.layer.max_positions)
    return int(model.input_shape[0])


def generate(
    backend: Any,
    model: Model,
    params: Sequence[Any],
    prompt: Sequence[int] | np.ndarray,
    steps: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    device: Device | None = None,
) -> np.ndarray:
    """Return the prompt's ids followed by ``steps`` new ones (int64, 1-D) from a causal model.

    ``backend`` is a backend object (``multigpu.backend("torch")``) or its name, ``params`` the
    model's parameters (numpy arrays or tensors on ``device``, default ``Device("cpu", 0)``),
    ``prompt`` at least one token id. ``temperature=0`` decodes greedily; above 0 it samples.
    Raises ModelError for a model with several inputs, InputError for bad ids, and
    InputError for a negative temperature or a step count below 1.
    """
    from multigpu.contract.registry import backend as get_backend

    b = get_backend(backend) if isinstance(backend, str) else backend
    if len(model.input_names) != 1:
        raise ModelError(
            f"generate runs a model on token ids alone; {model.name!r} takes {list(model.input_names)} "
            "(build it with mask=False)"
        )
    check_count(steps, "steps", example=200)
    check_number(temperature, "temperature", minimum=0.0, example=0.8)
    ids, _ = check_tokens(model, np.asarray(prompt).reshape(1, -1))
    device = Device("cpu", 0) if device is None else device
    tensors = [p if not isinstance(p, np.ndarray) else b.from_numpy(p.astype(np.float32), device) for p in params]
    window = _positions(model)
    rng = np.random.default_rng(seed)
    out = list(ids[0])
    for _ in range(steps):
        context = out[-window:]
        feeds = {model.input_names[0]: b.from_numpy(np.asarray([context], np.int64), device)}
        logits = b.to_numpy(model.run(b, tensors, feeds, context=RunContext(devices=[device]))[model.output])
        last = logits[0, -1].astype(np.float64)
        if temperature == 0:
            out.append(int(np.argmax(last)))
            continue
        z = last / temperature
        p = np.exp(z - z.max())
        out.append(int(rng.choice(len(p), p=p / p.sum())))
    return np.asarray(out, np.int64)
