#!/usr/bin/env bash
# Runs `doubledecker mrc` and libCacheSim's own MRC tool (`mrcProfiler`, SHARDS profiler) side by side on
# one oracle-general trace, and prints each run's CPU seconds, its references per CPU second and each
# curve's mean absolute error against the exact LRU curve (ours; libCacheSim's exact run is compared too).
#
# It does not build libCacheSim: give it the path of an mrcProfiler you built yourself.
#   usage: scripts/mrc-vs-libcachesim.sh PATH/TO/mrcProfiler [TRACE.oracleGeneral.bin]
# Without a trace it writes the synthetic 10-million-reference one of `doubledecker bench mrc`.
# libCacheSim's exact run (SHARDS at rate 1, a splay tree) takes about a minute per 10 M references.
set -euo pipefail
cd "$(dirname "$0")/.."
lcs=${1:?usage: $0 PATH/TO/mrcProfiler [TRACE]}
work=$(mktemp -d /var/tmp/dd-mrc-vs-lcs.XXXXXX)
trap 'rm -rf "$work"' EXIT
cargo build --release -q -p doubledecker
dd=./target/release/doubledecker
trace=${2:-$work/trace.oracleGeneral.bin}
[ -e "$trace" ] || "$dd" bench mrc --keep-trace "$trace" --no-minisim --json > /dev/null
unique=$("$dd" mrc --trace "$trace" --method exact --points 1 --json --quiet | python3 -c 'import json,sys; print(json.load(sys.stdin)["unique"])')
step=$(( unique / 100 ))
sizes=$(python3 -c "print(','.join(str($step * (i + 1)) for i in range(100)))")
cpu() { # command... -> prints user+sys CPU seconds of the command (its output goes to $out)
  local t; TIMEFORMAT='%U %S'; t=$( { time "$@" > "$out" 2> /dev/null; } 2>&1 ); awk '{print $1 + $2}' <<< "$t"
}
report() { python3 - "$@" <<'PY'
import json, sys
kind, path, cpu, exact_path = sys.argv[1:5]
def curve(kind, path):
    if kind == "dd":
        d = json.load(open(path)); return dict(zip(d["sizes_pages"], d["miss_ratio"])), d["requests"]
    pts, n = {}, 0
    for line in open(path):
        p = line.split("\t")
        if line.startswith("n_req:"): n = int(line.split()[1])
        if len(p) == 3 and p[0].endswith("B") and p[0][:-1].isdigit(): pts[int(p[0][:-1])] = float(p[1])
    return pts, n
c, n = curve(kind, path)
e, _ = curve("dd", exact_path)
keys = sorted(set(c) & set(e))
mae = sum(abs(c[k] - e[k]) for k in keys) / len(keys)
print(f"{float(cpu):8.2f} CPU s  {n / max(float(cpu), 1e-9) / 1e6:8.2f} M refs per CPU s  MAE vs exact {mae:.4f} over {len(keys)} sizes")
PY
}
echo "trace $trace: $unique distinct ids; sizes ${step}..$((step * 100)) pages"
out=$work/dd-exact.json; t=$(cpu "$dd" mrc --trace "$trace" --method exact --sizes "$sizes" --json --quiet)
printf '%-42s' "doubledecker mrc exact"; report dd "$out" "$t" "$work/dd-exact.json"
for m in "--sampling 0.01" "--max-samples 8192"; do
  out=$work/dd.json; t=$(cpu "$dd" mrc --trace "$trace" --method shards $m --sizes "$sizes" --json --quiet)
  printf '%-42s' "doubledecker mrc shards $m"; report dd "$out" "$t" "$work/dd-exact.json"
done
for p in FIX_RATE,0.01,42 FIX_SIZE,8192,42 FIX_RATE,1,42; do
  out=$work/lcs.txt
  t=$(cpu "$lcs" "$trace" oracleGeneral --ignore-obj-size --profiler=SHARDS --profiler-params=$p \
    --size="${step}B,$((step * 100))B,100")
  printf '%-42s' "mrcProfiler SHARDS $p"; report lcs "$out" "$t" "$work/dd-exact.json"
done
