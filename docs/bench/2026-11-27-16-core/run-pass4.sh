#!/bin/bash
# Issue 28's 16-core measurements, fourth pass (session runtimes of one worker each).
D=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d)
cd "$W"
exec > >(tee "$W/log.txt") 2>&1
set -x
date -u; nproc
(cd "$D" && tar xzf bundle.tgz)
B=$D/doubledecker; BP=$D/doubledecker-prev; MC=$D/memcached.sh
step() { local name=$1 lim=$2; shift 2; echo "== $name $(date -u +%T)"; timeout "$lim" "$@" > "$name.json" 2> "$name.err"; echo "rc=$? $name"; }
step server-1pool 150 $B bench server --against memcached --memcached $MC --connections 1,4,16,64 --seconds 3 --json
step server-16vms 90 $B bench server --against memcached --memcached $MC --vms 16 --connections 16,64 --seconds 3 --json
step server-prev 60 $BP bench server --against none --connections 16,64 --seconds 3 --json
step server-1pool-rep 90 $B bench server --against memcached --memcached $MC --connections 16,64 --seconds 3 --json
echo "== perf $(date -u +%T)"
( timeout 60 $B bench server --against none --connections 16 --seconds 8 --json > perf-load.json 2> perf-load.err & )
sleep 4
P=$(pgrep -f 'doubledecker serve' | head -1); echo "daemon pid $P"
timeout 30 $D/perf.sh record --no-buildid -F 499 -p "$P" -o perf.data -- sleep 4 > perf-record.txt 2>&1; echo "perf rc=$?"
timeout 40 $D/perf.sh report -i perf.data --stdio --sort sym --percent-limit 0.4 > perf-report.txt 2>&1
sleep 4
rm -f perf.data
date -u
tar czf "$OUT/dev28d.tgz" -C "$W" .
