"""Transfer CPU and cores, without Ray: the fit recovers known figures, the cores honour
a cgroup quota, and the fitted figures price a streamed plan as the definition says."""

from __future__ import annotations

import pytest

from multigpu.execution import cores
from multigpu.execution.transfer_cpu import CpuSample, cpu_sizes, fit_transfer_cpu

DRIVER = "drv"


def synthetic(routes, sizes, figs, relay, share=0.6, sent=None, inline=0):
    """Samples as the model says they are: a worker visited v times spends
    v * (fixed(b) + fixed(sent) + receive_per_byte * b + per_byte * sent); the driver
    fixed(b) + fixed(sent) + per_byte * b + receive_per_byte * sent plus the relay per hop;
    ``share`` of each on the thread that runs the calls. ``figs`` holds (fixed, per_byte[,
    receive_per_byte[, inline_fixed]]) and ``relay`` (fixed, per_byte[, inline_fixed]), where
    fixed(x) is inline_fixed for x <= ``inline`` (when it is not 0); each worker sends on
    ``sent`` bytes (None: the payload)."""

    def fixed_of(f, x):
        return f[3] if len(f) > 3 and inline and x <= inline else f[0]

    out = []
    for route in routes:
        for b in sizes:
            o = b if sent is None else sent

            def fig(d):
                f = figs[d]
                return f[1], f[2] if len(f) > 2 and f[2] is not None else f[1]

            cpu = {}
            for w in set(route):
                c, r = fig(w)
                cpu[w] = route.count(w) * (fixed_of(figs[w], b) + fixed_of(figs[w], o) + r * b + c * o)
            c, r = fig(DRIVER)
            hop = relay[2] if len(relay) > 2 and inline and b <= inline else relay[0]
            cpu[DRIVER] = (
                fixed_of(figs[DRIVER], b)
                + fixed_of(figs[DRIVER], o)
                + c * b
                + r * o
                + (len(route) - 1) * (hop + relay[1] * b)
            )
            out.append(CpuSample(tuple(route), b, 60, cpu, {d: share * t for d, t in cpu.items()}, out_bytes=sent))
    return out


def test_one_way_probes_tell_a_byte_received_from_a_byte_sent():
    """A stage that pulls its input from another node and writes a small result spends
    more per byte received than sent: the one-way samples (4 bytes out) separate the two,
    and the fit prices a 173 KB-in, 4 B-out stage as the samples say."""
    figs = {"a": (1.5e-3, 3e-9, 1.2e-8), "b": (2e-3, 1e-9, 4e-9), DRIVER: (1e-3, 2e-9, 5e-9)}
    relay = (3e-4, 1e-9)
    sizes = [4096, 173056, 655360]
    samples = synthetic([["a"], ["b"], ["a", "b", "a"]], sizes, figs, relay) + synthetic(
        [["a"], ["b"]], sizes, figs, relay, sent=4
    )
    fit = fit_transfer_cpu(samples, ["a", "b"], DRIVER)
    for name, (fixed, per_byte, receive) in figs.items():
        got = fit.devices[name]
        assert (got.fixed, got.per_byte, got.receive_per_byte) == pytest.approx((fixed, per_byte, receive), rel=1e-5)
        assert got.serial_receive_per_byte == pytest.approx(0.6 * receive, rel=1e-5)
    assert fit.worst_error(DRIVER) < 1e-6
    assert fit.predict("a", ["a"], 173056, DRIVER, 4) == pytest.approx(2 * 1.5e-3 + 1.2e-8 * 173056 + 3e-9 * 4)
    # Fitted to the in-and-back samples alone, the same process is priced at the mean of
    # the two per-byte figures: the one-way stage above would come out low.
    sym = fit_transfer_cpu([s for s in samples if s.out_bytes is None], ["a", "b"], DRIVER)
    assert sym.devices["a"].receive_per_byte is None
    assert sym.devices["a"].per_byte == pytest.approx((3e-9 + 1.2e-8) / 2, rel=1e-5)
    assert sym.predict("a", ["a"], 173056, DRIVER, 4) < 0.9 * fit.predict("a", ["a"], 173056, DRIVER, 4)


