# %% [markdown]
# # Figure 3 from Python
#
# Paper 002, Figure 3: one VM with two containers running the Filebench webserver over a 1 GiB global
# (container-unaware, FIFO) hypervisor cache. Alone, each container fills the whole cache. The lab's
# bundled scenario `fig3-4-global-share` reproduces it; its variants `alone-c1` and `alone-c2` are the
# figure's two runs. This script (cells marked `# %%`, for Jupyter or VS Code, or run it whole:
# `python python/examples/figure3.py --scale 0.05 --out fig3.png`) runs them through the Rust lab and
# plots each container's use of the cache over time with matplotlib.

# %%
import argparse

import matplotlib

matplotlib.use("Agg")  # files only; drop this line in a notebook
import matplotlib.pyplot as plt

import doubledecker

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--scale", type=float, default=0.05, help="size and time scale (1 = the paper's)")
parser.add_argument("--out", default="figure3.png", help="the PNG to write")
args, _ = parser.parse_known_args()

# %% The two runs of Figure 3 (the lab releases the GIL while it runs).
result = doubledecker.lab.run("fig3-4-global-share", scale=args.scale, variants=["alone-c1", "alone-c2"])
ts = result.timeseries
for c in result.checks:
    print(("pass" if c.passed else "FAIL"), c.name, "-", c.detail)

# %% Each container's pages in the memory store, alone.
capacity_mib = 1024 * args.scale
fig, ax = plt.subplots(figsize=(7, 4))
for variant, container in [("alone-c1", "c1"), ("alone-c2", "c2")]:
    rows = ts[(ts["variant"] == variant) & (ts["container"] == container)]
    ax.plot(rows["time_s"], rows["mem_used_mib"], label=f"container {container[-1]} alone")
ax.axhline(capacity_mib, color="grey", linestyle="--", linewidth=1, label="cache capacity")
ax.set_xlabel("time (emulated s)")
ax.set_ylabel("hypervisor cache used (MiB)")
ax.set_title(f"Figure 3: each container alone fills the global cache (scale {args.scale})")
ax.legend()
fig.tight_layout()
fig.savefig(args.out, dpi=100)
print(f"wrote {args.out}")

# %% The summary as a table: throughput and mean cache use per container.
print(result.summary[["variant", "container", "throughput_ops_s", "cache_used_mean_mib", "cache_used_max_mib"]])
