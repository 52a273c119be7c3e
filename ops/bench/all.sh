#!/usr/bin/env bash
# Every benchmark configuration of docs/benchmarks.md, 3 runs each, one after another
# (run it on a quiet machine). JSON lines go to $BENCH_OUT/results.jsonl (default
# /tmp/bookline-bench). Takes about 25 minutes on 2 cores. Needs ./test.sh or ./run.sh first.
set -u
cd "$(dirname "$0")/../.."
B=.venv/bin/bookline
OUT=${BENCH_OUT:-/tmp/bookline-bench}; mkdir -p $OUT; : > $OUT/results.jsonl
run() { # name, bench arguments...
  local name=$1; shift
  for i in 1 2 3; do
    local line
    line=$(timeout 900 $B bench "$@" --json 2>>$OUT/stderr.log | tail -1)
    echo "{\"name\": \"$name\", \"run\": $i, \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"result\": ${line:-null}}" >> $OUT/results.jsonl
  done
}
run machine machine
run disk disk
run bookie-100B bookie --entries 200000
run bookie-64KiB bookie --entries 5000 --entry-size 65536 --inflight 64
run bookie-rate5000 bookie --entries 25000 --rate 5000
run ledger-100B ledger --entries 100000
run ledger-64KiB ledger --entries 2000 --entry-size 65536 --inflight 64
run ledger-rate1000 ledger --entries 10000 --rate 1000
run write-many write
run write-per-record write --per-record
run e2e e2e
run read read
run proxy proxy --mode all
run spark spark
echo DONE >> $OUT/results.jsonl
