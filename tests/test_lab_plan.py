"""The lab's design from a cluster file and its command line, without root: what ``Lab``
would build (hosts, addresses, shaped rates, CPU shares, memory limits, what it cannot
emulate), the one-line refusals of a machine that cannot host it, and the lab benchmark's
report built from the parts that ran (the committed run's raw data, parts removed)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from multigpu.cli.main import main
from multigpu.errors import InputError, LabUnsupportedError
from multigpu.lab import design
from multigpu.lab.plan import MAX_SHAPED, WIRE_OVERHEAD
from multigpu.lab.raynodes import RAY_PULL_TIMEOUT_MS, object_store_bytes, ray_env
from multigpu.lab.system import DEFAULT_TICK_US, scheduler_tick_us
from multigpu.partition import Cluster, DeviceSpec, Link, LinkSpec, load_cluster


def test_the_shipped_lab_becomes_five_hosts_with_per_pair_rates_and_shares():
    plan = design(load_cluster("lab"), cpu_scale=0.25)
    assert [h.name for h in plan.hosts] == ["pi1", "pi2", "desk-cpu", "desk-gpu", "imac"]
    assert [h.address for h in plan.hosts] == [f"198.18.0.{i}" for i in range(1, 6)]
    cores = {h.name: h.cores for h in plan.hosts}
    assert cores["pi1"] == pytest.approx(0.25) and cores["imac"] == pytest.approx(0.25 * 70 / 38.4, rel=1e-3)
    assert cores["desk-gpu"] == plan.max_cores and plan.host("desk-gpu").capped  # a GPU: capped, said so
    assert any("GPU's speed cannot be emulated" in n for n in plan.notes)
    assert any("latency is not emulated" in n for n in plan.notes)
    wifi, lan = plan.link("pi1", "desk-cpu"), plan.link("imac", "desk-cpu")
    assert (wifi.bandwidth, lan.bandwidth) == (1e6, 1e7)  # WiFi and LAN out of one host differ
    assert wifi.rate_bits == round(1e6 * 8 * WIRE_OVERHEAD)
    assert plan.link("desk-cpu", "desk-gpu").rate_bits is None  # PCIe: faster than the machine, unshaped
    assert plan.host("pi1").memory == 500_000_000 and plan.host("imac").memory is None
    assert plan.head == "desk-cpu"  # the most memory (unlimited) first, then the source's host
    assert plan.host("pi1").quota_us / plan.host("pi1").period_us == pytest.approx(0.25)


def test_scales_devices_sharing_a_host_and_pairs_without_a_link():
    c = Cluster(
        devices=(
            DeviceSpec("a", 1e9, 1, memory=1e8, host="box"),
            DeviceSpec("b", 4e9, 1, memory=2e8, host="box"),
            DeviceSpec("c", 2e9, 1),
        ),
        source="a",
        links=(Link(("a", "c"), 1e6, 0.0),),
        hosts={"box": {"cores": 2}},
    )
    plan = design(c, cpu_scale=0.1, bandwidth_scale=10, max_cores=1)
    assert [h.devices for h in plan.hosts] == [("a", "b"), ("c",)]
    box = plan.host("box")
    assert box.cores == pytest.approx(0.4) and box.memory == 300_000_000
    assert plan.link("box", "c").bandwidth == 1e7
    no_link = design(Cluster(devices=(DeviceSpec("a", 1, 0), DeviceSpec("b", 1, 0)), source="a"))
    assert no_link.link("a", "b").blocked and any("dropped" in n for n in no_link.notes)
    tiny = design(
        Cluster(
            devices=(DeviceSpec("a", 1e9, 0), DeviceSpec("b", 1e12, 0)),
            source="a",
            default_link=LinkSpec(MAX_SHAPED * 2, 0.0),
        ),
        cpu_scale=0.01,
    )
    assert tiny.host("a").quota_us >= 1000  # the kernel's shortest quota, with a longer period
    assert tiny.host("a").quota_us / tiny.host("a").period_us == pytest.approx(0.01, rel=0.01)


def test_no_object_crosses_a_shaped_link_slower_than_rays_pull_is_repeated(tmp_path):
    # Ray asks again for an object still arriving after the pull timeout, and the sender then
    # sends every chunk again: the lab's timeout must outlast the slowest possible transfer.
    plan = design(load_cluster("lab"))
    env = ray_env(tmp_path / "token", plan)
    timeout = int(env["RAY_object_manager_pull_timeout_ms"]) / 1e3
    pi = plan.host("pi1")
    wifi, lan = plan.link("imac", "pi1"), plan.link("desk-cpu", "imac")
    # The slowest: a pi's whole object store (a fifth of its 500 MB) over the ~1 MB/s WiFi.
    assert timeout == pytest.approx(2 * object_store_bytes(pi) / (wifi.rate_bits / 8), rel=1e-4)
    assert 150 < timeout < 250
    # AlexNet's 242.5 MB of parameters to imac over the LAN cross within it, and any object
    # that fits both stores of a shaped pair.
    assert 242.5e6 / (lan.rate_bits / 8) < timeout / 2
    for ln in plan.links:
        if ln.shaped:
            fits = min(object_store_bytes(plan.host(ln.src)), object_store_bytes(plan.host(ln.dst)))
            assert fits / (ln.rate_bits / 8) <= timeout / 2 * (1 + 1e-6)
    # Nothing shaped: Ray's own default stands.
    fast = design(
        Cluster(
            devices=(DeviceSpec("a", 1e9, 0), DeviceSpec("b", 1e9, 0)),
            source="a",
            default_link=LinkSpec(MAX_SHAPED * 2, 0.0),
        )
    )
    assert ray_env(tmp_path / "token", fast)["RAY_object_manager_pull_timeout_ms"] == str(RAY_PULL_TIMEOUT_MS)
    assert env["RAY_AUTH_MODE"] == "token"


def test_cfs_periods_are_at_least_one_scheduler_tick_and_give_the_share():
    """A period shorter than the tick gives less than its share (0.456 cores at 2193 us held
    a busy loop to 0.40 of a core), so every period is at least the tick; with a 1 ms tick
    (HZ=1000) the shortest period whose quota is 1 ms is kept."""
    lab = load_cluster("lab")
    at_250 = design(lab, tick_us=4000)
    for h in at_250.hosts:
        assert h.period_us >= 4000 and h.quota_us >= 1000, h
        assert h.quota_us / h.period_us == pytest.approx(h.cores)
        assert h.cores == pytest.approx(
            min(0.25 * max(lab.devices[lab.index(d)].flops for d in h.devices) / 38.4e9, at_250.max_cores), rel=2e-3
        )
    assert (at_250.host("imac").period_us, at_250.host("imac").quota_us) == (4000, 1823)
    at_1000 = design(lab, tick_us=1000)
    assert (at_1000.host("imac").period_us, at_1000.host("imac").quota_us) == (2195, 1000)
    assert (at_1000.host("pi1").period_us, at_1000.host("pi1").quota_us) == (4000, 1000)
    assert at_250.to_dict()["tick_us"] == 4000 and design(lab).tick_us == DEFAULT_TICK_US
    with pytest.raises(InputError, match="tick_us=0"):
        design(lab, tick_us=0)


def test_the_scheduler_tick_is_read_from_the_kernel_configuration(tmp_path):
    gz, plain, other = tmp_path / "config.gz", tmp_path / "config-6.1", tmp_path / "config-none"
    gz.write_bytes(gzip.compress(b"CONFIG_HZ_1000=y\nCONFIG_HZ=1000\nCONFIG_HZ_PERIODIC=y\n"))
    plain.write_text("# CONFIG_HZ_1000 is not set\nCONFIG_HZ=250\n")
    other.write_text("CONFIG_NO_HZ=y\n")
    assert scheduler_tick_us([gz, plain]) == 1000
    assert scheduler_tick_us([tmp_path / "missing.gz", plain]) == 4000
    assert scheduler_tick_us([other, tmp_path / "broken.gz"]) == DEFAULT_TICK_US
    (tmp_path / "broken.gz").write_bytes(b"not gzip")
    assert scheduler_tick_us([tmp_path / "broken.gz", gz]) == 1000
    assert 1000 <= scheduler_tick_us() <= 10000  # this machine's (HZ from 100 to 1000)


def test_bad_scales_and_heads_are_refused_by_name():
    lab = load_cluster("lab")
    with pytest.raises(InputError, match="cpu_scale=0"):
        design(lab, cpu_scale=0)
    with pytest.raises(InputError, match="bandwidth_scale=-1"):
        design(lab, bandwidth_scale=-1)
    with pytest.raises(InputError, match="head='nowhere'.*pi1"):
        design(lab, head="nowhere")


def test_a_machine_that_cannot_host_a_lab_gets_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert main(["lab", "up", "lab"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("multigpu lab: error: the lab needs root")
    from multigpu.lab.system import require_support

    with pytest.raises(LabUnsupportedError, match="needs root"):
        require_support()


def test_lab_commands_without_a_lab_and_with_bad_input(capsys, monkeypatch):
    monkeypatch.setattr("multigpu.lab.lab.labs", list)
    monkeypatch.setattr("multigpu.lab.labs", list)
    monkeypatch.setattr("multigpu.lab.leftovers", list)
    assert main(["lab", "exec", "pi1", "--", "hostname"]) == 2
    assert "no lab is up" in capsys.readouterr().err
    assert main(["lab", "exec", "pi1"]) == 2
    assert "no command given" in capsys.readouterr().err
    assert main(["lab", "up", "lab", "--device-backend", "imac"]) == 2
    assert "DEVICE=BACKEND" in capsys.readouterr().err
    assert main(["lab", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["labs"] == []
    with pytest.raises(SystemExit):
        main(["lab", "--help"])
    assert "cannot emulate a link's latency" in capsys.readouterr().out


@pytest.mark.parametrize(
    "failed", [(), ("report",), ("reach", "allreduce"), ("report", "allreduce", "faults", "reach")]
)
def test_the_lab_benchmark_reports_each_part_that_ran_and_names_each_that_did_not(failed):
    from multigpu.benchmarks import lab as bench_lab

    data = json.loads((Path(__file__).resolve().parents[1] / "docs/results/lab.json").read_text())["data"]
    data = {k: v for k, v in data.items() if k not in failed}
    if failed:
        data["failed"] = {failed[0]: "RuntimeError: the link went away"}
    result = bench_lab._result(data)
    titles = {
        "report": "The report's experiment",
        "allreduce": "Multi-host data parallel",
        "faults": "Faults",
        "reach": "Who can reach a job",
    }
    assert [t.title.split(":")[0] for t in result.tables] == [v for k, v in titles.items() if k not in failed]
    assert [n for n in result.notes if n.startswith("The ") and " part failed: " in n] == [
        f"The {k} part failed: " + ("RuntimeError: the link went away" if k == failed[0] else "it did not run")
        for k in titles
        if k in failed
    ]
