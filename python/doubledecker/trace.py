"""Trace readers (crate ``dd-trace``): CSV (one column of ids, a header line first) and libCacheSim's
oracle-general binary records (plain or zstd-compressed)."""

import os
from typing import Dict, Optional, Union

import numpy as np
import pandas as pd

from . import _native

__all__ = ["read", "read_csv", "read_oracle_general", "read_arrays"]

Path = Union[str, "os.PathLike[str]"]


def read_arrays(
    path: Path, format: Optional[str] = None, column: Optional[int] = None, max_requests: Optional[int] = None
) -> Dict[str, np.ndarray]:
    """Every request of a trace as numpy arrays: ``time`` (uint64: the trace's clock, the row number
    for CSV), ``id`` (uint64), ``size`` (uint32 bytes; 4096 for CSV) and ``next_access_vtime`` (int64;
    -1 when none or unknown).

    Args:
        path: the trace file.
        format: ``csv`` or ``oracle-general`` (default: ``csv`` for a ``.csv`` name, else
            oracle-general).
        column: the CSV id column, from 1 (default 1). Ids that are not unsigned integers are hashed.
        max_requests: refuse (``TraceError`` with field ``max_requests``) a trace longer than this.

    Raises:
        doubledecker.TraceError: the file cannot be read, ends inside a record, or has a bad line.
    """
    return dict(_native.read_trace(os.fspath(path), format=format, column=column, max_requests=max_requests))


def read(
    path: Path, format: Optional[str] = None, column: Optional[int] = None, max_requests: Optional[int] = None
) -> pd.DataFrame:
    """A trace as a DataFrame with columns ``time``, ``id``, ``size``, ``next_access_vtime`` (see
    :func:`read_arrays`)."""
    return pd.DataFrame(read_arrays(path, format, column, max_requests))


def read_csv(path: Path, column: int = 1, max_requests: Optional[int] = None) -> pd.DataFrame:
    """A CSV trace (ids in ``column``, from 1; the first line is a header)."""
    return read(path, "csv", column, max_requests)


def read_oracle_general(path: Path, max_requests: Optional[int] = None) -> pd.DataFrame:
    """An oracle-general trace (24-byte records, plain or zstd)."""
    return read(path, "oracle-general", None, max_requests)
