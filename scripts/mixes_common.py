"""What the scripts over recorded mixes share (`mixes-rescore`, `mixes-static-below`): their common
arguments, the seeds chosen against a `lab mixes --out` folder's `mixes.json`, and one `lab run` per mix
on a pool of threads, the script failing with the command's stderr when one fails.

A module, not a script: the two import it from their own folder.
"""
import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

# Issue 27's bar on a mix's total against its best static allocation's (dd_lab::mixes::TOTAL_RATIO_MIN).
TOTAL_RATIO_MIN = 0.95


def parser(doc):
    """An argument parser with the arguments every such script takes: the binary, the recorded set, the
    output folder, `--jobs` and `--seeds`."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("doubledecker")
    ap.add_argument("mixes_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seeds", help="comma-separated seeds (default: every mix in mixes.json)")
    return ap


def recorded(prog, mixes_dir, seeds_arg):
    """`mixes.json`'s mixes by seed, and the seeds asked for (all of them by default); exits when one is
    not recorded."""
    ref = {m["seed"]: m for m in json.load(open(os.path.join(mixes_dir, "mixes.json")))["mixes"]}
    seeds = sorted(ref) if not seeds_arg else [int(s) for s in seeds_arg.split(",")]
    missing = [s for s in seeds if s not in ref]
    if missing:
        sys.exit(f"{prog}: no mix of seed {missing} in {mixes_dir}/mixes.json")
    return ref, seeds


def run_each(prog, seeds, jobs, command):
    """Runs `command(seed)` (an argument list) for every seed, `jobs` at a time; exits with the failing
    command's stderr if one fails."""

    def run(seed):
        cmd = command(seed)
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"{prog}: {' '.join(cmd)} failed:\n{r.stderr}")

    with ThreadPoolExecutor(max(1, jobs)) as ex:
        list(ex.map(run, seeds))
