"""Sweeps (``doubledecker lab sweep``) from Python: a sweep file's points run on this machine's cores
or as Ray tasks, one task per point, each calling the Rust lab through this package; the done points
gathered into one DataFrame. Resumable: a point is done when its ``points/NNNN/result.json`` exists
(written last, atomically), and done points are never run again, whatever executor ran them."""

import io
import json
import os
import sys
from typing import Any, Callable, Dict, Optional, Union

import pandas as pd

from . import _native
from .errors import SweepError

__all__ = ["sweep", "sweep_points"]

PathLike = Union[str, "os.PathLike[str]"]


def sweep_points(file: PathLike) -> pd.DataFrame:
    """The points of a sweep file: ``point``, ``label`` and one column per parameter path."""
    rows = []
    for index, label, params in _native.sweep_points(os.fspath(file)):
        row: Dict[str, Any] = {"point": index, "label": label}
        row.update({p: v for p, v in json.loads(params)})
        rows.append(row)
    return pd.DataFrame(rows)


def _run_point(file: str, out: str, index: int, hook: Optional[Callable[[int], None]], scratch_dir: Optional[str]):
    """One point, in a Ray worker: the hook first (instrumentation, fault injection), then the lab."""
    if hook is not None:
        hook(index)
    from doubledecker import _native as native  # the worker's own import of the package

    _, ran = native.sweep_run_point(file, out, index, scratch_dir)
    return index, ran


class _Progress:
    """tqdm when installed, else a line per point on stderr."""

    def __init__(self, total: int, enabled: bool, desc: str):
        self.bar = None
        self.enabled = enabled
        self.total, self.done = total, 0
        if enabled:
            try:
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="point")
            except ImportError:
                pass

    def update(self, text: str = "") -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {text}", file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def sweep(
    file: PathLike,
    out: PathLike,
    executor: str = "local",
    jobs: Optional[int] = None,
    progress: bool = True,
    ray_init: Optional[Dict[str, Any]] = None,
    point_hook: Optional[Callable[[int], None]] = None,
    scratch_dir: Optional[PathLike] = None,
) -> pd.DataFrame:
    """Runs a sweep file's missing points and returns every point's row as one DataFrame.

    The rows are ``results.csv`` (also written into ``out``, with ``results.json``): ``point``,
    ``label``, the parameter paths, ``all_passed``, ``checks_failed``, a search's ``candidate``,
    ``targets_met``, ``throughput_ops_s`` and ``violation_s``, then ``VARIANT/CONTAINER/METRIC``
    columns. ``df.attrs["ran"]`` lists the points this call ran, ``df.attrs["best"]`` a search's best
    candidate.

    Args:
        file: the sweep file (docs/scenario-format.md, "Sweeps").
        out: the output folder; for Ray on several machines, a folder every node sees at the same path.
        executor: ``local`` (this machine's cores, as ``lab sweep --executor local``) or ``ray`` (one Ray
            task per missing point; ``ray.init(**ray_init)`` unless Ray is already initialised).
        jobs: ``local``: points side by side (default one per core).
        progress: a progress bar (tqdm when installed).
        ray_init: keyword arguments of ``ray.init`` (e.g. ``{"address": "auto"}``).
        point_hook: ``ray``: called in the worker with the point's index before the point runs.
        scratch_dir: where SSD scratch files go (as ``lab run --scratch-dir``).

    Raises:
        doubledecker.SweepError: some points failed (their workers died, or their runs raised); the
            others are done, and calling ``sweep`` again runs only the failed ones.
        doubledecker.LabError: the sweep file is invalid.
    """
    f, o = os.path.abspath(os.fspath(file)), os.path.abspath(os.fspath(out))
    scratch = None if scratch_dir is None else os.path.abspath(os.fspath(scratch_dir))
    if executor == "local":
        ran = list(_native.sweep_run_local(f, o, jobs, scratch))
    elif executor == "ray":
        ran = _run_ray(f, o, progress, ray_init, point_hook, scratch)
    else:
        raise ValueError(f"executor: want 'local' or 'ray', not {executor!r}")
    csv, js = _native.sweep_gather(f, o)
    df = pd.read_csv(io.StringIO(csv))
    df.attrs["ran"] = sorted(ran)
    df.attrs["best"] = json.loads(js).get("best")
    return df


def _run_ray(f, o, progress, ray_init, hook, scratch):
    import ray

    if not ray.is_initialized():
        ray.init(**(ray_init or {}))
    missing = list(_native.sweep_missing(f, o))
    # No retries: a point whose worker died stays missing, is reported, and runs on the next call
    # (a retry here would hide the failure; the sweep's resume is the retry).
    task = ray.remote(num_cpus=1, max_retries=0)(_run_point)
    pending = {task.remote(f, o, i, hook, scratch): i for i in missing}
    bar = _Progress(len(missing), progress, "sweep (ray)")
    ran, failed = [], {}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                index = pending.pop(ref)
                try:
                    _, did = ray.get(ref)
                    if did:
                        ran.append(index)
                    bar.update(f"point {index}")
                except Exception as e:  # a dead worker or the lab's own error: the point stays missing
                    failed[index] = f"{type(e).__name__}: {e}"
                    bar.update(f"point {index} FAILED")
    finally:
        bar.close()
    if failed:
        raise SweepError(
            f"{len(failed)} of {len(missing)} point(s) failed ({', '.join(map(str, sorted(failed)))}); "
            "the others are done: call sweep again to run the failed ones",
            failed,
        )
    return ran
