"""DoubleDecker from Python.

* :mod:`doubledecker.lab`: run the lab's scenarios (bundled by name, a TOML file or text, or a dict) and
  get the summary and the time series as pandas DataFrames (the columns of ``summary.json`` and
  ``timeseries.csv``, docs/scenario-format.md) and the checks.
* :func:`mrc`: a miss-ratio curve of keys or of a trace file, as ``doubledecker mrc`` computes it.
* :mod:`doubledecker.trace`: the CSV and oracle-general trace readers.
* :func:`sweep`: a sweep file's points run here or on a Ray cluster, gathered into one DataFrame.

The Rust work runs with the GIL released; errors are :mod:`doubledecker.errors` exceptions carrying
the Rust error's message and ``field``.
"""

from . import _native, errors, lab, trace
from ._mrc import Curve, mrc
from ._sweep import sweep, sweep_points
from .errors import DoubleDeckerError, LabError, MrcError, SweepError, TraceError

__version__: str = _native.__version__

__all__ = [
    "__version__",
    "lab",
    "trace",
    "errors",
    "mrc",
    "Curve",
    "sweep",
    "sweep_points",
    "DoubleDeckerError",
    "LabError",
    "MrcError",
    "TraceError",
    "SweepError",
]
