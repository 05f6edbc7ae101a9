#!/usr/bin/env bash
# The lab's trace replay side by side with libCacheSim's `cachesim` (issues 16 and 34): the same
# oracle-general traces, objects counted as one page each (`--ignore-obj-size`, the lab's
# `ignore_obj_size = true`), an LRU of the same size. For each trace it runs, in ROUNDS alternating rounds
# (default 5; odd rounds libCacheSim first, even rounds the lab first, so a neighbour's load falls on
# both sides alike):
#   * libCacheSim: `cachesim TRACE oracleGeneralBin lru CACHE --ignore-obj-size=true --num-thread=1`;
#   * the lab, plain LRU: one container whose guest page cache is an exact LRU of CACHE pages (plain
#     LRU, reclaimed a page at a time), no second-chance cache;
#   * the lab with the engine's pool in the path: the same guest cut to 256 pages with a FIFO memory
#     store of CACHE - 256 pages behind it (every guest eviction a put, every guest miss a get). With
#     exclusive gets the two together are an exact LRU of CACHE pages, so its misses must be the same.
# and prints per trace the misses (lab, lab with the pool, libCacheSim: they must agree), each round's
# CPU seconds (user + system of the whole process, reading the trace included) and the lab's speed per
# CPU second as a ratio of libCacheSim's in the same round, then the minimum and median ratios.
#
#   usage: scripts/lab-vs-libcachesim.sh TRACE.oracleGeneral.bin[.zst]...
#   env:   CACHE (pages, default 65536), ROUNDS (default 5), LCS_CACHESIM, LCS_COMMIT, DD (a
#          `doubledecker` to use instead of building this tree's)
#
# libCacheSim: set LCS_CACHESIM to a `cachesim` you built, or the script clones the public repository
# (github.com/1a1a11a/libCacheSim, at LCS_COMMIT: default its develop branch) into a temporary folder
# and builds it there (needs git, cmake, a C compiler, and the glib and zstd development packages:
# apt install cmake build-essential libglib2.0-dev libzstd-dev). Nothing of it enters this repository.
# Without a trace it writes a synthetic one (zipf 0.9, 4 M requests over 1 M objects) with
# `doubledecker bench mrc --keep-trace` (`--zipf 0` writes a uniform one).
#
# `cachesim` prints its miss ratio to four decimals; the lab's misses are compared at that precision.
# Exits non-zero when any trace's misses disagree.
set -euo pipefail
cd "$(dirname "$0")/.."
LCS_REPO=https://github.com/1a1a11a/libCacheSim
LCS_COMMIT=${LCS_COMMIT:-develop}
CACHE=${CACHE:-65536}
ROUNDS=${ROUNDS:-5}
GUEST=256
work=$(mktemp -d /var/tmp/dd-lab-vs-lcs.XXXXXX)
trap 'rm -rf "$work"' EXIT
dd=${DD:-}
if [ -z "$dd" ]; then
  cargo build --release -q -p doubledecker
  dd=$PWD/target/release/doubledecker
fi

lcs=${LCS_CACHESIM:-}
if [ -z "$lcs" ]; then
  echo "building libCacheSim ($LCS_REPO @ $LCS_COMMIT) in $work ..." >&2
  git clone -q "$LCS_REPO" "$work/libCacheSim"
  git -C "$work/libCacheSim" checkout -q "$LCS_COMMIT"
  cmake -S "$work/libCacheSim" -B "$work/libCacheSim/_build" -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "$work/libCacheSim/_build" --target cachesim -j "$(nproc)" > /dev/null
  lcs=$work/libCacheSim/_build/bin/cachesim
fi

