#!/bin/bash
# Issue 28's 16-core measurements, fifth pass: nothing shared written per request (reservation credit
# per thread, the registration gate striped, the batched get's pool found without the table's lock and
# an Arc clone, 32 free stacks). `doubledecker-prev` is main before it, driven by the same client in the
# same sitting. Run from the repository's .devrun/ folder on the device machine: the two stripped
# release builds and bundle.txz (memcached 1.6.18 and perf with their libraries, wrapped by
# memcached.sh and perf.sh).
D=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
cd "$W"
exec > >(tee "$W/log.txt") 2>&1
set -x
date -u; nproc; lscpu > lscpu.txt; free -g
(cd "$D" && tar xJf bundle.txz)
B=$D/doubledecker; BP=$D/doubledecker-prev; MC=$D/memcached.sh
$MC -V
step() { local name=$1 lim=$2; shift 2; echo "== $name $(date -u +%T)"; timeout "$lim" "$@" > "$name.json" 2> "$name.err"; echo "rc=$? $name"; }
S="bench server --against memcached --memcached $MC --seconds 3 --json"
step server-1pool 150 $B $S --connections 1,4,16,64
step server-prev-1pool 90 $B $S --daemon-exe $BP --connections 16,64
step server-1pool-rep 90 $B $S --connections 16,64
step server-16vms 90 $B $S --vms 16 --connections 16,64
step store-shared16 90 $B bench store --threads 16 --shared-pool --seconds 3 --json
step store-prev-shared16 90 $BP bench store --threads 16 --shared-pool --seconds 3 --json
step store-shared16-128 90 $B bench store --threads 16 --shared-pool --pool-shards 128 --seconds 3 --json
step store-own16 90 $B bench store --threads 16 --seconds 3 --json
for v in 1 4 16; do step soak-$v 40 $B soak --seconds 15 --vms $v --json; done
echo "== perf-daemon $(date -u +%T)"
( timeout 60 $B bench server --against none --connections 16 --seconds 8 --json > perf-load.json 2> perf-load.err & )
sleep 4
P=$(pgrep -f 'doubledecker serve' | head -1); echo "daemon pid $P"
timeout 30 $D/perf.sh record --no-buildid -F 499 -g -p "$P" -o perf.data -- sleep 4 > perf-record.txt 2>&1; echo "perf rc=$?"
timeout 60 $D/perf.sh report -i perf.data --stdio --no-children --sort sym --percent-limit 0.4 -g none > perf-report.txt 2>&1
sleep 5
echo "== perf-store $(date -u +%T)"
( timeout 90 $B bench store --threads 16 --shared-pool --seconds 10 --json > perf-store-load.json 2> perf-store-load.err & )
# The 16-thread part starts after the one-thread baseline (about 11 s with its fill).
sleep 16
P=$(pgrep -f 'bench store' | head -1); echo "store pid $P"
timeout 30 $D/perf.sh record --no-buildid -F 499 -g -p "$P" -o perf2.data -- sleep 4 > perf-store-record.txt 2>&1; echo "perf rc=$?"
timeout 60 $D/perf.sh report -i perf2.data --stdio --no-children --sort sym --percent-limit 0.4 -g none > perf-store-report.txt 2>&1
wait
rm -f perf.data perf2.data
date -u
tar czf "$OUT/dev28e.tgz" -C "$W" .
