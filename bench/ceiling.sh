#!/usr/bin/env bash
# The provider's ceiling for the applications' shapes of traffic (bench/apps.sh), from perftest
# over rdma_cm on this host's device: run inside the test bed's VM, one round, pinned as
# bench/run.sh pins perftest (server on CPU 0, client on CPU 1). Prints one line per shape:
#
#   ceiling NAME VALUE UNIT    (what perftest measured)
#
#   lat1k   ib_send_lat -s 1024: the typical one-way time of a 1 KiB message, µs
#   rate64  ib_send_bw -b -s 64: 64 B messages per second, both directions together
#   bw1k    ib_send_bw -b -s 1024: MB/s (10^6 bytes), both directions together
#   bw1m    ib_send_bw -b -s 1048576: MB/s, both directions together
#
# Environment: RDMA_TEST_ADDR (10.77.0.1).
set -uo pipefail
addr=${RDMA_TEST_ADDR:-10.77.0.1}
work=$(mktemp -d /tmp/rdma-ceiling.XXXXXX)
trap 'rm -rf "$work"' EXIT
port=18900

# run TOOL ARGS...: the server and the client of one perftest measurement; prints the row under
# the client's "#bytes" header. A client that finds no server yet is tried again.
run() {
	local tool=$1 srv try
	shift
	port=$((port + 1))
	taskset -c 0 timeout -k 5 120 "$tool" -R -p "$port" "$@" >"$work/server" 2>&1 &
	srv=$!
	sleep 1
	for try in 1 2 3 4 5; do
		taskset -c 1 timeout -k 5 120 "$tool" -R -p "$port" "$@" "$addr" >"$work/client" 2>&1 && break
		kill -0 "$srv" 2>/dev/null || break
		sleep 1
	done
	for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$srv" 2>/dev/null || break; sleep 0.5; done
	kill "$srv" 2>/dev/null
	wait "$srv" 2>/dev/null
	awk '/^ *#bytes/ { getline; print; exit }' "$work/client"
}

row=$(run ib_send_lat -s 1024 -n 2000)
[[ -n $row ]] && echo "ceiling lat1k $(awk '{ print $5 }' <<<"$row") µs"
# perftest's MB is 2^20 bytes, its MsgRate millions a second.
row=$(run ib_send_bw -b -s 64 -n 50000)
[[ -n $row ]] && echo "ceiling rate64 $(awk '{ printf "%.0f", $5 * 1e6 }' <<<"$row") msg/s"
row=$(run ib_send_bw -b -s 1024 -n 30000)
[[ -n $row ]] && echo "ceiling bw1k $(awk '{ printf "%.2f", $4 * 1.048576 }' <<<"$row") MB/s"
row=$(run ib_send_bw -b -s 1048576 -n 200)
[[ -n $row ]] && echo "ceiling bw1m $(awk '{ printf "%.2f", $4 * 1.048576 }' <<<"$row") MB/s"
exit 0
