"""Shared fixtures: the `doubledecker` command-line binary the package's results are compared with
(``DD_BINARY``, default the workspace's release build) and the repository's paths."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SWEEPS = REPO / "crates" / "dd-lab" / "sweeps"


@pytest.fixture(scope="session")
def cli():
    binary = Path(os.environ.get("DD_BINARY", REPO / "target" / "release" / "doubledecker"))
    if not binary.exists():
        pytest.fail(f"{binary}: build it (cargo build --release -p doubledecker) or set DD_BINARY")

    def run(*args, check=True):
        p = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True)
        if check and p.returncode != 0:
            raise AssertionError(f"doubledecker {' '.join(map(str, args))}: {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    return run
