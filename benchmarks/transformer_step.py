"""``transformer_step``: a GPT training step and a MiniLM forward, ours against each framework's own modules.

For each framework, in its own process, on one CPU device, these run alternately:

* **GPT step** (AdamW): ``DataParallel(gpt(...), backend, devices=1, optimizer="adamw")`` against the
  same architecture written with the framework's own modules: torch ``nn.TransformerEncoderLayer``
  (``norm_first``, a causal mask, exact GELU), Paddle's ``nn.TransformerEncoderLayer``
  (``normalize_before``), and for MXNet Gluon blocks written by hand (Gluon 1.9 has none built in),
  each with the framework's own AdamW, embeddings, final LayerNorm and head. Beside each, the compiled
  mode: ``torch.compile``, ``paddle.jit.to_static``, Gluon ``hybridize``. Dropout is 0 in every case
  (the frameworks draw their own masks; ours draws them in the core), so the work is the same. Each
  timed call ends with the backend's ``synchronize`` (MXNet's ``waitall``), so an asynchronous engine's
  queued backward and update count in the step that queued them.
* **MiniLM forward** (torch only): all-MiniLM-L6-v2 on a padded batch of 32 sentences, ours on the
  torch backend against ``transformers``' ``BertModel`` on the same weights (``torch.no_grad``), and
  against ``torch.compile(BertModel)``; and the peak resident memory of that forward, each in a fresh
  process: the high-water mark (``VmHWM``) reset after the weights are loaded
  (``/proc/self/clear_refs``), then three forwards, minus the resident size before them.

Targets: GPT step ours / native <= 1.10 on torch and Paddle, <= 1.25 on MXNet; MiniLM forward <= 1.10;
its peak memory <= 1.3x. Ours / compiled is reported with no target.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from multigpu.benchmarks import harness
from multigpu.benchmarks.harness import Options, Result, Table, fmt_ms, fmt_ratio, ratio, summary

TITLE = "A GPT training step (AdamW) and a MiniLM forward: ours against each framework's own transformer modules"
IN_QUICK = False  # seconds per framework; compiling takes a minute

VOCAB, HIDDEN, LAYERS, HEADS, SEQ, BATCH = 97, 128, 2, 4, 64, 16
LR = 1e-3
TARGETS = {"torch": 1.10, "paddle": 1.10, "mxnet": 1.25}
MINILM_TARGET, MEMORY_TARGET = 1.10, 1.3
SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome.",
    "The cat sits outside on the mat in the warm afternoon sun.",
    "Someone is slicing a tomato on a wooden board.",
]


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64)
    return ids, np.roll(ids, -1, axis=1)


def _causal() -> np.ndarray:
    return np.triu(np.full((SEQ, SEQ), -np.inf, np.float32), k=1)


# -- the frameworks' own GPTs ----------------------------------------------------------------------
def _torch_gpt(compiled: bool) -> Any:
    import torch
    from torch import nn

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
            layer: dict[str, Any] = dict(
                dim_feedforward=4 * HIDDEN, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            self.h = nn.ModuleList(nn.TransformerEncoderLayer(HIDDEN, HEADS, **layer) for _ in range(LAYERS))
            self.ln_f, self.head = nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB)
            self.register_buffer("mask", torch.from_numpy(_causal()))
            self.register_buffer("pos", torch.arange(SEQ))

        def forward(self, ids: Any) -> Any:
            x = self.wte(ids) + self.wpe(self.pos)
            for block in self.h:
                x = block(x, src_mask=self.mask, is_causal=True)
            return self.head(self.ln_f(x))

    net = GPT()
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.01)
    fwd = torch.compile(net) if compiled else net
    ids, labels = (torch.from_numpy(a) for a in _batch())

    def step() -> None:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(fwd(ids).reshape(-1, VOCAB), labels.reshape(-1))
        loss.backward()
        opt.step()
        loss.item()

    step.params = sum(p.numel() for p in net.parameters())  # type: ignore[attr-defined]
    return step


def _paddle_gpt(compiled: bool) -> Any:
    import paddle
    from paddle import nn

    class GPT(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
            self.h = nn.LayerList(
                [
                    nn.TransformerEncoderLayer(
                        HIDDEN, HEADS, 4 * HIDDEN, dropout=0.0, activation="gelu", normalize_before=True
                    )
                    for _ in range(LAYERS)
                ]
            )
            self.ln_f, self.head = nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB)
            self.mask = paddle.to_tensor(_causal())
            self.pos = paddle.arange(SEQ)

        def forward(self, ids: Any) -> Any:
            x = self.wte(ids) + self.wpe(self.pos)
            for block in self.h:
                x = block(x, src_mask=self.mask)
            return self.head(self.ln_f(x))

    net = GPT()
    opt = paddle.optimizer.AdamW(learning_rate=LR, parameters=net.parameters(), weight_decay=0.01)
    fwd = paddle.jit.to_static(net, full_graph=True) if compiled else net
    ids, labels = (paddle.to_tensor(a) for a in _batch())

    def step() -> None:
        opt.clear_grad()
        loss = nn.functional.cross_entropy(fwd(ids).reshape([-1, VOCAB]), labels.reshape([-1]))
        loss.backward()
        opt.step()
        float(loss)

    step.params = sum(int(np.prod(p.shape)) for p in net.parameters())  # type: ignore[attr-defined]
    return step


def _mxnet_gpt(compiled: bool) -> Any:
    import mxnet as mx
    from mxnet import autograd, gluon
    from mxnet.gluon import nn

    class Block(gluon.HybridBlock):
        """A pre-norm causal decoder block by hand (Gluon 1.9 has no transformer layer)."""

        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.ln_1, self.ln_2 = nn.LayerNorm(in_channels=HIDDEN), nn.LayerNorm(in_channels=HIDDEN)
                self.qkv = nn.Dense(3 * HIDDEN, flatten=False, in_units=HIDDEN)
                self.proj = nn.Dense(HIDDEN, flatten=False, in_units=HIDDEN)
                self.fc = nn.Dense(4 * HIDDEN, flatten=False, in_units=HIDDEN)
                self.out = nn.Dense(HIDDEN, flatten=False, in_units=4 * HIDDEN)

        def hybrid_forward(self, F: Any, x: Any, mask: Any) -> Any:
            d = HIDDEN // HEADS
            qkv = self.qkv(self.ln_1(x)).reshape((0, 0, 3, HEADS, d)).transpose((2, 0, 3, 1, 4))
            q, k, v = F.split(qkv, 3, axis=0, squeeze_axis=True)  # each (B, H, T, d)
            q, k, v = (t.reshape((-3, 0, 0)) for t in (q, k, v))  # (B*H, T, d)
            att = F.softmax(F.broadcast_add(F.batch_dot(q, k, transpose_b=True) / d**0.5, mask), axis=-1)
            y = F.batch_dot(att, v).reshape((-4, -1, HEADS, 0, 0)).transpose((0, 2, 1, 3)).reshape((0, 0, -3))
            x = x + self.proj(y)
            return x + self.out(F.LeakyReLU(self.fc(self.ln_2(x)), act_type="gelu"))

    class GPT(gluon.HybridBlock):
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.wte, self.wpe = nn.Embedding(VOCAB, HIDDEN), nn.Embedding(SEQ, HIDDEN)
                self.h = nn.HybridSequential()
                for _ in range(LAYERS):
                    self.h.add(Block())
                self.ln_f = nn.LayerNorm(in_channels=HIDDEN)
                self.head = nn.Dense(VOCAB, flatten=False, in_units=HIDDEN)

        def hybrid_forward(self, F: Any, ids: Any, pos: Any, mask: Any) -> Any:
            x = F.broadcast_add(self.wte(ids), self.wpe(pos))
            for block in self.h:
                x = block(x, mask)
            return self.head(self.ln_f(x))

    net = GPT()
    net.initialize(mx.init.Normal(0.02))
    if compiled:
        net.hybridize(static_alloc=True, static_shape=True)
    # NOTE: MXNet 1.9's registry has no AdamW; "adam" with wd adds L2 to the gradient (the same work per step)
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": LR, "wd": 0.01})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    ids, labels = (mx.nd.array(a, dtype="int64") for a in _batch())
    pos, mask = mx.nd.arange(SEQ).reshape((1, SEQ)), mx.nd.array(np.nan_to_num(_causal(), neginf=-1e9))

    def step() -> None:
        with autograd.record():
            loss = loss_fn(net(ids, pos, mask).reshape((-1, VOCAB)), labels.reshape((-1,))).mean()
        loss.backward()
        trainer.step(1)
        loss.asscalar()

    step()  # Gluon's parameters get their shapes at the first call
    step.params = sum(int(np.prod(p.shape)) for p in net.collect_params().values())  # type: ignore[attr-defined]
    return step


NATIVE = {"torch": _torch_gpt, "paddle": _paddle_gpt, "mxnet": _mxnet_gpt}
COMPILED = {"torch": "torch.compile", "paddle": "paddle.jit.to_static", "mxnet": "hybridize"}


def measure_gpt(framework: str, repeat: int, warmup: int, progress: bool) -> dict[str, Any]:
    """In a fresh process: time our GPT step, the native one and the compiled native one."""
    import multigpu
    from multigpu.contract.devices import CPUFallbackWarning
    from multigpu.models import gpt

    model = gpt(VOCAB, HIDDEN, LAYERS, HEADS, max_positions=SEQ, seq_len=SEQ, dropout=0.0, attention_dropout=0.0,
                gelu_approximate=False)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CPUFallbackWarning)
        tr = multigpu.DataParallel(model, backend=framework, devices="cpu:1", lr=LR, optimizer="adamw")
    ids, labels = _batch()

    def ours() -> None:
        tr.train_batch(ids, labels)

    cases = {"ours": ours, "native": NATIVE[framework](False)}
    errors: dict[str, str] = {}
    try:
        compiled = NATIVE[framework](True)
        compiled()  # compile outside the timed rounds
        cases["compiled"] = compiled
    except Exception as exc:  # a compiler that fails here is reported, not fatal
        errors["compiled"] = f"{type(exc).__name__}: {str(exc)[:200]}"

    def sync() -> None:
        # NOTE: MXNet's engine is asynchronous: reading the loss waits only for the ops that write it, so
        # a Gluon step returns with its backward and update still queued (ours, with the end of its
        # update), and without this wait that work is timed in the next case's round. Every case waits for
        # all its work inside the timed region (waitall; a no-op for torch and Paddle on CPU).
        tr.backend.synchronize(tr.devices[0])

    bar = harness.progress_bar(repeat, f"transformer_step gpt {framework}", progress)
    wall, cpu = harness.interleaved_wall_cpu(
        cases, repeat, warmup, sync=sync, progress=bar.update, reverse_odd_rounds=True
    )
    bar.close()
    return {"samples": wall, "cpu_samples": cpu, "errors": errors, "params": model.num_params()}


# -- MiniLM forward, torch ------------------------------------------------------------------------
def _minilm_inputs() -> tuple[Any, Any]:
    from multigpu.models import SentenceEncoder

    tok = SentenceEncoder("all-MiniLM-L6-v2", backend="numpy")
    return tok.tokenize([SENTENCES[i % len(SENTENCES)] + " " * (i % 3) + "x" * (i % 5) for i in range(32)])


def _minilm_case(which: str) -> Any:
    """The forward ``which`` ("ours", "BertModel", "compiled") on the padded batch, as a callable."""
    import torch

    ids, mask = _minilm_inputs()
    if which == "ours":
        import multigpu
        from multigpu.models import RunContext, pretrained

        model, params = pretrained("all-MiniLM-L6-v2", seq_len=ids.shape[1])
        be, dev = multigpu.backend("torch"), multigpu.Device("cpu", 0)
        tensors = [be.from_numpy(p, dev) for p in params]
        feeds = {"input_ids": be.from_numpy(ids, dev), "attention_mask": be.from_numpy(mask, dev)}

        def ours() -> None:
            be.to_numpy(model.run(be, tensors, feeds, context=RunContext(devices=[dev]))[model.output])

        return ours
    from multigpu.backends.torch.torchvision_compat import torchvision_or_none

    torchvision_or_none()  # transformers imports an installed torchvision, whose compiled ops may not load here
    import transformers

    from multigpu.models.checkpoints import checkpoint_dir

    net = transformers.BertModel.from_pretrained(checkpoint_dir("all-MiniLM-L6-v2"), local_files_only=True).eval()
    fwd = torch.compile(net) if which == "compiled" else net
    t_ids, t_mask = torch.from_numpy(ids), torch.from_numpy(mask)

    def theirs() -> None:
        with torch.no_grad():
            fwd(input_ids=t_ids, attention_mask=t_mask).last_hidden_state.numpy()

    return theirs


def measure_minilm(repeat: int, warmup: int, progress: bool) -> dict[str, Any]:
    """In a fresh process: time our MiniLM forward on torch, BertModel's and the compiled BertModel's."""
    cases = {"ours": _minilm_case("ours"), "BertModel": _minilm_case("BertModel")}
    errors: dict[str, str] = {}
    try:
        compiled = _minilm_case("compiled")
        compiled()
        cases["compiled"] = compiled
    except Exception as exc:
        errors["compiled"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    bar = harness.progress_bar(repeat, "transformer_step minilm", progress)
    wall, cpu = harness.interleaved_wall_cpu(cases, repeat, warmup, progress=bar.update, reverse_odd_rounds=True)
    bar.close()
    return {"samples": wall, "cpu_samples": cpu, "errors": errors}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_memory(which: str) -> dict[str, float]:
    """In a fresh process: the peak resident memory of three MiniLM forwards (``which``), in MiB: the
    high-water mark reset after loading, minus the resident size before the forwards."""
    fn = _minilm_case(which)
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    before = _status_kib("VmRSS")
    for _ in range(3):
        fn()
    peak = _status_kib("VmHWM")
    return {"before_mib": before / 1024, "peak_mib": peak / 1024, "step_mib": (peak - before) / 1024}


# -- the report ---------------------------------------------------------------------------------------
def _met(r: float, goal: float | None) -> str:
    if goal is None:
        return "-"
    return "yes" if r <= goal else f"**no** (+{100 * (r / goal - 1):.1f}%)"


def run(opts: Options) -> Result:
    """Measure every framework's GPT step in its own process, then MiniLM's forward and memory on torch."""
    repeat, warmup = opts.repeats(20, 4), opts.repeats(3, 1)
    data: dict[str, Any] = {}
    rows = []
    for fw in opts.frameworks():
        data[fw] = got = harness.isolated(
            f"{__package__}.transformer_step:measure_gpt", fw, repeat, warmup, opts.progress
        )
        s = got["samples"]
        r = ratio(s["ours"], s["native"])
        rc = ratio(s["ours"], s["compiled"]) if "compiled" in s else None
        got["ratios"] = {"native": r, **({"compiled": rc} if rc else {})}
        rows.append(
            [
                fw,
                fmt_ms(summary(s["ours"])),
                fmt_ms(summary(s["native"])),
                fmt_ratio(r),
                f"<= {TARGETS[fw]:g}",
                _met(r["median"], TARGETS[fw]),
                COMPILED[fw],
                fmt_ms(summary(s["compiled"])) if rc else got["errors"].get("compiled", "-"),
                fmt_ratio(rc) if rc else "-",
                fmt_ratio(ratio(got["cpu_samples"]["ours"], got["cpu_samples"]["native"])),
            ]
        )
    tables = [
        Table(
            f"One GPT training step (AdamW), {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, batch {BATCH} x {SEQ} "
            "tokens, 1 CPU device",
            [
                "backend",
                "ours ms",
                "native ms",
                "ours / native",
                "target",
                "met",
                "compiled mode",
                "compiled ms",
                "ours / compiled",
                "CPU time ours / native",
            ],
            rows,
        )  # fmt: skip
    ]
    if "torch" in opts.frameworks():
        data["minilm"] = m = harness.isolated(f"{__package__}.transformer_step:measure_minilm", repeat, warmup,
                                              opts.progress)  # fmt: skip
        mem = {w: harness.isolated(f"{__package__}.transformer_step:measure_memory", w) for w in ("ours", "BertModel")}
        data["memory"] = mem
        s = m["samples"]
        r = ratio(s["ours"], s["BertModel"])
        rc = ratio(s["ours"], s["compiled"]) if "compiled" in s else None
        mr = mem["ours"]["step_mib"] / max(mem["BertModel"]["step_mib"], 1e-9)
        tables.append(
            Table(
                "MiniLM forward (all-MiniLM-L6-v2, a padded batch of 32 sentences) on torch, 1 CPU device",
                [
                    "measure",
                    "ours",
                    "transformers' BertModel",
                    "ours / BertModel",
                    "target",
                    "met",
                    "compiled",
                    "ours / compiled",
                ],
                [
                    [
                        "time ms",
                        fmt_ms(summary(s["ours"])),
                        fmt_ms(summary(s["BertModel"])),
                        fmt_ratio(r),
                        f"<= {MINILM_TARGET:g}",
                        _met(r["median"], MINILM_TARGET),
                        fmt_ms(summary(s["compiled"])) if rc else m["errors"].get("compiled", "-"),
                        fmt_ratio(rc) if rc else "-",
                    ],
                    [
                        "peak resident MiB of 3 forwards (above the loaded model)",
                        f"{mem['ours']['step_mib']:.1f}",
                        f"{mem['BertModel']['step_mib']:.1f}",
                        f"{mr:.2f}",
                        f"<= {MEMORY_TARGET:g}",
                        _met(mr, MEMORY_TARGET),
                        "-",
                        "-",
                    ],
                ],
            )  # fmt: skip
        )
    notes = [
        f"{repeat} alternating rounds after {warmup} warm-up rounds; times are median (quartiles) in ms; a ratio is "
        "the median of per-round ratios (quartiles) of wall time; the target applies to it.",
        "Dropout is 0 in every GPT case: each framework draws its own masks, ours draws them in the core. The "
        "native GPTs are the same shapes (pre-norm blocks, exact GELU, causal mask, untied head, AdamW with weight "
        "decay 0.01), not the same initial values.",
        "Compiled modes run after one untimed call that compiles; a compiler that failed shows its error.",
        "Every timed call ends with the backend's synchronize (MXNet's waitall), so MXNet's asynchronous engine "
        "finishes each case's backward and update inside its own round.",
        "Memory: each case in a fresh process; VmHWM is reset (/proc/self/clear_refs) after the weights load, so "
        "the figure is what the forwards add.",
    ]
    return Result(
        "transformer_step",
        TITLE,
        tables,
        data,
        settings={
            "vocab": VOCAB,
            "hidden": HIDDEN,
            "layers": LAYERS,
            "heads": HEADS,
            "seq": SEQ,
            "batch": BATCH,
            "repeat": repeat,
            "warmup": warmup,
        },  # fmt: skip
        notes=notes,
        plot=lambda fig: _plot(fig, data),
    )


def _plot(fig: Any, data: dict[str, Any]) -> None:
    ax = fig.subplots()
    labels, ys = [], []
    for fw in ("torch", "paddle", "mxnet"):
        for case, r in data.get(fw, {}).get("ratios", {}).items():
            labels.append(f"{fw}\n/ {case}")
            ys.append(r["median"])
    ax.bar(range(len(ys)), ys)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(ys)), labels, fontsize=8)
    ax.set_ylabel("ours / theirs (time per GPT step; < 1: ours faster)")
    ax.set_title("A GPT training step: ours / the framework's own modules and its compiled mode")
    ax.grid(axis="y", alpha=0.3)
