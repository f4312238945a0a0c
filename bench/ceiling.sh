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

# shellcheck source=bench/pair.sh
. "$(dirname "$0")/pair.sh"

# run TOOL ARGS...: the server and the client of one perftest measurement; prints the row under
# the client's "#bytes" header.
run() {
	local tool=$1
	shift
	port=$((port + 1))
	pair_run "$work/client" '^ *#bytes' taskset -c 0 timeout -k 5 120 "$tool" -R -p "$port" "$@" -- \
		taskset -c 1 timeout -k 5 120 "$tool" -R -p "$port" "$@" "$addr"
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
