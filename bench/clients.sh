#!/usr/bin/env bash
# Many clients against one echo server: rdmaperf -test clients over this library and over Go's
# TCP, interleaved, both ends in one process (-local), so that the CPU per request covers the
# client and the server. Runs on a host with an RDMA device (in the Soft-RoCE VM:
#   testbed/vm.sh --timeout 900 -- bench/clients.sh 100 1000
# and for 10,000 connections --mem 8192).
#
#   bench/clients.sh [CONNS...]    (default: 100 1000)
#   bench/clients.sh --table [CONNS...]    (on the host: the rows of make bench)
#   bench/clients.sh --render
#
# --table builds rdmaperf, runs this script in the Soft-RoCE VM (8 GiB, for 10,000 connections;
# default 100 1000 10000) and writes bench/results-clients.txt (the run's output) and
# bench/results-clients.md (a table of the medians of the rounds, dated); --render makes the
# table again from the .txt.
#
# Each run prints rdmaperf's line, then the mean requests per connection in each tenth of the
# connections in dial order, and the dial indexes of the connections served less than half the
# median (rdmaperf -perconn), so that starved connections can be told apart by when they were
# dialed (the library puts about 306 connections on each CQ of rxe, in dial order).
# Environment: RDMA_TEST_ADDR (10.77.0.1); CLIENTS_ROUNDS (2); CLIENTS_SECONDS (8): the window;
# CLIENTS_NETS (rdma tcp); CLIENTS_PROFILE: a directory to write each rdma run's CPU profile to,
# with pprof's top lines printed; RDMAPERF (.testbed-out/rdmaperf); CLIENTS_CMTIME (1): also
# time N rdma_cm connections' setup and teardown with rdmacm-utils' cmtime, the provider's own
# cost for them in C (no data, one work request each way per QP).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/pair.sh
. "$here/pair.sh"
case ${1:-} in
--table | --render)
	cd "$here/.."
	out=bench/results-clients
	if [[ $1 == --table ]]; then
		shift
		(($#)) || set -- 100 1000 10000
		mkdir -p .testbed-out
		"${GO:-go}" build -o .testbed-out/rdmaperf ./cmd/rdmaperf || exit
		echo "# $(date -u +%Y-%m-%dT%H:%MZ)" >"$out.txt.tmp"
		testbed/vm.sh --mem 8192 --timeout 2400 -- bench/clients.sh "$@" | tee -a "$out.txt.tmp"
		if ! grep -q '^clients: done' "$out.txt.tmp"; then
			mv "$out.txt.tmp" "$out.txt.failed"
			echo "clients: the run did not finish; see $out.txt.failed" >&2
			exit 1
		fi
		mv "$out.txt.tmp" "$out.txt"
	fi
	exec "$here/clients-table.awk" "$out.txt" >"$out.md" && cat "$out.md"
	;;
esac
rdmaperf=${RDMAPERF:-$here/../.testbed-out/rdmaperf}
addr=${RDMA_TEST_ADDR:-10.77.0.1}
rounds=${CLIENTS_ROUNDS:-2}
secs=${CLIENTS_SECONDS:-8}
nets=${CLIENTS_NETS:-rdma tcp}
profile=${CLIENTS_PROFILE:-}
(($#)) || set -- 100 1000
# Two ends of every connection in one process; TCP needs a descriptor for each.
ulimit -n 1048576 2>/dev/null || ulimit -n 65536 2>/dev/null || true
work=$(mktemp -d /tmp/rdma-clients.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "clients: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), ulimit -n $(ulimit -n), $(date -u +%FT%TZ)"
for round in $(seq "$rounds"); do
	for n in "$@"; do
		for net in $nets; do
			args=(-local -addr "$addr:0" -net "$net" -test clients -P "$n" -t "$secs")
			[[ $net == rdma ]] && args+=(-stats)
			[[ -n $profile && $net == rdma ]] && args+=(-cpuprofile "$profile/cpu-$n-$round.pprof")
			echo "round $round: rdmaperf ${args[*]}"
			timeout -k 5 900 "$rdmaperf" "${args[@]}" -perconn "$work/perconn" 2>&1 | grep -v '^devices: '
			[[ -s $work/perconn ]] || continue
			rank=$(((n * 50 + 99) / 100))
			med=$(sort -n -k3 "$work/perconn" | awk -v r="$rank" 'NR == r { print $3 }')
			awk -v n="$n" -v med="$med" '
				{ d = int($1 * 10 / n); sum[d] += $3; cnt[d]++ }
				2 * $3 < med { k++; if (k <= 40) line = line " " $1 }
				END {
					printf "  mean requests by tenth of dial order:"
					for (i = 0; i < 10; i++) if (cnt[i]) printf " %.1f", sum[i] / cnt[i]
					print ""
					printf "  under half the median (%d): %d connections, dial indexes:%s%s\n", med, k, line, (k > 40 ? " ..." : "")
				}' "$work/perconn"
			rm -f "$work/perconn"
			if [[ -n $profile && $net == rdma && -s $profile/cpu-$n-$round.pprof ]]; then
				go tool pprof -top -nodecount 25 "$rdmaperf" "$profile/cpu-$n-$round.pprof" 2>/dev/null | sed 's/^/  /'
			fi
		done
	done
done
if [[ ${CLIENTS_CMTIME:-1} == 1 ]] && command -v cmtime >/dev/null; then
	for n in "$@"; do
		for round in $(seq "$rounds"); do
			port=$((7470 + round))
			# cmtime's client exits 0 even when it found no server listening.
			pair_run "$work/cmclient" '^connect *:' timeout -k 5 600 cmtime -b "$addr" -p "$port" -c "$n" -- \
				timeout -k 5 600 cmtime -s "$addr" -p "$port" -c "$n"
			# Rows "step : total-ms max-ms min-us us/conn": setup is every step up to connect,
			# teardown disconnect and destroy.
			awk -F: -v n="$n" '
				NF == 2 && $2 ~ /^ *[0-9.]+ / { name = $1; sub(/ +$/, "", name); split($2, v, " "); t[name] = v[1] }
				END {
					if (!("connect" in t) || !("destroy" in t)) { print "cmtime " n " conns: no step times"; exit }
					setup = t["create id"] + t["bind addr"] + t["resolve addr"] + t["resolve route"] + t["create qp"] + t["connect"]
					printf "cmtime %d conns: setup %.3f s, teardown %.3f s\n", n, setup / 1000, (t["disconnect"] + t["destroy"]) / 1000
				}' "$work/cmclient"
		done
	done
fi
echo "clients: done, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
