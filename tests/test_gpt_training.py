"""A GPT trained data-parallel on real English text: the token batches, dropout drawn in the core on every
backend, the warmup-cosine schedule, checkpoint and resume, sampling, the fortunes corpus and its checks,
the command line, and (slow) the validation loss each framework reaches, in one process and in two."""

from __future__ import annotations

import hashlib
import math
import shutil

import numpy as np
import pytest
from conftest import BACKENDS

import multigpu
from multigpu.cli import main
from multigpu.data import CharTokenizer, load_fortunes
from multigpu.data.fortunes import FILES, SYSTEM_DIR
from multigpu.errors import DataError, DataNotFoundError, InputError, ModelError
from multigpu.models import generate, gpt
from multigpu.optim.schedules import make_schedule, warmup_cosine
from multigpu.parallel.data_parallel import DataParallel
from multigpu.parallel.token_batches import IGNORE_INDEX
from multigpu.training import Callback, Trainer

# The corpus is Debian's fortunes package (.ci/run installs it); without it these tests fail with
# DataNotFoundError naming the package, as a user's run would.


def tiny_gpt(dropout: float = 0.1, **kw) -> multigpu.Model:
    sizes = dict(vocab_size=97, hidden=32, layers=2, heads=4, ffn=64, max_positions=16, seq_len=16)
    return gpt(**{**sizes, "dropout": dropout, "attention_dropout": dropout, **kw})


def batch(seed: int = 0, shape=(6, 16), vocab: int = 97) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, vocab, shape).astype(np.int64)
    labels = np.roll(ids, -1, axis=1)
    labels[:, -1] = IGNORE_INDEX  # the last position has no next token
    return ids, labels


def losses(backend: str, devices, steps: int = 3, model=None, **kw) -> list[float]:
    dp = DataParallel(model or tiny_gpt(), backend=backend, devices=devices, optimizer="adamw", lr=3e-3, seed=5, **kw)
    return [dp.train_batch(*batch(s)) for s in range(steps)]


# -- one step: the global count, dropout from the core, every backend ------------------------------
def test_the_loss_is_the_mean_over_counted_positions_of_the_global_batch():
    model = tiny_gpt(dropout=0.0)
    params = model.init_params(1)
    ids, labels = batch()
    labels[0, :10] = IGNORE_INDEX  # an uneven count per shard: 5 + 15 + 15 + ... counted positions
    dp = DataParallel(model, backend="numpy", devices="cpu:2", params=params, optimizer="sgd", lr=0.1)
    got = dp.train_batch(ids, labels)
    ref = multigpu.backend("numpy")
    dev = multigpu.Device("cpu", 0)
    logits = ref.to_numpy(
        model.run(ref, [ref.from_numpy(p, dev) for p in params], {"input_ids": ref.from_numpy(ids, dev)},
                  context=multigpu.models.RunContext(devices=[dev]))[model.output]
    )  # fmt: skip
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    keep = labels != IGNORE_INDEX
    want = -np.take_along_axis(logp, np.where(keep, labels, 0)[..., None], -1)[..., 0][keep].mean()
    assert got == pytest.approx(float(want), rel=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_with_dropout_the_same_seed_gives_the_same_losses_on_every_backend(backend):
    want = losses("numpy", "cpu:2")
    assert len(set(want)) == 3 and want[2] < want[0]  # they move, and dropout is on (see the next test)
    np.testing.assert_allclose(losses(backend, "cpu:2"), want, rtol=2e-5)


def test_dropout_masks_follow_the_global_rows_not_the_device_count():
    one, two, three = losses("numpy", 1), losses("numpy", "cpu:2"), losses("numpy", "cpu:3")
    np.testing.assert_allclose(two, one, rtol=1e-5)
    np.testing.assert_allclose(three, one, rtol=1e-5)
    without = losses("numpy", "cpu:2", model=tiny_gpt(dropout=0.0))
    assert abs(without[0] - one[0]) > 1e-4  # the masks changed the loss: dropout was on


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_padded_batch_with_a_mask_trains_the_same_on_one_and_two_devices(backend):
    ids, labels = batch(2)
    mask = np.ones_like(ids)
    mask[1, 9:] = mask[4, 3:] = 0  # padding: not attended to, and its labels not counted
    labels[mask == 0] = IGNORE_INDEX
    feeds = {"input_ids": ids, "attention_mask": mask}

    def run(devices):
        dp = DataParallel(tiny_gpt(mask=True), backend=backend, devices=devices, optimizer="adamw", lr=3e-3, seed=2)
        return [dp.train_batch(feeds, labels) for _ in range(2)], dp.token_loss(feeds, labels, batch_size=2)

    (one, val1), (two, val2) = run(1), run("cpu:2")
    np.testing.assert_allclose(two, one, rtol=2e-5)
    assert val2 == pytest.approx(val1, rel=2e-5) and val1 < one[0]


def test_a_token_batch_refuses_bad_labels_and_feeds():
    dp = DataParallel(tiny_gpt(), backend="numpy", devices=1, optimizer="adamw", lr=1e-3)
    ids, labels = batch()
    with pytest.raises(InputError, match=r"labels have shape \(6, 15\) but input_ids \(6, 16\)"):
        dp.train_batch(ids, labels[:, :15])
    with pytest.raises(InputError, match="label 97 is out of range; .* classes 0..96"):
        dp.train_batch(ids, np.full_like(labels, 97))
    with pytest.raises(InputError, match="every label of the batch is -100"):
        dp.train_batch(ids, np.full_like(labels, IGNORE_INDEX))
    with pytest.raises(InputError, match="token ids must be integers"):
        dp.train_batch(ids.astype(np.float32), labels)
    with pytest.raises(InputError, match=r"lacks \['input_ids'\]"):
        dp.train_batch({}, labels)
    with pytest.raises(ModelError, match="token_loss is for token models"):
        DataParallel(multigpu.models.lenet(), backend="numpy").token_loss(ids, labels)


# -- the schedule -------------------------------------------------------------------------------------
def test_warmup_then_cosine_down_to_the_floor():
    f = [warmup_cosine(s, total=10, warmup=2, floor=0.1) for s in range(11)]
    assert f[:2] == [0.5, 1.0]
    assert f[2] == pytest.approx(1.0) and f[10] == pytest.approx(0.1)
    assert f[6] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(f[2:], f[3:]))
    assert make_schedule("constant", 10, 4)(1) == 0.5 and make_schedule(None, 10)(7) == 1.0
    assert make_schedule(lambda s: 0.25, 10)(3) == 0.25
    with pytest.raises(InputError, match="lr_schedule='linear' is unknown; use one of"):
        make_schedule("linear", 10)
    with pytest.raises(InputError, match="lr_schedule and lr_scaling"):
        Trainer(tiny_gpt(), lr_schedule="cosine", lr_scaling="linear")