def test_payloads_inside_the_engines_message_get_a_fixed_figure_of_their_own():
    """Ray passes a payload of at most ``inline_bytes`` inside its call and a larger one
    through the object store, whose fixed cost is several times larger (the lab's 0.46-core
    host: about 0.4 ms a 64-byte transfer, 2.4-3.0 ms a 4 KB one). With the threshold the
    fit recovers both fixed figures, of every process and of the relay; one fixed figure for
    both prices a 173 KB-in, 4 KB-out stage well below what the samples say."""
    figs = {"a": (2.8e-3, 8e-9, 1.3e-8, 4e-4), "b": (1e-3, 1e-9, 4e-9, 2e-4), DRIVER: (9e-4, 2e-9, 5e-9, 3e-4)}
    relay = (6e-4, 1e-9, 1e-4)
    sizes, inline = [64, 4096, 655360], 1000
    samples = synthetic([["a"], ["b"], ["a", "b", "a"]], sizes, figs, relay, inline=inline) + synthetic(
        [["a"], ["b"]], sizes, figs, relay, sent=4, inline=inline
    )
    fit = fit_transfer_cpu(samples, ["a", "b"], DRIVER, inline)
    for name, (fixed, per_byte, receive, small) in figs.items():
        got = fit.devices[name]
        assert (got.fixed, got.per_byte, got.receive_per_byte, got.inline_fixed) == pytest.approx(
            (fixed, per_byte, receive, small), rel=1e-5
        )
        assert got.serial_inline_fixed == pytest.approx(0.6 * small, rel=1e-5)
    assert (fit.relay.fixed, fit.relay.per_byte, fit.relay.inline_fixed) == pytest.approx(relay, rel=1e-5)
    assert fit.worst_error(DRIVER) < 1e-6
    want = 2.8e-3 + 1.3e-8 * 173056 + 2.8e-3 + 8e-9 * 4096
    assert fit.predict("a", ["a"], 173056, DRIVER, 4096) == pytest.approx(want)
    # The 4-byte reply of a one-way probe is inline: the inline figure, not the store's.
    assert fit.predict("a", ["a"], 173056, DRIVER, 4) == pytest.approx(2.8e-3 + 1.3e-8 * 173056 + 4e-4 + 8e-9 * 4)
    one = fit_transfer_cpu(samples, ["a", "b"], DRIVER)
    assert one.devices["a"].inline_fixed is None and one.relay.inline_fixed is None
    assert one.predict("a", ["a"], 173056, DRIVER, 4096) < 0.8 * want
    # A threshold that no sample is under gives no inline figure (nothing to fit it to).
    above = fit_transfer_cpu([s for s in samples if s.nbytes > inline and s.sent > inline], ["a", "b"], DRIVER, inline)
    assert above.devices["a"].inline_fixed is None
    assert above.devices["a"].fixed == pytest.approx(2.8e-3, rel=1e-5)


def test_the_fit_recovers_each_process_and_the_relay():
    figs = {"a": (2.2e-4, 7e-10), "b": (2.5e-4, 0.0), DRIVER: (1.9e-4, 9e-10)}
    relay = (1.6e-4, 1.2e-9)
    samples = synthetic([["a"], ["b"], ["a", "b"], ["a", "b", "a"]], [40, 6816, 1161600], figs, relay)
    fit = fit_transfer_cpu(samples, ["a", "b"], DRIVER)
    for name, (fixed, per_byte) in figs.items():
        assert fit.devices[name].fixed == pytest.approx(fixed, rel=1e-6, abs=1e-12)
        assert fit.devices[name].per_byte == pytest.approx(per_byte, rel=1e-6, abs=1e-16)
    assert fit.relay.device == DRIVER
    assert (fit.relay.fixed, fit.relay.per_byte) == pytest.approx(relay, rel=1e-6)
    assert fit.worst_error(DRIVER) < 1e-6
    # The serial parts: 60% of every figure, read on the calling thread.
    for name, (fixed, per_byte) in figs.items():
        assert fit.devices[name].serial_fixed == pytest.approx(0.6 * fixed, rel=1e-6, abs=1e-12)
        assert fit.devices[name].serial_per_byte == pytest.approx(0.6 * per_byte, rel=1e-6, abs=1e-16)
    assert fit.relay.serial_cost(1000) == pytest.approx(0.6 * (relay[0] + relay[1] * 1000), rel=1e-6)


def test_a_serial_fit_above_the_whole_is_capped():
    figs = {"a": (2e-4, 1e-9), DRIVER: (1e-4, 1e-9)}
    samples = synthetic([["a"]], [40, 4000, 400000], figs, (0.0, 0.0), share=1.0)
    samples[0].serial["a"] *= 1.5  # a noisy thread reading above its process
    fit = fit_transfer_cpu(samples, ["a"], DRIVER)
    a = fit.devices["a"]
    assert a.serial_fixed <= a.fixed and a.serial_per_byte <= a.per_byte


def test_one_worker_gives_no_relay_and_noise_never_goes_negative():
    figs = {"a": (2e-4, 1e-9), DRIVER: (1e-4, 0.0)}
    samples = synthetic([["a"]], [40, 4000, 400000], figs, (0.0, 0.0))
    # Noise that would pull an unconstrained per-byte figure below 0.
    samples[-1].cpu[DRIVER] *= 0.9
    fit = fit_transfer_cpu(samples, ["a"], DRIVER)
    assert fit.relay is None
    assert fit.devices[DRIVER].per_byte >= 0 and fit.devices[DRIVER].fixed > 0
    assert fit.devices["a"].fixed == pytest.approx(2e-4, rel=1e-6)


