"""doubledecker.lab.run against `doubledecker lab run`: the same bytes (summary.json, timeseries.csv),
from a bundled name, a file, TOML text and a dict; errors name the field."""

import io
import tomllib

import pandas as pd
import pytest

import doubledecker
from doubledecker import lab

SCENARIO = "fig3-4-global-share"
SCALE = 0.005
VARIANTS = ["alone-c1", "together"]


@pytest.fixture(scope="module")
def cli_run(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli")
    args = ["lab", "run", SCENARIO, "--scale", SCALE, "--jobs", "1", "--quiet", "--out", out]
    for v in VARIANTS:
        args += ["--variant", v]
    cli(*args)
    return (out / "summary.json").read_text(), (out / "timeseries.csv").read_text()


def test_python_run_equals_the_cli_byte_for_byte(cli_run):
    summary, ts = cli_run
    r = lab.run(SCENARIO, scale=SCALE, variants=VARIANTS)
    assert r.summary_json == summary
    assert r.timeseries_csv == ts
    pd.testing.assert_frame_equal(r.timeseries, pd.read_csv(io.StringIO(ts)))
    # Columns as docs/scenario-format.md lists them.
    assert list(r.timeseries.columns[:6]) == ["variant", "time_s", "container", "vm", "running", "memcg_mib"]
    assert set(r.timeseries["variant"]) == set(VARIANTS)
    assert {"variant", "container", "vm", "throughput_ops_s", "mean_latency_ms"} <= set(r.summary.columns)
    assert len(r.summary) == 3  # alone-c1: c1; together: c1, c2
    assert r.checks and all(isinstance(c.passed, bool) for c in r.checks)
    assert r.all_passed == all(c.passed for c in r.checks)


def test_a_file_toml_text_and_a_dict_run_the_same(tmp_path, cli_run):
    summary, ts = cli_run
    text = lab._native.bundled_scenario(SCENARIO)
    path = tmp_path / "s.toml"
    path.write_text(text)
    for source in (path, str(path), text, tomllib.loads(text)):
        r = lab.run(source, scale=SCALE, variants=VARIANTS)
        assert (r.summary_json, r.timeseries_csv) == (summary, ts), type(source)


def test_errors_name_the_field():
    doc = tomllib.loads(lab._native.bundled_scenario(SCENARIO))
    doc["vms"][0]["containers"][1]["memory_limit_mib"] = -5
    with pytest.raises(doubledecker.LabError) as e:
        lab.run(doc, scale=SCALE)
    assert e.value.field == "vms[0].containers[1].memory_limit_mib"
    assert "must be positive" in str(e.value)
    with pytest.raises(doubledecker.LabError) as e:
        lab.run(SCENARIO, scale=SCALE, variants=["no-such-variant"])
    assert e.value.field == "variants" and "no-such-variant" in e.value.message
    with pytest.raises(doubledecker.LabError) as e:
        lab.run("name = \"x\"\nduration_s = -1\n[host]\nmem_capacity_mib = 1\n[[vms]]\nname = \"v\"\nmemory_mib = 1\n"
                "[[vms.containers]]\nname = \"c\"\nworkload = { kind = \"kv\", dataset_mib = 1 }\n")
    assert e.value.field == "duration_s"
    with pytest.raises(doubledecker.LabError):
        lab.run("no-such-scenario")


def test_bundled_lists_the_scenarios():
    assert SCENARIO in lab.bundled() and len(lab.bundled()) >= 14


def test_the_gil_is_released_while_the_lab_runs():
    import threading
    import time

    done = threading.Event()
    ticks = 0

    def run():
        # Long enough (about a second) for the loop below to tick many times if it can run at all.
        lab.run(SCENARIO, scale=0.05, variants=["alone-c1"])
        done.set()

    t = threading.Thread(target=run)
    t.start()
    # With the GIL held for the whole run this loop would not get to run until it ends.
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    assert ticks >= 20, ticks
