"""Run the lab's scenarios from Python.

>>> import doubledecker
>>> r = doubledecker.lab.run("fig3-4-global-share", scale=0.005, variants=["alone-c1"])
>>> r.timeseries.groupby("variant")["mem_used_mib"].max()      # doctest: +SKIP

The result's ``summary_json`` and ``timeseries_csv`` are the exact text ``doubledecker lab run`` writes
into ``summary.json`` and ``timeseries.csv`` for the same scenario, scale, seed and variants.
"""

import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import pandas as pd

from . import _native

__all__ = ["run", "LabResult", "Check", "bundled"]

Scenario = Union[str, "os.PathLike[str]", Dict[str, Any]]


@dataclass(frozen=True)
class Check:
    """One check of a scenario and how it went."""

    name: str
    passed: bool
    detail: str


@dataclass
class LabResult:
    """What a run produced.

    Attributes:
        summary: one row per variant and container: ``variant``, ``verified_hits``, ``page_accesses``
            and the container's fields of ``summary.json`` (``name`` as ``container``, ``vm``,
            ``throughput_ops_s``, ``mean_latency_ms``, ...).
        timeseries: ``timeseries.csv`` as a DataFrame (one row per sample time per container of each
            variant; columns as in docs/scenario-format.md).
        checks: the scenario's checks.
        summary_json: the ``summary.json`` text.
        timeseries_csv: the ``timeseries.csv`` text.
    """

    summary: pd.DataFrame
    timeseries: pd.DataFrame
    checks: List[Check]
    summary_json: str
    timeseries_csv: str
    document: Dict[str, Any] = field(repr=False)

    @property
    def all_passed(self) -> bool:
        """Whether every check passed."""
        return all(c.passed for c in self.checks)

    @property
    def checks_frame(self) -> pd.DataFrame:
        """The checks as a DataFrame (``name``, ``passed``, ``detail``)."""
        return pd.DataFrame([c.__dict__ for c in self.checks], columns=["name", "passed", "detail"])

    def write(self, out: "Union[str, os.PathLike[str]]") -> None:
        """Writes ``summary.json`` and ``timeseries.csv`` into the folder ``out`` (as ``lab run``)."""
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "summary.json").write_text(self.summary_json)
        (d / "timeseries.csv").write_text(self.timeseries_csv)


def bundled() -> List[str]:
    """The bundled scenarios' names (``doubledecker lab list``)."""
    return list(_native.bundled_names())


def _source(scenario: Scenario) -> Tuple[str, str, Optional[str]]:
    """(text, kind, base_dir) of a scenario given by name, path, TOML text or dict."""
    if isinstance(scenario, dict):
        return json.dumps(scenario), "json", None
    if isinstance(scenario, os.PathLike):
        p = Path(scenario)
        return p.read_text(), "toml", str(p.parent)
    if not isinstance(scenario, str):
        raise TypeError(f"scenario: want a name, a path, TOML text or a dict, not {type(scenario).__name__}")
    text = _native.bundled_scenario(scenario)
    if text is not None:
        return text, "toml", None
    if "\n" not in scenario and "=" not in scenario:
        p = Path(scenario)
        if not p.exists():
            from .errors import LabError

            raise LabError(f"no bundled scenario or file named `{scenario}`", None)
        return p.read_text(), "toml", str(p.parent)
    return scenario, "toml", None


def _summary_frame(doc: Dict[str, Any]) -> pd.DataFrame:
    rows = []
    for v in doc.get("variants", []):
        for c in v.get("containers", []):
            row = {"variant": v["name"], "verified_hits": v["verified_hits"], "page_accesses": v["page_accesses"]}
            row.update({("container" if k == "name" else k): x for k, x in c.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def run(
    scenario: Scenario,
    scale: Optional[float] = None,
    variants: Optional[Sequence[str]] = None,
    seed: Optional[int] = None,
    jobs: Optional[int] = None,
    scratch_dir: "Optional[Union[str, os.PathLike[str]]]" = None,
) -> LabResult:
    """Runs a scenario as ``doubledecker lab run`` does and returns its results.

    Args:
        scenario: a bundled scenario's name, a scenario file's path (``str`` or ``PathLike``; relative
            trace paths resolve against its folder), a scenario's TOML text, or a dict of the same
            structure (docs/scenario-format.md).
        scale: replaces the scenario's ``scale`` (``--scale``).
        variants: run only these variants (``--variant``); checks naming others are dropped.
        seed: replaces the scenario's ``seed`` (``--seed``).
        jobs: variants run side by side (default: one per core; the results do not depend on it).
        scratch_dir: where the SSD store's scratch file goes (``--scratch-dir``).

    Returns:
        A :class:`LabResult`.

    Raises:
        doubledecker.LabError: the scenario does not parse or validate (``field`` names the bad field),
            or the run fails.
    """
    text, kind, base_dir = _source(scenario)
    summary, ts, checks = _native.lab_run(
        text,
        kind,
        base_dir=base_dir,
        scale=scale,
        seed=seed,
        variants=list(variants) if variants is not None else None,
        jobs=jobs,
        scratch_dir=None if scratch_dir is None else str(scratch_dir),
    )
    doc = json.loads(summary)
    return LabResult(
        summary=_summary_frame(doc),
        timeseries=pd.read_csv(io.StringIO(ts)),
        checks=[Check(n, p, d) for n, p, d in checks],
        summary_json=summary,
        timeseries_csv=ts,
        document=doc,
    )