def test_cpu_sizes_take_the_ends_and_the_middle():
    assert cpu_sizes([40, 524, 6816, 88984, 1161600]) == [40, 6816, 1161600]
    assert cpu_sizes([64]) == [64]


@pytest.mark.parametrize(
    "files, quota",
    [
        ({"cpu.max": "150000 100000\n"}, 1.5),
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
)
def test_cgroup_quota(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cores._cgroup_quota(tmp_path) == quota


def test_usable_cores_is_the_affinity_capped_by_the_quota(monkeypatch):
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: None)
    assert cores.usable_cores() == 4
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: 1.5)
    assert cores.usable_cores() == 1.5
    monkeypatch.setattr(cores, "_cgroup_quota", lambda: 8.0)
    assert cores.usable_cores() == 4


class _Clocks:
    """Fake workers for ``time_transfer_cpu``: each visit of a probe costs its worker 1 ms of
    process CPU (0.4 on its calling thread) and its node daemon 3 ms."""

    def __init__(self, daemons):
        self.daemons = daemons  # worker -> daemon pid
        self.proc = {w: 0.0 for w in daemons}
        self.thread = {w: 0.0 for w in daemons}
        self.daemon_cpu = {p: 0.0 for p in daemons.values()}
        self.actors = {w: self._actor(w) for w in daemons}

    def _actor(self, w):
        clocks = self

        class Method:
            def remote(self):
                pid = clocks.daemons[w]
                return (clocks.proc[w], clocks.thread[w], 0.0, 0.0, pid, clocks.daemon_cpu[pid])

        return type("Actor", (), {"cpu_time": Method()})()

    def _get(self, ref, who, what):
        return ref

    def run_chain(self, ws, chain, labels, items, window):
        for _ in items:
            for w, _stage in chain:
                self.proc[w] += 1e-3
                self.thread[w] += 0.4e-3
                self.daemon_cpu[self.daemons[w]] += 3e-3


def test_a_workers_own_node_daemon_counts_in_its_transfer_cpu_and_a_shared_one_does_not():
    from multigpu.execution.transfer_cpu import time_transfer_cpu

    # 'a' is alone on its node (daemon 10); 'b' and 'c' share one (daemon 11), as workers of one host do.
    fake = _Clocks({"a": 10, "b": 11, "c": 11})
    samples = time_transfer_cpu(fake, fake, ["a", "b", "c"], DRIVER, [400], items=5, warmup=0, progress=False)
    alone = next(s for s in samples if s.route == ("a",))
    assert alone.cpu["a"] == pytest.approx(4e-3) and alone.daemon == {"a": pytest.approx(3e-3)}
    assert alone.serial["a"] == pytest.approx(0.4e-3)  # the daemon is not the worker's calling thread
    shared = next(s for s in samples if s.route == ("b",))
    assert shared.cpu["b"] == pytest.approx(1e-3) and shared.daemon == {}


def test_process_cpu_seconds_reads_threads_then_stat_and_says_none_without_proc(tmp_path):
    from multigpu.execution.daemon_cpu import process_cpu_seconds

    task = tmp_path / "7" / "task"
    for tid, ns in (("7", 1_500_000_000), ("8", 250_000_000)):
        (task / tid).mkdir(parents=True)
        (task / tid / "schedstat").write_text(f"{ns} 0 0\n")
    assert process_cpu_seconds(7, proc=tmp_path) == pytest.approx(1.75)
    # Without schedstat: utime + stime of /proc/PID/stat, in clock ticks (a name with a ')' in it).
    (tmp_path / "9").mkdir()
    fields = ["S"] + ["0"] * 10 + ["300", "100"] + ["0"] * 10
    (tmp_path / "9" / "stat").write_text("9 (ray::a) b) " + " ".join(fields) + "\n")
    import os

    assert process_cpu_seconds(9, proc=tmp_path) == pytest.approx(400 / os.sysconf("SC_CLK_TCK"))
    assert process_cpu_seconds(12345, proc=tmp_path) is None


def test_node_daemon_is_read_only_from_a_raylet_parent(tmp_path):
    from multigpu.execution.daemon_cpu import node_daemon

    for pid, comm in ((20, "raylet"), (21, "bash")):
        (tmp_path / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (tmp_path / str(pid) / "task" / str(pid) / "schedstat").write_text("2000000000 0 0\n")
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
    assert node_daemon(20, proc=tmp_path) == (20, pytest.approx(2.0))
    assert node_daemon(21, proc=tmp_path) == (None, None)
    assert node_daemon(22, proc=tmp_path) == (None, None)
