"""doubledecker.sweep: the local executor equals `lab sweep --executor local`; a local Ray cluster
runs the 6-point sweep to the same results; a worker killed mid-sweep leaves its point missing, and the
next call runs only that point."""

import os
import signal

import pytest

import doubledecker
from conftest import SWEEPS

FILE = SWEEPS / "fig3-cache-sizes.toml"


def files(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name.endswith((".json", ".csv", ".toml"))}


@pytest.fixture(scope="module")
def cli_out(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli-sweep")
    cli("lab", "sweep", FILE, "--out", out, "--executor", "local", "--jobs", "2", "--quiet")
    return out


def test_points_are_listed():
    pts = doubledecker.sweep_points(FILE)
    assert list(pts["point"]) == list(range(6))
    assert set(pts.columns) == {"point", "label", "seed", "host.mem_capacity_mib"}


def test_the_local_executor_equals_the_cli(tmp_path, cli_out):
    df = doubledecker.sweep(FILE, tmp_path, executor="local", jobs=2)
    assert len(df) == 6 and df.attrs["ran"] == list(range(6))
    assert files(tmp_path) == files(cli_out)
    again = doubledecker.sweep(FILE, tmp_path, executor="local")
    assert again.attrs["ran"] == [] and again.equals(df)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024 * 1024, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_sweep_equals_local_and_a_killed_worker_resumes_only_its_point(tmp_path, cli_out, ray_cluster):
    full = tmp_path / "full"
    df = doubledecker.sweep(FILE, full, executor="ray", progress=False)
    assert df.attrs["ran"] == list(range(6))
    assert files(full) == files(cli_out)

    # Point 3's worker kills itself (SIGKILL) the first time it starts the point: the sweep finishes
    # the other five, then reports point 3.
    killed = tmp_path / "out"
    marker = tmp_path / "killed-once"

    def kill_point_3_once(index):
        if index == 3 and not marker.exists():
            marker.write_text("x")
            os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(doubledecker.SweepError) as e:
        doubledecker.sweep(FILE, killed, executor="ray", progress=False, point_hook=kill_point_3_once)
    assert set(e.value.failed) == {3}, e.value.failed
    assert marker.exists()
    done = sorted(int(p.parent.name) for p in killed.glob("points/*/result.json"))
    assert done == [0, 1, 2, 4, 5]
    before = {p: p.stat().st_mtime_ns for p in killed.glob("points/*/result.json")}

    df2 = doubledecker.sweep(FILE, killed, executor="ray", progress=False, point_hook=kill_point_3_once)
    assert df2.attrs["ran"] == [3]
    assert {p: p.stat().st_mtime_ns for p in before} == before, "a done point ran again"
    assert files(killed) == files(cli_out)
    assert df2.equals(df)