traces=("$@")
if [ ${#traces[@]} = 0 ]; then
  traces=("$work/zipf.oracleGeneral.bin")
  echo "writing a synthetic trace ..." >&2
  "$dd" bench mrc --keep-trace "${traces[0]}" --requests 4000000 --keys 1000000 --no-minisim --json > /dev/null
fi

# command... -> prints "user+sys-CPU-seconds minor-faults" of the command (its stdout goes to $out)
cpu() {
  /usr/bin/time -f '%U %S %R' -o "$work/time" "$@" > "$out" 2> /dev/null
  awk '{printf "%.3f %d\n", $1 + $2, $3}' "$work/time"
}

# Writes the lab's scenario for `trace`: a guest LRU of `guest` pages and `mem_pages` of memory store
# behind it (0: none).
scenario() {
  local trace=$1 requests=$2 guest=$3 mem_pages=$4 file=$5 cache_line='' mem_mib
  mem_mib=$(python3 -c "print($mem_pages / 256)")
  # The store evicts one page at a time when full (its default, 2 MiB at once, would make it a
  # smaller cache than CACHE - 256 pages for part of the run, and the misses no longer an LRU's).
  local batch_line='eviction_batch_mib = 0.00390625'
  [ "$mem_pages" = 0 ] && cache_line='cache = { type = "none" }' && batch_line=''
  cat > "$file" <<EOF
name = "lab-vs-libcachesim"
duration_s = 1e9
sample_interval_s = 1e9
[host]
mem_capacity_mib = $mem_mib
disk = { kind = "ssd" }
$batch_line
[guest]
lru = "plain"
reclaim_batch_pages = 1
[[vms]]
name = "vm"
memory_mib = $(( guest / 256 + 64 ))
[[vms.containers]]
name = "c"
memory_limit_mib = $(python3 -c "print($guest / 256)")
$cache_line
workload = { kind = "trace", path = "$trace", format = "oracle-general", ignore_obj_size = true, max_requests = $(( requests + 1 )) }
EOF
}
summary() { # dir -> "accesses misses"
  python3 - "$1/summary.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["variants"][0]
ct = c["containers"][0]
print(c["page_accesses"], ct["disk_reads"])
PY
}
lab_once() { # scenario dir -> cpu line
  out=$2/stdout
  rm -rf "$2/out"
  cpu "$dd" lab run "$1" --out "$2/out" --quiet --jobs 1
}

fail=0
for trace in "${traces[@]}"; do
  trace=$(realpath "$trace")
  read -r unique requests < <("$dd" mrc --trace "$trace" --method exact --points 1 --json --quiet |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["unique"], d["requests"])')
  echo
  echo "== $trace: $requests requests, $unique distinct objects; LRU of $CACHE pages"
  mkdir -p "$work/plain" "$work/pool"
  scenario "$trace" "$requests" "$CACHE" 0 "$work/plain.toml"
  scenario "$trace" "$requests" "$GUEST" $(( CACHE - GUEST )) "$work/pool.toml"
  rows=""
  for r in $(seq "$ROUNDS"); do
    if [ $(( r % 2 )) = 1 ]; then order="lcs plain pool"; else order="plain pool lcs"; fi
    for what in $order; do
      case $what in
        lcs) out=$work/lcs.txt; read -r t_lcs f_lcs < <(cd "$work" && cpu "$lcs" "$trace" oracleGeneralBin lru "$CACHE" --ignore-obj-size=true --num-thread=1) ;;
        plain) read -r t_plain f_plain < <(lab_once "$work/plain.toml" "$work/plain") ;;
        pool) read -r t_pool f_pool < <(lab_once "$work/pool.toml" "$work/pool") ;;
      esac
    done
    read -r acc_plain miss_plain < <(summary "$work/plain/out")
    read -r acc_pool miss_pool < <(summary "$work/pool/out")
    lcs_ratio=$(python3 -c 'import re,sys; m=re.search(r"req, miss ratio\s+([0-9.]+)", open(sys.argv[1]).read()); print(m.group(1) if m else "?")' "$work/lcs.txt")
    rows="$rows$r $t_lcs $f_lcs $t_plain $f_plain $t_pool $f_pool $acc_plain $miss_plain $acc_pool $miss_pool $lcs_ratio
"
  done
  python3 - "$requests" <<PY || fail=1
import statistics, sys
n = int(sys.argv[1])
rows = [l.split() for l in """$rows""".strip().splitlines()]
print(f"{'round':>5} {'lcs CPU s':>9} {'lab CPU s':>9} {'ratio':>6} {'pool CPU s':>10} {'ratio':>6} "
      f"{'minflt lcs/lab/pool':>24}")
plain, pool, ok = [], [], True
for r in rows:
    (rnd, tl, fl, tp, fp, tq, fq, ap, mp, aq, mq, lr) = r
    tl, tp, tq = float(tl), float(tp), float(tq)
    base = n / tl
    rp, rq = int(ap) / tp / base, int(aq) / tq / base
    plain.append(rp); pool.append(rq)
    print(f"{rnd:>5} {tl:9.3f} {tp:9.3f} {rp:5.2f}x {tq:10.3f} {rq:5.2f}x {fl + '/' + fp + '/' + fq:>24}")
    for name, a, m in (("lab", ap, mp), ("lab with the pool", aq, mq)):
        if int(a) != n or f"{int(m) / n:.4f}" != lr:
            ok = False
            print(f"  MISSES DIFFER in round {rnd}: {name} {m} of {a}, libCacheSim miss ratio {lr}")
r = rows[-1]
print(f"misses: lab {int(r[8]):,}, lab with the pool {int(r[10]):,} (miss ratio {int(r[8]) / n:.4f}); "
      f"libCacheSim miss ratio {r[11]}: {'agree' if ok else 'DIFFER'}")
print(f"lab / libCacheSim per CPU second, plain LRU: min {min(plain):.2f}x, median {statistics.median(plain):.2f}x; "
      f"pool in the path: min {min(pool):.2f}x, median {statistics.median(pool):.2f}x")
sys.exit(0 if ok else 1)
PY
done
exit $fail
