"""Miss-ratio curves (crate ``dd-mrc``), as ``doubledecker mrc`` computes them."""

import json
import os
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from . import _native
from .errors import MrcError

__all__ = ["mrc", "Curve"]


@dataclass
class Curve:
    """A miss-ratio curve.

    Attributes:
        sizes: cache sizes (numpy uint64), in pages or, with ``unit="bytes"``, bytes.
        miss_ratio: the miss ratio at each size (numpy float64).
        method, policy: as asked (``exact``/``shards``/``minisim``; ``lru``/``fifo``/``s3fifo``).
        requests: references read.
        unique: distinct keys (exact) or the sampled estimate.
        sampling_rate: the final sampling rate (1 for exact).
    """

    sizes: np.ndarray
    miss_ratio: np.ndarray
    method: str
    policy: str
    requests: int
    unique: int
    sampling_rate: float


def mrc(
    keys: Union[Sequence[int], np.ndarray, str, "os.PathLike[str]"],
    method: str = "shards",
    policy: str = "lru",
    sampling: Optional[float] = None,
    max_samples: Optional[int] = None,
    sizes: Optional[Sequence[int]] = None,
    points: Optional[int] = None,
    unit: str = "pages",
    obj_sizes: Optional[Union[Sequence[int], np.ndarray]] = None,
    format: Optional[str] = None,
    column: Optional[int] = None,
) -> Curve:
    """The miss-ratio curve of a sequence of keys or of a trace file.

    The same computation as ``doubledecker mrc`` with the same flags: for a trace path, ``--trace PATH
    --method M --policy P [--sampling R | --max-samples N] [--sizes ... | --points N] --unit U``.

    Args:
        keys: integer keys (anything numpy turns into uint64), or a trace file's path.
        method: ``exact`` (Mattson's stack, LRU), ``shards`` (SHARDS sampling, LRU) or ``minisim``
            (miniature simulation, any policy).
        policy: ``lru``, ``fifo`` or ``s3fifo`` (the last two with ``minisim`` only).
        sampling: fixed-rate sampling, the fraction of keys sampled; exclusive with ``max_samples``.
        max_samples: fixed-size sampling (default 32768 keys).
        sizes: the cache sizes to report; exclusive with ``points``.
        points: this many sizes evenly spaced up to the footprint (default 100).
        unit: ``pages`` (each key one slot) or ``bytes`` (each key its object size).
        obj_sizes: each key's size in bytes (``unit="bytes"`` with keys; default 4096).
        format: a trace file's format, ``csv`` or ``oracle-general`` (default from the name).
        column: a CSV trace's id column, from 1.

    Raises:
        doubledecker.MrcError: a parameter combination that makes no sense (``field`` names it).
        doubledecker.TraceError: the trace cannot be read.
    """
    if method == "exact" and (sampling is not None or max_samples is not None):
        raise MrcError("method exact samples nothing: drop sampling / max_samples", "sampling")
    if sampling is not None and max_samples is not None:
        raise MrcError("give sampling or max_samples, not both", "sampling")
    if sizes is not None and points is not None:
        raise MrcError("give sizes or points, not both", "sizes")
    config = {"method": method, "policy": policy, "unit": unit}
    if max_samples is not None:
        config["sampling"] = {"max_samples": int(max_samples)}
    elif sampling is not None:
        config["sampling"] = {"rate": float(sampling)}
    kw = dict(sizes=None if sizes is None else [int(s) for s in sizes], points=points)
    if isinstance(keys, (str, os.PathLike)):
        d = _native.mrc(json.dumps(config), path=os.fspath(keys), format=format, column=column, **kw)
    else:
        arr = np.ascontiguousarray(np.asarray(keys).astype(np.uint64, copy=False))
        osz = None if obj_sizes is None else np.ascontiguousarray(np.asarray(obj_sizes).astype(np.uint32))
        d = _native.mrc(json.dumps(config), keys=arr, obj_sizes=osz, **kw)
    return Curve(**d)
