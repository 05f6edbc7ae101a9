#!/bin/bash
# Issue 28's 16-core measurements, sixth pass (same sitting budget as pass 5): non-exclusive hits copied
# outside every lock (read holds), on top of pass 5. `doubledecker-prev` is main before pass 5, driven
# by the same client. Outputs are bundled into $OUT after every step, so a run cut short still returns
# what it measured.
D=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
cd "$W"
exec > "$W/log.txt" 2>&1
set -x
date -u; nproc
(cd "$D" && tar xJf bundle.txz)
B=$D/doubledecker; BP=$D/doubledecker-prev; MC=$D/memcached.sh
save() { tar czf "$OUT/dev28f.tgz" --exclude='*.data' -C "$W" .; }
step() { local name=$1 lim=$2; shift 2; echo "== $name $(date -u +%T)"; timeout "$lim" "$@" > "$name.json" 2> "$name.err"; echo "rc=$? $name"; save; }
S="bench server --against memcached --memcached $MC --seconds 3 --json"
step server-1pool 60 $B $S --connections 16,64
step server-prev-1pool 60 $B $S --daemon-exe $BP --connections 16,64
step server-1pool-rep 80 $B $S --connections 4,16,64
step server-16vms 60 $B $S --vms 16 --connections 16,64
step store-shared16 60 $B bench store --threads 16 --shared-pool --seconds 3 --json
step store-shared16-128 60 $B bench store --threads 16 --shared-pool --pool-shards 128 --seconds 3 --json
echo "== perf-store $(date -u +%T)"
( timeout 60 $B bench store --threads 16 --shared-pool --seconds 6 --json > perf-store-load.json 2> perf-store-load.err & )
sleep 10.5
P=$(pgrep -f "^$B bench store" | head -1); echo "store pid $P"
timeout 20 $D/perf.sh record --no-buildid -F 499 -p "$P" -o perf2.data -- sleep 4 > perf-store-record.txt 2>&1; echo "perf rc=$?"
timeout 40 $D/perf.sh report -i perf2.data --stdio --sort sym --percent-limit 0.3 > perf-store-report.txt 2>&1
save
echo "== perf-daemon $(date -u +%T)"
( timeout 40 $B bench server --against none --connections 64 --seconds 6 --json > perf-load.json 2> perf-load.err & )
sleep 4
P=$(pgrep -f 'doubledecker serve' | head -1); echo "daemon pid $P"
timeout 20 $D/perf.sh record --no-buildid -F 499 -p "$P" -o perf.data -- sleep 3 > perf-record.txt 2>&1; echo "perf rc=$?"
timeout 40 $D/perf.sh report -i perf.data --stdio --sort sym --percent-limit 0.3 > perf-report.txt 2>&1
sleep 3
date -u
save
