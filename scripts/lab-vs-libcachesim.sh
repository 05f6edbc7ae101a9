#!/usr/bin/env bash
# The lab's trace replay side by side with libCacheSim's `cachesim` (issue 16, item 4): the same
# oracle-general trace, objects counted as one page each (`--ignore-obj-size`, the lab's
# `ignore_obj_size = true`), an LRU of the same size. Prints each run's misses (they must agree: the
# lab's guest in plain-LRU mode is an exact LRU), CPU seconds and requests per CPU second, and the lab's
# speed as a ratio of libCacheSim's; then the lab again with a memory store (the engine's pool) behind
# the guest as its second-chance cache.
#
#   usage: scripts/lab-vs-libcachesim.sh [TRACE.oracleGeneral.bin[.zst]] [CACHE_OBJECTS]
#
# libCacheSim: set LCS_CACHESIM to a `cachesim` you built, or the script clones the public repository
# (github.com/1a1a11a/libCacheSim, at LCS_COMMIT: default its develop branch) into a temporary folder
# and builds it there (needs git, cmake, a C compiler, and the glib and zstd development packages:
# apt install cmake build-essential libglib2.0-dev libzstd-dev). Nothing of it enters this repository.
# Without a trace it writes a synthetic one (zipf 0.9, 5 M requests over 1 M objects) with
# `doubledecker bench mrc --keep-trace`; the default cache is a tenth of the distinct objects.
set -euo pipefail
cd "$(dirname "$0")/.."
LCS_REPO=https://github.com/1a1a11a/libCacheSim
LCS_COMMIT=${LCS_COMMIT:-develop}
work=$(mktemp -d /var/tmp/dd-lab-vs-lcs.XXXXXX)
trap 'rm -rf "$work"' EXIT
cargo build --release -q -p doubledecker
dd=$PWD/target/release/doubledecker

lcs=${LCS_CACHESIM:-}
if [ -z "$lcs" ]; then
  echo "building libCacheSim ($LCS_REPO @ $LCS_COMMIT) in $work ..." >&2
  git clone -q "$LCS_REPO" "$work/libCacheSim"
  git -C "$work/libCacheSim" checkout -q "$LCS_COMMIT"
  cmake -S "$work/libCacheSim" -B "$work/libCacheSim/_build" -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "$work/libCacheSim/_build" --target cachesim -j "$(nproc)" > /dev/null
  lcs=$work/libCacheSim/_build/bin/cachesim
fi

trace=$(realpath -m "${1:-$work/trace.oracleGeneral.bin}")
if [ ! -e "$trace" ]; then
  echo "writing a synthetic trace ..." >&2
  "$dd" bench mrc --keep-trace "$trace" --requests 5000000 --keys 1000000 --no-minisim --json > /dev/null
fi
read -r unique requests < <("$dd" mrc --trace "$trace" --method exact --points 1 --json --quiet |
  python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["unique"], d["requests"])')
cache=${2:-$(( unique / 10 ))}
echo "trace $trace: $requests requests, $unique distinct objects; LRU of $cache objects (pages)"

cpu() { # command... -> prints user+sys CPU seconds of the command (its stdout goes to $out)
  local t; TIMEFORMAT='%U %S'; t=$( { time "$@" > "$out" 2> /dev/null; } 2>&1 ); awk '{print $1 + $2}' <<< "$t"
}

lcs_once() { (cd "$work" && cpu "$lcs" "$trace" oracleGeneralBin lru "$cache" --ignore-obj-size=true --num-thread=1 -o "$work/lcs-result"); }