# -- the corpus -----------------------------------------------------------------------------------------
def test_the_fortunes_corpus_is_real_english_split_and_windowed():
    c = load_fortunes(seq_len=64)
    text = c.tokenizer.decode(c.train_tokens[:20000])
    assert text.count(" the ") > 100 and "--" in text  # quotations and their authors
    assert len(c.train_tokens) + len(c.val_tokens) > 600_000
    assert len(c.val_tokens) == pytest.approx(0.1 * (len(c.train_tokens) + len(c.val_tokens)), abs=2)
    np.testing.assert_array_equal(c.train_labels[:, :-1], c.train_ids[:, 1:])  # the next token
    assert c.train_ids.shape[1] == 64 and c.val_ids.shape[1] == 64
    tok = CharTokenizer()
    assert tok.decode(tok.encode("Hi!\n~é")) == "Hi!\n~?"


def test_a_missing_or_changed_corpus_file_is_named_with_the_package_to_install(tmp_path):
    with pytest.raises(DataNotFoundError, match=r"install the Debian package 'fortunes' \(apt-get install fortunes\)"):
        load_fortunes(folder=tmp_path)
    for name in FILES:
        shutil.copy(SYSTEM_DIR / name, tmp_path / name)
    bad = tmp_path / "wisdom"
    bad.write_bytes(bad.read_bytes() + b"x")
    digest = hashlib.sha256(bad.read_bytes()).hexdigest()
    with pytest.raises(DataError, match=f"has SHA-256 {digest}, not {FILES['wisdom']}"):
        load_fortunes(folder=tmp_path)


# -- the Trainer: validation loss, checkpoint and resume ------------------------------------------------
class StopAfterOneEpoch(Callback):
    """An interrupted run: it ends after its first epoch, with the schedule of the whole run."""

    def on_epoch_end(self, trainer, epoch, logs):
        trainer.stop_training = True


def test_checkpoint_and_resume_continue_the_same_losses(tmp_path):
    corpus = load_fortunes(seq_len=16)
    kw = dict(backend="numpy", devices="cpu:2", batch_size=8, lr=3e-3, optimizer="adamw", progress=False)
    kw.update(lr_schedule="cosine", warmup_steps=2, num_epochs=2, seed=4)
    limits = dict(train_limit=32, test_limit=16)
    whole = Trainer(tiny_gpt(), **kw).fit(corpus, **limits)
    Trainer(tiny_gpt(), **kw, checkpoint=tmp_path, callbacks=[StopAfterOneEpoch()]).fit(corpus, **limits)
    resumed = Trainer(tiny_gpt(), **kw, checkpoint=tmp_path).fit(corpus, **limits)
    assert len(whole.step_loss) == 8 and len(whole.val_loss) == 2 and whole.test_acc == []
    np.testing.assert_allclose(resumed.step_loss, whole.step_loss, rtol=1e-6)
    np.testing.assert_allclose(resumed.val_loss, whole.val_loss, rtol=1e-6)
    for a, b in zip(resumed.params, whole.params):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_an_image_model_on_text_is_refused():
    with pytest.raises(ModelError, match="takes images but the data are text"):
        Trainer(multigpu.models.lenet(), backend="numpy", progress=False).fit(load_fortunes(16))


