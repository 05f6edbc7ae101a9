"""doubledecker.mrc against `doubledecker mrc --json`, and the trace readers."""

import json
import tomllib

import numpy as np
import pytest

import doubledecker
from conftest import REPO


@pytest.fixture(scope="module")
def keys():
    rng = np.random.default_rng(33)
    # Zipf-like keys over 5000 ids, 60000 references.
    return (rng.zipf(1.2, 60000) % 5000).astype(np.uint64)


@pytest.fixture(scope="module")
def csv_trace(tmp_path_factory, keys):
    p = tmp_path_factory.mktemp("trace") / "t.csv"
    p.write_text("id\n" + "\n".join(map(str, keys.tolist())) + "\n")
    return p


@pytest.mark.parametrize(
    "flags,kw",
    [
        (["--method", "exact", "--points", "20"], dict(method="exact", points=20)),
        (["--method", "shards", "--max-samples", "512", "--points", "15"], dict(method="shards", max_samples=512, points=15)),
        (["--method", "minisim", "--policy", "fifo", "--sampling", "0.5", "--sizes", "100,400,1600"],
         dict(method="minisim", policy="fifo", sampling=0.5, sizes=[100, 400, 1600])),
    ],
)
def test_mrc_equals_the_cli(cli, csv_trace, keys, flags, kw):
    doc = json.loads(cli("mrc", "--trace", csv_trace, *flags, "--json", "--quiet").stdout)
    for source in (csv_trace, keys):
        c = doubledecker.mrc(source, **kw)
        assert c.sizes.dtype == np.uint64 and c.miss_ratio.dtype == np.float64
        assert c.sizes.tolist() == doc["sizes_pages"]
        assert c.miss_ratio.tolist() == doc["miss_ratio"]
        assert (c.method, c.policy, c.requests, c.unique) == (doc["method"], doc["policy"], doc["requests"], doc["unique"])


def test_mrc_errors_name_the_parameter(keys):
    with pytest.raises(doubledecker.MrcError) as e:
        doubledecker.mrc(keys, method="exact", policy="fifo")
    assert e.value.field == "policy"
    with pytest.raises(doubledecker.MrcError) as e:
        doubledecker.mrc(keys, method="shards", sampling=2.0)
    assert e.value.field is not None and "sampling" in e.value.field
    with pytest.raises(doubledecker.TraceError):
        doubledecker.mrc("/nonexistent/trace.csv")


def test_trace_readers_read_csv_and_oracle_general(tmp_path, csv_trace, keys):
    df = doubledecker.trace.read_csv(csv_trace)
    assert df["id"].to_numpy().tolist() == keys.tolist()
    assert (df["size"] == 4096).all()
    rec = np.zeros(4, dtype=[("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")])
    rec["t"], rec["id"], rec["size"], rec["next"] = [1, 2, 3, 4], [10, 11, 10, 12], [100, 8192, 100, 1], [2, -1, -1, -1]
    p = tmp_path / "t.oracleGeneral.bin"
    p.write_bytes(rec.tobytes())
    og = doubledecker.trace.read_oracle_general(p)
    assert og["id"].tolist() == [10, 11, 10, 12]
    assert og["size"].tolist() == [100, 8192, 100, 1]
    assert og["next_access_vtime"].tolist() == [2, -1, -1, -1]
    assert og["time"].tolist() == [1, 2, 3, 4]
    p.write_bytes(rec.tobytes()[:-5])
    with pytest.raises(doubledecker.TraceError) as e:
        doubledecker.trace.read(p)
    assert "ends inside a record" in str(e.value)
    with pytest.raises(doubledecker.TraceError) as e:
        doubledecker.trace.read(csv_trace, max_requests=10)
    assert e.value.field == "max_requests"


def test_the_package_version_is_the_crates():
    import importlib.metadata

    cargo = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    assert doubledecker.__version__ == cargo
    assert importlib.metadata.version("doubledecker") == cargo
