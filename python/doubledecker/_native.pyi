"""Type stubs of the Rust extension module (python/src/lib.rs). The public API is the Python modules
around it (doubledecker.lab, doubledecker.trace, doubledecker.mrc, doubledecker.sweep)."""

from typing import Dict, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

__version__: str

def bundled_scenario(name: str) -> Optional[str]: ...
def bundled_names() -> List[str]: ...
def lab_run(
    text: str,
    kind: str,
    base_dir: Optional[str] = None,
    scale: Optional[float] = None,
    seed: Optional[int] = None,
    variants: Optional[List[str]] = None,
    jobs: Optional[int] = None,
    scratch_dir: Optional[str] = None,
) -> Tuple[str, str, List[Tuple[str, bool, str]]]: ...
def mrc(
    config_json: str,
    keys: Optional[npt.NDArray[np.uint64]] = None,
    obj_sizes: Optional[npt.NDArray[np.uint32]] = None,
    path: Optional[str] = None,
    format: Optional[str] = None,
    column: Optional[int] = None,
    sizes: Optional[List[int]] = None,
    points: Optional[int] = None,
) -> Dict[str, object]: ...
def read_trace(
    path: str, format: Optional[str] = None, column: Optional[int] = None, max_requests: Optional[int] = None
) -> Dict[str, np.ndarray]: ...
def sweep_points(file: str) -> List[Tuple[int, str, str]]: ...
def sweep_missing(file: str, out: str) -> List[int]: ...
def sweep_run_point(file: str, out: str, index: int, scratch_dir: Optional[str] = None) -> Tuple[str, bool]: ...
def sweep_run_local(file: str, out: str, jobs: Optional[int] = None, scratch_dir: Optional[str] = None) -> List[int]: ...
def sweep_gather(file: str, out: str) -> Tuple[str, str]: ...