# -- sampling --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_decoding_is_deterministic_and_equal_on_every_backend(backend):
    model = tiny_gpt(dropout=0.1, max_positions=12, seq_len=12)  # 4 prompt ids + 12 new: the window slides
    params = model.init_params(3, scale=0.5)  # larger weights: distinct argmaxes
    prompt = CharTokenizer().encode("The ")
    want = generate("numpy", model, params, prompt, 12)
    assert list(want[:4]) == list(prompt) and len(want) == 16 and len(set(want[4:].tolist())) > 1
    np.testing.assert_array_equal(generate(backend, model, params, prompt, 12), want)
    hot = generate(backend, model, params, prompt, 12, temperature=1.0, seed=9)
    np.testing.assert_array_equal(hot, generate("numpy", model, params, prompt, 12, temperature=1.0, seed=9))
    assert not np.array_equal(hot, want)
    with pytest.raises(InputError, match="temperature"):
        generate(backend, model, params, prompt, 3, temperature=-1.0)


# -- the command line --------------------------------------------------------------------------------------
def test_multigpu_train_runs_a_gpt_with_progress_and_a_loss_plot(tmp_path, capsys):
    plot = tmp_path / "loss.png"
    code = main(
        ["train", "--model", "gpt", "--backend", "numpy", "--devices", "cpu:2", "--batch-size", "2", "--epochs",
         "1", "--train-limit", "2", "--test-limit", "2", "--optimizer", "adamw", "--lr", "1e-3", "--lr-schedule",
         "cosine", "--warmup-steps", "1", "--plot", str(plot)]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "epoch 1/1: val loss " in out and "final val loss " in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- slow: the validation loss each framework reaches, in one process and across two -------------------------
#: The slow run: a 1.38M-parameter GPT (3 blocks of width 192) on 64-character windows, 2 CPU replicas, AdamW at
#: 1e-2 with 10 warmup steps and a cosine down to 1e-3, 120 steps of 32 windows (2 epochs of 60).
SLOW_RUN = dict(devices="cpu:2", batch_size=32, lr=1e-2, num_epochs=2, optimizer="adamw", lr_schedule="cosine")
SLOW_RUN.update(warmup_steps=10, lr_floor=0.1, progress=False, seed=0)
SLOW_LIMITS = dict(train_limit=32 * 60, test_limit=256)


def slow_gpt() -> multigpu.Model:
    return gpt(vocab_size=97, hidden=192, layers=3, heads=4, max_positions=64, seq_len=64)


@pytest.fixture
def one_torch_thread():
    """torch's intra-op threads spin on a shared 2-core machine (10x slower per step here); one is honest."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_validation_loss_falls_below_the_unigram_entropy(backend, request):
    if backend == "torch":
        request.getfixturevalue("one_torch_thread")
    corpus = load_fortunes(seq_len=64)
    model = slow_gpt()
    assert 1e6 <= sum(p.size for p in model.init_params(seed=0)) <= 1e7  # the "about 1 to 10 M parameters"
    result = Trainer(model, backend=backend, **SLOW_RUN).fit(corpus, **SLOW_LIMITS)
    # ln 97 = 4.57 at the start (uniform); the corpus's character unigram entropy is 3.19 nats
    assert result.step_loss[0] == pytest.approx(math.log(97), abs=0.1)
    assert result.val_loss[0] > result.val_loss[1]
    print(f"\n{backend}: validation loss after 60 and 120 steps {result.val_loss}; training loss every 10 steps "
          f"{[round(v, 3) for v in result.step_loss[::10]]}")  # fmt: skip
    # Below the unigram entropy: the model uses context (2.94-3.01 on the four backends, which part ways
    # after ~100 float32 steps).
    assert result.val_loss[-1] < 3.1, result.val_loss


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_processes_train_the_gpt_as_one_process_with_two_devices(backend):
    corpus = load_fortunes(seq_len=16)
    args = dict(backend=backend, batch_size=8, lr=3e-3, optimizer="adamw", lr_schedule="cosine", warmup_steps=2)
    args.update(num_epochs=2, progress=False, seed=1, data=corpus, train_limit=32, test_limit=16)
    two = multigpu.train(tiny_gpt(), devices=1, processes=2, **args)
    one = multigpu.train(tiny_gpt(), devices="cpu:2", **args)
    assert two.processes == 2 and len(two.step_loss) == 8
    np.testing.assert_allclose(two.step_loss, one.step_loss, rtol=1e-5)
    np.testing.assert_allclose(two.val_loss, one.val_loss, rtol=1e-5)