# One VM, one container replaying the trace once through a plain-LRU guest page cache of `cache` pages,
# reclaimed a page at a time (exact LRU), with `mem_mib` of memory store behind it (0: none).
lab() {
  local mem_mib=$1 dir=$work/lab-$1 cache_line
  mkdir -p "$dir"
  if [ "$mem_mib" = 0 ]; then cache_line='cache = { type = "none" }'; else cache_line=''; fi
  cat > "$dir/scenario.toml" <<EOF
name = "lab-vs-libcachesim"
duration_s = 1e9
sample_interval_s = 1e9
[host]
mem_capacity_mib = $mem_mib
disk = { kind = "ssd" }
[guest]
lru = "plain"
reclaim_batch_pages = 1
[[vms]]
name = "vm"
memory_mib = $(( cache / 256 + 64 ))
[[vms.containers]]
name = "c"
memory_limit_mib = $(python3 -c "print($cache / 256)")
$cache_line
workload = { kind = "trace", path = "$trace", format = "oracle-general", ignore_obj_size = true, max_requests = $(( requests + 1 )) }
EOF
  out=$dir/stdout
  rm -rf "$dir/out"
  cpu "$dd" lab run "$dir/scenario.toml" --out "$dir/out" --quiet --jobs 1
}
summary() { # dir -> "accesses misses"
  python3 - "$1/out/summary.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["variants"][0]
ct = c["containers"][0]
print(c["page_accesses"], ct["disk_reads"] + ct["mem_hits"] + ct["ssd_hits"])
PY
}
# Each run REPEATS times (default 3), alternating the three, and the median CPU time of each: on a shared
# machine one run can be slowed by a neighbour, and alternating spreads that over all three.
mem=$(( cache / 256 + 1 ))
median() { tr ' ' '\n' | sort -g | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
ts_lcs=""; ts_lab=""; ts_pool=""
for _ in $(seq "${REPEATS:-3}"); do
  ts_lcs="$ts_lcs $(out=$work/lcs.txt; lcs_once)"
  ts_lab="$ts_lab $(lab 0)"
  ts_pool="$ts_pool $(lab "$mem")"
done
t_lcs=$(echo $ts_lcs | median); t_lab=$(echo $ts_lab | median); t_pool=$(echo $ts_pool | median)
# cachesim prints the miss ratio to 4 decimals only (its last run's output).
lcs_ratio=$(python3 -c 'import re,sys; m=re.search(r"miss ratio\s+([0-9.]+)", open(sys.argv[1]).read()); print(m.group(1) if m else "?")' "$work/lcs.txt")
echo "CPU seconds per run: libCacheSim$ts_lcs; lab$ts_lab; lab with a pool$ts_pool (medians below)"
read -r lab_acc lab_misses < <(summary "$work/lab-0")
read -r pool_acc _ < <(summary "$work/lab-$mem")

row() { printf '%-44s %12s %12s %9.2f %10.2f\n' "$1" "$2" "$3" "$4" "$(python3 -c "print($2 / max($4, 1e-9) / 1e6)")"; }
printf '%-44s %12s %12s %9s %10s\n' run requests misses "CPU s" "M req/CPU s"
row "libCacheSim cachesim LRU" "$requests" "ratio $lcs_ratio" "$t_lcs"
row "lab, plain LRU, no second-chance cache" "$lab_acc" "$lab_misses" "$t_lab"
row "lab, plain LRU, ${mem} MiB memory store" "$pool_acc" "-" "$t_pool"
python3 - "$requests" "$t_lcs" "$lab_acc" "$t_lab" "$pool_acc" "$t_pool" "$lcs_ratio" "$lab_misses" <<'PY'
import sys
n, tl, a, ta, p, tp = (float(x) for x in sys.argv[1:7])
lr, dm = sys.argv[7], int(sys.argv[8])
base = n / tl
print(f"lab / libCacheSim, requests per CPU second: {a / ta / base:.2f}x without a pool, {p / tp / base:.2f}x with one")
ours = f"{dm / a:.4f}"
print(f"miss ratios agree ({ours})" if ours == lr else f"MISS RATIOS DIFFER: libCacheSim {lr}, lab {ours}")
sys.exit(0 if ours == lr else 1)
PY
