#!/usr/bin/env bash
# make bench: builds rdmaperf, runs bench/run.sh in the Soft-RoCE VM (testbed/vm.sh), and writes
# bench/results.json (everything measured) and bench/results.md (the table, also printed).
#
#   bench/bench.sh
#
# Environment: GO (go), BENCH_ROUNDS (5), BENCH_SECONDS (2), BENCH_ONLY (all; onesided: that section
# alone; siw: latency, streaming and one-sided on soft-iWARP, in the test bed's siw VM; pair: latency,
# a stream, connection setup and HTTP across the test bed's two VMs; ud: the datagram rows alone), BENCH_GO_MODE (pinned: two processes,
# as iperf users run rdmaperf and as the C peers run; local: both ends in one process): passed on
# to run.sh.
# The VM's whole output is kept in .testbed-out/bench.log.
set -euo pipefail
cd "$(dirname "$0")/.."

go=${GO:-go}
# A section run alone (BENCH_ONLY) writes results of its own name, leaving the whole run's.
name=results
[[ ${BENCH_ONLY:-all} != all ]] && name=results-${BENCH_ONLY}
trap 'rm -f bench/$name.json.tmp bench/$name.md.tmp' EXIT
out=.testbed-out
mkdir -p "$out"
"$go" build -o "$out/rdmaperf" ./cmd/rdmaperf
"$go" test -c -o "$out/objstore.test" ./examples/objectstore
"${CC:-cc}" -O2 -Wall -o "$out/postrate" bench/postrate.c -lrdmacm -libverbs
"${CC:-cc}" -O2 -Wall -o "$out/srqcost" bench/srqcost.c -libverbs

# vm.sh gives the job a clean environment: settings go in through env(1).
log=$out/bench.log
rc=0
vmargs=(--provider rxe)
[[ ${BENCH_ONLY:-all} == siw ]] && vmargs=(--provider siw)
# Two hosts: run.sh runs on both VMs, the driver's output is the run's.
[[ ${BENCH_ONLY:-all} == pair ]] && vmargs=(--pair)
# Thousands of connections at once, both ends in the VM: the scale test's memory.
[[ ${BENCH_ONLY:-all} == setup ]] && vmargs=(--provider rxe --mem 8192)
testbed/vm.sh "${vmargs[@]}" --timeout 1200 -- env BENCH_ROUNDS="${BENCH_ROUNDS:-5}" BENCH_SECONDS="${BENCH_SECONDS:-2}" BENCH_GO_MODE="${BENCH_GO_MODE:-pinned}" BENCH_ONLY="${BENCH_ONLY:-all}" \
	bench/run.sh "" "$out/rdmaperf" | tee "$log" || rc=$?
# run.sh reports failed measurements in the JSON and exits 0; anything else is the test bed's
# or run.sh's own failure, but whatever JSON came out is still worth keeping.
json=$(sed -n '/^BEGIN-JSON$/,/^END-JSON$/{/^BEGIN-JSON$/d;/^END-JSON$/d;p}' "$log")
if [[ -z $json ]]; then
	echo "bench: no results in the VM's output (exit $rc); see $log" >&2
	exit $((rc ? rc : 1))
fi
printf '%s\n' "$json" >"bench/$name.json.tmp"
# Render before replacing: a broken document must not overwrite good results.
"$out/rdmaperf" -render "bench/$name.json.tmp" >"bench/$name.md.tmp"
mv "bench/$name.json.tmp" "bench/$name.json"
mv "bench/$name.md.tmp" "bench/$name.md"
echo
cat "bench/$name.md"
if ((rc)); then
	echo "bench: the VM job exited $rc; the results may be incomplete (see $log)" >&2
	exit "$rc"
fi
