#!/usr/bin/env bash
# The benchmark proper: runs on a host with an RDMA device (in the Soft-RoCE VM: bench/bench.sh
# starts it there through testbed/vm.sh) and measures, on one machine in one run:
#   - this library:  rdmaperf -net rdma (BENCH_GO_MODE: local, one process; or pinned, two)
#   - Go TCP:        rdmaperf -net tcp, same address and mode
#   - perftest:      ib_send_lat / ib_send_bw over rdma_cm (-R), busy polling and -e (events)
#   - rsockets:      rstream
#   - cmtime:        rdma_cm's connection steps, timed by rdmacm-utils' cmtime
#   - datagrams:     rdmaperf -test dgram-* over PacketConn (rdma) and Go's UDP (-net udp), beside
#                    ib_send_lat / ib_send_bw -c UD (perftest over unreliable datagrams)
# for: latency 64 B and 4 KiB, throughput with 4 KiB, 64 KiB and 1 MiB writes, 64 B message rate
# over 1 and 8 connections, io.Copy of a file, connection setup (one dial, and bursts of 20; HTTP/1.1
# with 20 clients), and the CPU an idle connection costs; and one-sided RDMA between registered
# regions (rdmaperf -test write-lat, read-lat, write-bw, read-bw) beside perftest's ib_write_lat,
# ib_read_lat, ib_write_bw and ib_read_bw (-R), with examples/objectstore's PUT and GET by token
# (an HTTP request naming the client's region, the store reading or writing it) at 1 MiB.
#
#   bench/run.sh [RESULTS.json [RDMAPERF]]
#
# The results JSON (read by rdmaperf -render) is printed between the lines BEGIN-JSON and
# END-JSON (a file in the VM's /tmp does not survive it), and also written to RESULTS.json when
# given. RDMAPERF defaults to the repository's .testbed-out/rdmaperf, then to PATH.
# Environment: RDMA_TEST_ADDR (default 10.77.0.1); BENCH_ROUNDS (5): every test is repeated that
# many times, the tools interleaved per workload so that a slow spell of the (emulated) machine
# hits them alike; BENCH_ONLY (all): onesided runs the one-sided section alone, siw the rows
# measured on soft-iWARP (bench.sh runs that in the test bed's siw VM), pair the rows measured
# across two hosts (bench.sh runs run.sh on both VMs of testbed/vm.sh --pair: the agent serves,
# the driver measures), ud the datagram rows alone, setup connection setup and teardown at scale
# (setup_round);
# BENCH_SECONDS (2): length of each rdmaperf test; BENCH_BUDGET (780): no new
# round starts when it might end after this many seconds; BENCH_COPY_BYTES (256 MiB): the file
# io.Copy sends; BENCH_ENVIRONMENT: the machine's
# description in the results (default: the Soft-RoCE VM's).
set -uo pipefail

out_file=${1:-}
here=$(cd "$(dirname "$0")" && pwd)
rdmaperf=${2:-}
if [[ -z $rdmaperf ]]; then
	rdmaperf=$here/../.testbed-out/rdmaperf
	[[ -x $rdmaperf ]] || rdmaperf=$(command -v rdmaperf) || { echo "run.sh: no rdmaperf binary" >&2; exit 2; }
fi
# The library's post pattern in C (bench/postrate.c, built by bench.sh beside rdmaperf).
postrate=$(dirname "$rdmaperf")/postrate
# The object store example's test binary (examples/objectstore, built by bench.sh beside rdmaperf).
objstore=$(dirname "$rdmaperf")/objstore.test
addr=${RDMA_TEST_ADDR:-10.77.0.1}
rounds=${BENCH_ROUNDS:-5}
# io.Copy's file size: 256 MiB keeps a round of the emulated VM within minutes (rdmaperf's own
# default, for real hosts, is 1 GiB).
copy_bytes=${BENCH_COPY_BYTES:-268435456}
secs=${BENCH_SECONDS:-2}
budget=${BENCH_BUDGET:-780}
only=${BENCH_ONLY:-all}
# The RDMA link's MTU (ibv_devinfo's active_mtu of the first port): figures move with it.
link_mtu=$(ibv_devinfo 2>/dev/null | awk '$1 == "active_mtu:" {print $2; exit}')
provider="Soft-RoCE (rdma_rxe)"
ibv_devinfo 2>/dev/null | grep -q 'transport:.*iWARP' && provider="soft-iWARP (siw)"
environment=${BENCH_ENVIRONMENT:-"$provider in a $(nproc)-vCPU TCG VM, RDMA link MTU ${link_mtu:-unknown}; only ratios within one run mean anything"}
tool_timeout=60 # seconds any one process may take; a hung tool becomes a failed measurement

work=$(mktemp -d /tmp/rdma-bench.XXXXXX)
results=$work/results.jsonl
: >"$results"
round=0
# BENCH_GO_MODE: pinned (default) runs rdmaperf's -s and -c as two processes on CPUs 0 and 1, the
# way iperf users run it and the C peers run here: like for like, and the headline. local runs both
# ends in one process, unpinned: in this VM, Go programs pinned to one vCPU each wait for scheduler
# ticks on cross-process wakeups (ms-scale p99), which local leaves out.
go_mode=${BENCH_GO_MODE:-pinned}
port=18600 # perftest's default is 18515; each server gets its own port, never reused

# Servers are started in the background; whatever is still running at the end is killed.
cleanup() {
	local p
	for p in $(jobs -p); do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
}
trap cleanup EXIT

# A JSON string body: backslashes and quotes escaped, control characters made spaces.
jstr() {
	local s=${1//\\/\\\\}
	s=${s//\"/\\\"}
	printf '%s' "${s//[$'\001'-$'\037']/ }"
}

# emit IMPL WORKLOAD SIZE CONNS KEY=VALUE...: one successful result.
emit() {
	local impl=$1 workload=$2 size=$3 conns=$4 kv k v metrics=''
	shift 4
	for kv in "$@"; do
		k=${kv%%=*} v=${kv#*=}
		if [[ ! $v =~ ^-?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?$ ]]; then
			fail "$impl" "$workload" "$size" "$conns" "unparsable $k value '$v'"
			return
		fi
		metrics+="${metrics:+,}\"$k\":$v"
	done
	printf '{"round":%d,"impl":"%s","workload":"%s","size":%d,"conns":%d,"metrics":{%s}}\n' \
		"$round" "$(jstr "$impl")" "$workload" "$size" "$conns" "$metrics" >>"$results"
	echo "  $impl $workload $size x$conns: $*"
}

# fail IMPL WORKLOAD SIZE CONNS MESSAGE: a failed measurement, kept in the results.
fail() {
	printf '{"round":%d,"impl":"%s","workload":"%s","size":%d,"conns":%d,"error":"%s"}\n' \
		"$round" "$(jstr "$1")" "$2" "$3" "$4" "$(jstr "$5")" >>"$results"
	echo "  $1 $2 $3 x$4: FAILED: $5"
}

# Last lines of a log, on one line, for an error message.
tail_of() { tail -n "${2:-3}" "$1" 2>/dev/null | tr '\n\t' '  ' | cut -c1-400; }

# ---- this library and Go TCP ---------------------------------------------------------------

# run_rdmaperf NET WORKLOAD SIZE CONNS ARGS...
run_rdmaperf() {
	local net=$1 workload=$2 size=$3 conns=$4 log=$work/rdmaperf.log line record rc label=rdmaperf/$1
	shift 4
	[[ " $* " == *" -poll busy "* ]] && label+=" busy"
	[[ " $* " == *" -plain "* ]] && label+=" plain"
	if [[ $go_mode == local ]]; then
		timeout -k 5 "$tool_timeout" "$rdmaperf" -local -addr "$addr:0" -net "$net" -json "$@" >"$log" 2>&1
		rc=$?
	elif [[ $go_mode == pair ]]; then
		run_rdmaperf_remote "$net" "$@"
	else
		run_rdmaperf_pinned "$net" "$@"
	fi
	line=$(grep '^{' "$log" | tail -n 1)
	if [[ $line != *'"rdmaperf":{'* ]]; then
		if ((rc == 124)); then
			fail "$label" "$workload" "$size" "$conns" "timed out after ${tool_timeout}s"
		else
			fail "$label" "$workload" "$size" "$conns" "exit $rc: $(tail_of "$log")"
		fi
		return
	fi
	# rdmaperf writes the record itself (with its error, if any); the round is ours to add. Its
	# -json line is iperf3's -J document with the record as the value of the last key, "rdmaperf"
	# (no string before it can hold that key unescaped).
	record=${line#*\"rdmaperf\":}
	record=${record%\}}
	printf '{"round":%d,%s\n' "$round" "${record#\{}" >>"$results"
	echo "  $label $workload $size x$conns: $(printf '%s' "$record" | grep -o '"metrics":{[^}]*}\|"error":"[^"]*"')"
}

# run_rdmaperf_oneproc NET WORKLOAD SIZE CONNS ARGS...: run_rdmaperf with both ends in one process
# (rdmaperf -local, unpinned), as a Go user's own test of the library would run, recorded as impl
# "rdmaperf/rdma one process" beside the headline's two pinned processes.
run_rdmaperf_oneproc() {
	local saved=$go_mode before
	go_mode=local
	before=$(wc -l <"$results")
	run_rdmaperf "$@"
	go_mode=$saved
	# Rename what this call appended (a failure is recorded under the same label).
	if (($(wc -l <"$results") > before)); then
		sed -i "$((before + 1)),\$ s|\"impl\":\"rdmaperf/rdma\([^\"]*\)\"|\"impl\":\"rdmaperf/rdma\1 one process\"|" "$results"
	fi
}

# run_rdmaperf_pinned NET ARGS...: rdmaperf as two processes pinned apart, the way the C peers
# run (server on CPU 0, client on CPU 1); output in $work/rdmaperf.log, status in rc.
run_rdmaperf_pinned() {
	local net=$1 log=$work/rdmaperf.log
	shift
	next_port
	local sargs=()
	[[ " $* " == *" -messages "* ]] && sargs+=(-messages) # the server reads messages too
	taskset -c 0 timeout -k 5 "$tool_timeout" "$rdmaperf" -s -addr "$addr:$port" -net "$net" "${sargs[@]}" >"$work/server.log" 2>&1 &
	local spid=$! try
	for try in 1 2 3 4 5 6 7 8 9 10; do
		sleep 0.3
		taskset -c 1 timeout -k 5 "$tool_timeout" "$rdmaperf" -c "$addr:$port" -net "$net" -json "$@" >"$log" 2>&1
		rc=$?
		((rc != 0)) && grep -qiE 'refused|connect' "$log" && kill -0 "$spid" 2>/dev/null || break
	done
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
}

# Two hosts (BENCH_ONLY=pair): the agent VM runs one rdmaperf server per transport for the whole
# run, and perftest's servers one after another (pair_ports); the driver's clients reach them
# across the virtual link, trying again while the agent is still starting.
pair_port_rdma=18700
pair_port_tcp=18701
pair_port_lat=18710 # ib_send_lat -s 64 -n 2000
run_rdmaperf_remote() {
	local net=$1 log=$work/rdmaperf.log port try
	shift
	port=$pair_port_rdma
	[[ $net == tcp ]] && port=$pair_port_tcp
	for try in $(seq 1 60); do
		timeout -k 5 "$tool_timeout" "$rdmaperf" -c "$RDMA_TEST_PEER_ADDR:$port" -net "$net" -json "$@" >"$log" 2>&1
		rc=$?
		((rc != 0)) && grep -qiE 'refused|unreachable|no route' "$log" || break
		sleep 1
	done
}

# ---- peer tools: a server and a client pinned to different CPUs ----------------------------
# With two busy-polling processes on a 2-vCPU VM, unpinned, the kernel's rxe work often waits for
# a 4 ms scheduler tick (ib_send_lat swings between ~40 µs and ~4 ms from run to run), and both
# on one CPU barely progress. Pinned apart, they are stable: the way perftest is meant to run.

# pair SERVER-CMD... -- CLIENT-CMD...: runs the server in the background (CPU 0), then the client
# (CPU 1), retrying the client while the server is not listening yet. The client's output is in
# $work/client.log, the server's in $work/server.log. Returns the client's status.
pair() {
	local srv=() cli=() spid rc try
	while [[ $1 != -- ]]; do srv+=("$1"); shift; done
	shift
	cli=("$@")
	if [[ $go_mode == pair ]]; then
		pair_remote "${cli[@]}"
		return
	fi
	taskset -c 0 timeout -k 5 "$tool_timeout" "${srv[@]}" >"$work/server.log" 2>&1 &
	spid=$!
	sleep 1
	for try in 1 2 3 4 5; do
		taskset -c 1 timeout -k 5 "$tool_timeout" "${cli[@]}" >"$work/client.log" 2>&1
		rc=$?
		((rc != 0 && try < 5)) || break
		# Only a refused or unanswered connect is retried (the server starts slowly the first
		# time, its binary coming over 9p); a failure after connecting is final.
		kill -0 "$spid" 2>/dev/null || break
		grep -qiE 'unable to (init|perform rdma_client)|connection refused|rconnect|REJECTED|ADDR_ERROR|unreachable' \
			"$work/client.log" || break
		echo "  (server not ready, retrying: $(tail_of "$work/client.log" 1))"
		sleep 1
	done
	# The server ends with its client; one that does not is killed rather than waited for.
	for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$spid" 2>/dev/null || break; sleep 0.5; done
	kill "$spid" 2>/dev/null
	wait "$spid" 2>/dev/null
	return "$rc"
}

# pair_remote CLIENT-CMD...: with two hosts, the server is the agent's (pair_ports), always
# listening again after each client: only the client runs here, retried like pair's.
pair_remote() {
	local try
	for try in $(seq 1 30); do
		timeout -k 5 "$tool_timeout" "$@" >"$work/client.log" 2>&1
		rc=$?
		((rc != 0)) || break
		grep -qiE 'unable to (init|perform rdma_client)|connection refused|REJECTED|ADDR_ERROR|unreachable' \
			"$work/client.log" || break
		sleep 1
	done
	return "$rc"
}

next_port() { port=$((port + 1)); }

# perftest_target: the port and address a perftest client uses: a fresh port here, or with two
# hosts the agent's server for this tool (pair_ports).
perftest_target() {
	if [[ $go_mode == pair ]]; then
		port=$1
		target=$RDMA_TEST_PEER_ADDR
	else
		next_port
		target=$addr
	fi
}

# perftest_row FILE: the data row of a perftest report as KEY=VALUE lines, keys from its header
# (#bytes, #iterations, t_typical, t_avg, p99, p999, bw_peak, bw_avg, MsgRate, ...). Works by
# column name, not position, so extra or reordered columns in other perftest versions are fine.
perftest_row() {
	awk '
		/#bytes/ {
			h = $0
			gsub(/99\.9% percentile/, "p999", h); gsub(/99% percentile/, "p99", h)
			gsub(/BW peak/, "bw_peak", h); gsub(/BW average/, "bw_avg", h)
			gsub(/\[[^]]*\]/, "", h); gsub(/#/, "", h)
			n = split(h, col, " "); want = 1; next
		}
		want && $1 ~ /^[0-9]+$/ && NF >= n {
			for (i = 1; i <= n; i++) print col[i] "=" $i
			want = 0; found = 1
		}
		END { exit !found }
	' "$1"
}

# perftest_fields FILE: perftest_row into the associative array pf. (No process substitution:
# the VM's /dev has no /dev/fd.)
declare -A pf
perftest_fields() {
	local k v rows
	pf=()
	rows=$(perftest_row "$1") || return 1
	while IFS='=' read -r k v; do pf[$k]=$v; done <<<"$rows"
	((${#pf[@]} > 0))
}

# perftest_lat IMPL SIZE ITERS [-e]
perftest_lat() {
	local impl=$1 size=$2 n=$3 rc target
	shift 3
	perftest_target "$pair_port_lat"
	pair ib_send_lat -R -p "$port" -s "$size" -n "$n" "$@" -- \
		ib_send_lat -R -p "$port" -s "$size" -n "$n" "$@" "$target"
	rc=$?
	if ((rc)); then
		fail "$impl" lat "$size" 1 "ib_send_lat exit $rc: $(tail_of "$work/client.log")"
	elif ! perftest_fields "$work/client.log"; then
		fail "$impl" lat "$size" 1 "no result row in ib_send_lat output: $(tail_of "$work/client.log")"
	else
		emit "$impl" lat "$size" 1 \
			"p50_us=${pf[t_typical]:-}" "p99_us=${pf[p99]:-}" "avg_us=${pf[t_avg]:-}" "count=${pf[iterations]:-}"
	fi
}

# perftest_bw WORKLOAD SIZE ITERS QPS
perftest_bw() {
	local workload=$1 size=$2 n=$3 qps=$4 mbs rc
	next_port
	pair ib_send_bw -R -p "$port" -s "$size" -n "$n" -q "$qps" -- \
		ib_send_bw -R -p "$port" -s "$size" -n "$n" -q "$qps" "$addr"
	rc=$?
	if ((rc)); then
		fail perftest "$workload" "$size" "$qps" "ib_send_bw exit $rc: $(tail_of "$work/client.log")"
	elif ! perftest_fields "$work/client.log" || [[ -z ${pf[bw_avg]:-} || -z ${pf[MsgRate]:-} ]]; then
		fail perftest "$workload" "$size" "$qps" "no result row in ib_send_bw output: $(tail_of "$work/client.log")"
	else
		# perftest's MB is 2^20 bytes; ours is 10^6. MsgRate is in millions of messages/s.
		mbs=$(awk -v m="${pf[bw_avg]}" 'BEGIN { printf "%.4f", m * 1.048576 }')
		emit perftest "$workload" "$size" "$qps" \
			"mb_s=$mbs" "msg_s=$(awk -v r="${pf[MsgRate]}" 'BEGIN { printf "%.1f", r * 1e6 }')" \
			"count=${pf[iterations]:-0}"
	fi
}

# postrate_run WORKLOAD CHAIN: bench/postrate.c, this library's one-way pattern for 64 B messages
# (an RDMA WRITE with immediate per message into a 16 KiB ring, every 8th signaled, inline; the
# receiver returns credits in a SEND of their own every 16) written in C, CHAIN messages per
# ibv_post_send: what the pattern costs the provider without Go, beside ib_send_bw.
postrate_run() {
	local workload=$1 chain=$2 n=100000 rc msgs
	[[ -x $postrate ]] || { fail postrate "$workload" 64 1 "no postrate binary"; return; }
	next_port
	pair "$postrate" -s -p "$port" -n "$n" -- "$postrate" -c "$addr" -p "$port" -n "$n" -l "$chain"
	rc=$?
	msgs=$(awk '$1 == "sender:" {for (i = 1; i < NF; i++) if ($(i + 1) == "msg/s") print $i}' "$work/client.log")
	if ((rc)) || [[ -z $msgs ]]; then
		fail postrate "$workload" 64 1 "postrate exit $rc: $(tail_of "$work/client.log")"
	else
		emit postrate "$workload" 64 1 "msg_s=$msgs" "count=$n"
	fi
}

# postrate_lat: bench/postrate.c -L, this library's 64 B ping-pong on iWARP (a 72 B inline SEND,
# its 8-byte header and the payload, into 128-byte receive slots, every 32nd signaled) in C, beside
# ib_send_lat: what the pattern costs the provider without Go.
postrate_lat() {
	local n=10000 rc p50 p99 avg
	[[ -x $postrate ]] || { fail postrate lat 64 1 "no postrate binary"; return; }
	next_port
	pair "$postrate" -s -L -b 72 -p "$port" -n "$n" -- "$postrate" -c "$addr" -L -b 72 -p "$port" -n "$n"
	rc=$?
	field() { awk -v f="$1" '$1 == "latency:" { for (i = 1; i < NF; i++) if ($i == f) print $(i + 1) }' "$work/client.log"; }
	p50=$(field p50) p99=$(field p99) avg=$(field avg)
	if ((rc)) || [[ -z $p50 ]]; then
		fail postrate lat 64 1 "postrate -L exit $rc: $(tail_of "$work/client.log")"
	else
		emit postrate lat 64 1 "p50_us=$p50" "p99_us=$p99" "avg_us=$avg" "count=$n"
	fi
}

# perftest_onesided WORKLOAD TOOL SIZE ITERS [ARGS...]: ib_write_lat, ib_read_lat, ib_write_bw,
# ib_read_bw, ib_atomic_lat or ib_atomic_bw over rdma_cm (-R), the row's workload being
# rdmaperf's name for the same test; ARGS go to both ends.
perftest_onesided() {
	local workload=$1 tool=$2 size=$3 n=$4 rc mbs
	shift 4
	local sz=(-s "$size")
	[[ $tool == ib_atomic_* ]] && sz=() # the word is 8 bytes whatever -s says
	next_port
	pair "$tool" -R -p "$port" "${sz[@]}" -n "$n" "$@" -- "$tool" -R -p "$port" "${sz[@]}" -n "$n" "$@" "$addr"
	rc=$?
	if ((rc)); then
		fail perftest "$workload" "$size" 1 "$tool exit $rc: $(tail_of "$work/client.log")"
		return
	fi
	if ! perftest_fields "$work/client.log"; then
		fail perftest "$workload" "$size" 1 "no result row in $tool output: $(tail_of "$work/client.log")"
		return
	fi
	case $workload in
	*-lat)
		emit perftest "$workload" "$size" 1 \
			"p50_us=${pf[t_typical]:-}" "p99_us=${pf[p99]:-}" "avg_us=${pf[t_avg]:-}" "count=${pf[iterations]:-}"
		;;
	atomic-rate)
		# MsgRate is in millions of operations per second.
		emit perftest "$workload" "$size" 1 "msg_s=$(awk -v m="${pf[MsgRate]:-0}" 'BEGIN { printf "%.1f", m * 1e6 }')" "count=${pf[iterations]:-0}"
		;;
	*)
		mbs=$(awk -v m="${pf[bw_avg]:-}" 'BEGIN { printf "%.4f", m * 1.048576 }')
		emit perftest "$workload" "$size" 1 "mb_s=$mbs" "count=${pf[iterations]:-0}"
		;;
	esac
}

# rstream_run WORKLOAD SIZE COUNT ITERS: rstream's custom test sends COUNT transfers one way and
# COUNT back, ITERS times, and reports usec/xfer = time / (2 * COUNT * ITERS). With COUNT 1 that is
# a ping-pong (usec/xfer is half the round trip); with ITERS 1 it is streaming.
rstream_run() {
	local workload=$1 size=$2 count=$3 iters=$4 us rc
	next_port
	pair rstream -p "$port" -S "$size" -C "$count" -I "$iters" -- \
		rstream -s "$addr" -p "$port" -S "$size" -C "$count" -I "$iters"
	rc=$?
	if ((rc)); then
		fail rsockets "$workload" "$size" 1 "rstream exit $rc: $(tail_of "$work/client.log")"
		return
	fi
	# The last column of the row after the "name bytes xfers ... usec/xfer" header.
	us=$(awk '/usec\/xfer/ { getline; print $NF; exit }' "$work/client.log")
	if [[ -z $us ]] || ! awk -v u="$us" 'BEGIN { exit !(u > 0) }'; then
		fail rsockets "$workload" "$size" 1 "no result row in rstream output: $(tail_of "$work/client.log")"
		return
	fi
	case $workload in
	lat) emit rsockets lat "$size" 1 "avg_us=$us" "count=$iters" ;;
	bw) emit rsockets bw "$size" 1 "mb_s=$(awk -v s="$size" -v u="$us" 'BEGIN { printf "%.4f", s / u }')" "count=$count" ;;
	rate | rate-msg | rate-msg-nodelay) emit rsockets "$workload" "$size" 1 "msg_s=$(awk -v u="$us" 'BEGIN { printf "%.1f", 1e6 / u }')" "count=$count" ;;
	esac
}

# cmtime_run CONNS: cmtime's client opens CONNS rdma_cm connections step by step, every connection
# through a step before the next step starts (create id, resolve address, resolve route, create QP,
# connect, then disconnect and destroy), and prints each step's total (wall) time. Its server
# exits after CONNS disconnects, and serves only one client process (later ones fail creating
# their QPs): one pair per measurement.
cmtime_run() {
	local conns=$1 rc figures
	next_port
	# cmtime reports a rejected or failed connection on stdout and still exits 0: the wrapper
	# makes that a failure, which pair retries while the server is not listening yet.
	# shellcheck disable=SC2016 # the inner bash expands them
	pair cmtime -b "$addr" -p "$port" -c "$conns" -- \
		bash -c 'out=$(cmtime "$@" 2>&1); rc=$?; printf "%s\n" "$out"
			((rc == 0)) && ! grep -qiE "^event: |error|failure" <<<"$out"' cmtime \
		-s "$addr" -p "$port" -c "$conns"
	rc=$?
	if ((rc)); then
		fail cmtime dial 0 "$conns" "cmtime exit $rc: $(tail_of "$work/client.log")"
		return
	fi
	# Rows "step name : total-ms max-ms min-us us/conn". Setup is every step up to connect;
	# the whole adds disconnect and destroy, as Close follows Dial in rdmaperf's figure.
	figures=$(awk -F: -v n="$conns" '
		NF == 2 && $2 ~ /^ *[0-9.]+ / {
			name = $1; sub(/ +$/, "", name); split($2, v, " "); total[name] = v[1] * 1000
		}
		END {
			split("create id,resolve addr,resolve route,create qp,connect,disconnect,destroy", want, ",")
			for (i = 1; i <= 7; i++) if (!(want[i] in total)) exit 1
			setup = total["create id"] + total["bind addr"] + total["resolve addr"] + total["resolve route"] \
				+ total["create qp"] + total["connect"]
			all = setup + total["disconnect"] + total["destroy"]
			if (all <= 0) exit 1
			printf "p50_us=%.1f setup_us=%.1f conn_s=%.1f count=%d", all, setup, n * 1e6 / all, n
		}' "$work/client.log")
	if [[ -z $figures ]]; then
		fail cmtime dial 0 "$conns" "no step times in cmtime output: $(tail_of "$work/client.log")"
		return
	fi
	# shellcheck disable=SC2086 # KEY=VALUE words
	emit cmtime dial 0 "$conns" $figures
}

# ---- datagrams: perftest over UD ------------------------------------------------------------
# perftest's UD mode has no rdma_cm for its bandwidth tool here (-R fails to connect), so both
# tools run over their own out-of-band socket with the device and the GID index given: the RoCE v2
# GID that carries $addr (::ffff:a.b.c.d), found in sysfs.
ud_dev=''
ud_gid=''
ud_target() {
	local d i want
	[[ -n $ud_dev ]] && return 0
	want=$(awk -F. -v a="$addr" 'BEGIN { split(a, o, "."); printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", o[1], o[2], o[3], o[4] }')
	for d in /sys/class/infiniband/*; do
		for i in $(ls "$d/ports/1/gids" 2>/dev/null); do
			[[ $(cat "$d/ports/1/gids/$i" 2>/dev/null) == "$want" ]] || continue
			[[ $(cat "$d/ports/1/gid_attrs/types/$i" 2>/dev/null) == "RoCE v2" ]] || continue
			ud_dev=${d##*/} ud_gid=$i
			return 0
		done
	done
	return 1
}

# perftest_ud_lat SIZE ITERS: ib_send_lat -c UD, its p50, p99 and average (half the round trip).
perftest_ud_lat() {
	local size=$1 n=$2 rc
	if ! ud_target; then
		fail perftest dgram-lat "$size" 1 "no RoCE v2 GID for $addr"
		return
	fi
	next_port
	pair ib_send_lat -c UD -d "$ud_dev" -x "$ud_gid" -p "$port" -s "$size" -n "$n" -- \
		ib_send_lat -c UD -d "$ud_dev" -x "$ud_gid" -p "$port" -s "$size" -n "$n" "$addr"
	rc=$?
	if ((rc)); then
		fail perftest dgram-lat "$size" 1 "ib_send_lat -c UD exit $rc: $(tail_of "$work/client.log")"
	elif ! perftest_fields "$work/client.log"; then
		fail perftest dgram-lat "$size" 1 "no result row in ib_send_lat output: $(tail_of "$work/client.log")"
	else
		emit perftest dgram-lat "$size" 1 \
			"p50_us=${pf[t_typical]:-}" "p99_us=${pf[p99]:-}" "avg_us=${pf[t_avg]:-}" "count=${pf[iterations]:-}" "lost=0"
	fi
}

# perftest_ud_bw WORKLOAD ROW-SIZE SIZE ITERS: ib_send_bw -c UD with SIZE-byte datagrams (at most
# the MTU: perftest's UD does not fragment), recorded in the row of ROW-SIZE: the sender's figures
# from its client, what arrived from its server's report.
perftest_ud_bw() {
	local workload=$1 row=$2 size=$3 n=$4 rc sent_mb sent_msg
	if ! ud_target; then
		fail perftest "$workload" "$row" 1 "no RoCE v2 GID for $addr"
		return
	fi
	next_port
	pair ib_send_bw -c UD -d "$ud_dev" -x "$ud_gid" -p "$port" -s "$size" -n "$n" -- \
		ib_send_bw -c UD -d "$ud_dev" -x "$ud_gid" -p "$port" -s "$size" -n "$n" "$addr"
	rc=$?
	if ((rc)); then
		fail perftest "$workload" "$row" 1 "ib_send_bw -c UD exit $rc: $(tail_of "$work/client.log")"
		return
	fi
	if ! perftest_fields "$work/client.log" || [[ -z ${pf[bw_avg]:-} || -z ${pf[MsgRate]:-} ]]; then
		fail perftest "$workload" "$row" 1 "no result row in ib_send_bw output: $(tail_of "$work/client.log")"
		return
	fi
	sent_mb=$(awk -v m="${pf[bw_avg]}" 'BEGIN { printf "%.4f", m * 1.048576 }')
	sent_msg=$(awk -v r="${pf[MsgRate]}" 'BEGIN { printf "%.1f", r * 1e6 }')
	if ! perftest_fields "$work/server.log" || [[ -z ${pf[bw_avg]:-} || -z ${pf[MsgRate]:-} ]]; then
		fail perftest "$workload" "$row" 1 "no result row in ib_send_bw's server output: $(tail_of "$work/server.log")"
		return
	fi
	emit perftest "$workload" "$row" 1 "mb_s=$sent_mb" "msg_s=$sent_msg" \
		"recv_mb_s=$(awk -v m="${pf[bw_avg]}" 'BEGIN { printf "%.4f", m * 1.048576 }')" \
		"recv_msg_s=$(awk -v r="${pf[MsgRate]}" 'BEGIN { printf "%.1f", r * 1e6 }')" \
		"count=$n" "size_b=$size"
}

# ---- the run -------------------------------------------------------------------------------

# ud_round: datagrams (BENCH_ONLY=ud, and in the full run): this library's PacketConn, one
# WriteTo per datagram and 32 per WriteBatch, beside perftest over UD and Go's UDP (-net udp),
# one WriteTo per datagram and 32 per sendmmsg (golang.org/x/net's WriteBatch).
ud_round() {
	local net size psize
	echo "== datagrams, latency (round $round)"
	for net in rdma udp; do run_rdmaperf "$net" dgram-lat 64 1 -test dgram-lat -size 64 -duration "${secs}s"; done
	[[ $go_mode == pinned ]] && run_rdmaperf_oneproc rdma dgram-lat 64 1 -test dgram-lat -size 64 -duration "${secs}s"
	perftest_ud_lat 64 2000
	echo "== datagrams, rate 64 B (round $round)"
	for net in rdma udp; do
		run_rdmaperf "$net" dgram-rate 64 1 -test dgram-rate -size 64 -duration "${secs}s"
		run_rdmaperf "$net" dgram-rate 64 1 -test dgram-rate -size 64 -batch 32 -duration "${secs}s"
	done
	[[ $go_mode == pinned ]] && run_rdmaperf_oneproc rdma dgram-rate 64 1 -test dgram-rate -size 64 -batch 32 -duration "${secs}s"
	perftest_ud_bw dgram-rate 64 64 $((25000 * secs))
	echo "== datagrams, throughput (round $round)"
	# 4092 B is the largest datagram a 4096 B MTU carries whole (the library's header is 4 B);
	# 65507 B, the largest, goes in 17 fragments. perftest's UD sends at most the MTU: its row
	# beside 65507 B is ib_send_bw -c UD -s 4096.
	for size in 1024 4092 65507; do
		run_rdmaperf rdma dgram-bw "$size" 1 -test dgram-bw -size "$size" -batch 32 -duration "${secs}s"
		[[ $go_mode == pinned && $size == 65507 ]] && run_rdmaperf_oneproc rdma dgram-bw "$size" 1 -test dgram-bw -size "$size" -batch 32 -duration "${secs}s"
		for net in udp; do
			run_rdmaperf "$net" dgram-bw "$size" 1 -test dgram-bw -size "$size" -duration "${secs}s"
			run_rdmaperf "$net" dgram-bw "$size" 1 -test dgram-bw -size "$size" -batch 32 -duration "${secs}s"
		done
		psize=$((size > 4096 ? 4096 : size))
		perftest_ud_bw dgram-bw "$size" "$psize" $((size > 1024 ? 3000 : 5000))
	done
}

# objstore_run OP SIZE MODE: examples/objectstore's PUT (the store RDMA-READs the client's region)
# or GET (it RDMA-WRITEs into it) of SIZE bytes, one request at a time over HTTP on one
# connection (BenchmarkObjectStore): MODE token (the client registers and closes a region per
# request), body-rdma (HTTP bodies over the same RDMA connection) or body-tcp (over Go TCP).
objstore_run() {
	local op=$1 size=$2 mode=$3 rc mbs name n impl workload
	workload=objstore-$(tr '[:upper:]' '[:lower:]' <<<"$op")
	case $mode in
	token) impl="objectstore token" ;;
	body-rdma) impl="objectstore body" ;;
	body-tcp) impl="objectstore body tcp" ;;
	esac
	case $size in
	4096) name=4KiB n=100 ;;
	1048576) name=1MiB n=10 ;;
	*) name=16MiB n=3 ;;
	esac
	[[ -x $objstore ]] || { fail "$impl" "$workload" "$size" 1 "no objstore.test binary"; return; }
	RDMA_TEST_ADDR=$addr timeout -k 5 "$tool_timeout" "$objstore" -test.run '^$' \
		-test.bench "^BenchmarkObjectStore\$/^$op\$/^$name\$/^$mode\$" -test.benchtime "${n}x" >"$work/objstore.log" 2>&1
	rc=$?
	# The figure before "MB/s" on the benchmark's line (1 MB = 10^6 bytes, as rdmaperf's).
	mbs=$(awk '$1 ~ /^BenchmarkObjectStore\// { for (i = 2; i < NF; i++) if ($(i + 1) == "MB/s") print $i }' "$work/objstore.log")
	if ((rc)) || [[ -z $mbs ]]; then
		fail "$impl" "$workload" "$size" 1 "objstore.test exit $rc: $(tail_of "$work/objstore.log")"
		return
	fi
	emit "$impl" "$workload" "$size" 1 "mb_s=$mbs" "count=$n"
}

# objstore_round: the object store's PUT and GET of 4 KiB, 1 MiB and 16 MiB by token, by HTTP
# body over RDMA and over Go TCP, beside ib_read_bw (PUT) and ib_write_bw (GET) of the same size.
objstore_round() {
	local size mode
	echo "== the object store example (round $round)"
	for size in 4096 1048576 16777216; do
		for mode in token body-rdma body-tcp; do objstore_run PUT "$size" "$mode"; done
		perftest_onesided objstore-put ib_read_bw "$size" $((size == 4096 ? 2000 : size == 1048576 ? 50 : 10))
		for mode in token body-rdma body-tcp; do objstore_run GET "$size" "$mode"; done
		perftest_onesided objstore-get ib_write_bw "$size" $((size == 4096 ? 2000 : size == 1048576 ? 50 : 10))
	done
}

# The one-sided section: this library's RemoteRegion between registered regions and perftest's
# one-sided tools, on the same sizes, interleaved; then the object store example (objstore_round).
onesided_round() {
	local size
	echo "== one-sided RDMA (round $round)"
	for size in 64 4096; do
		run_rdmaperf rdma write-lat "$size" 1 -test write-lat -size "$size" -duration "${secs}s"
		perftest_onesided write-lat ib_write_lat "$size" 2000
		run_rdmaperf rdma read-lat "$size" 1 -test read-lat -size "$size" -duration "${secs}s"
		perftest_onesided read-lat ib_read_lat "$size" 2000
	done
	for size in 65536 1048576; do
		run_rdmaperf rdma write-bw "$size" 1 -test write-bw -size "$size" -duration "${secs}s"
		perftest_onesided write-bw ib_write_bw "$size" $((size == 65536 ? 300 : 20))
		run_rdmaperf rdma read-bw "$size" 1 -test read-bw -size "$size" -duration "${secs}s"
		perftest_onesided read-bw ib_read_bw "$size" $((size == 65536 ? 300 : 20))
	done
	# Remote atomics (fetch-and-add on one 8-byte word); soft-iWARP has none.
	if [[ $provider != *siw* ]]; then
		run_rdmaperf rdma atomic-lat 8 1 -test atomic-lat -size 8 -duration "${secs}s"
		perftest_onesided atomic-lat ib_atomic_lat 8 2000 -A FETCH_AND_ADD
		run_rdmaperf rdma atomic-rate 8 1 -test atomic-rate -size 8 -duration "${secs}s"
		perftest_onesided atomic-rate ib_atomic_bw 8 2000 -A FETCH_AND_ADD
	fi
}

# siw_round: what the soft-iWARP test bed measures (BENCH_ONLY=siw): latency 64 B, streaming
# 64 KiB and the one-sided rows, beside perftest and rstream on the same siw device.
siw_round() {
	echo "== latency, siw (round $round)"
	run_rdmaperf rdma lat 64 1 -test lat -size 64 -duration "${secs}s" -stats
	run_rdmaperf rdma lat 64 1 -test lat -size 64 -duration "${secs}s" -poll busy -stats
	[[ $go_mode == pinned ]] && run_rdmaperf_oneproc rdma lat 64 1 -test lat -size 64 -duration "${secs}s" -stats
	perftest_lat perftest 64 2000
	postrate_lat
	rstream_run lat 64 1 2000
	echo "== throughput, siw (round $round)"
	run_rdmaperf rdma bw 65536 1 -test bw -size 65536 -duration "${secs}s" -stats
	[[ $go_mode == pinned ]] && run_rdmaperf_oneproc rdma bw 65536 1 -test bw -size 65536 -duration "${secs}s" -stats
	perftest_bw bw 65536 300 1
	rstream_run bw 65536 200 1
	onesided_round
}

# pair_round: across the two VMs of the test bed (BENCH_ONLY=pair), where TCP crosses the same
# virtual NIC as RDMA: latency beside Go TCP and perftest, a stream, connection setup and HTTP/1.1
# beside Go TCP.
pair_round() {
	local net conns
	echo "== two hosts (round $round)"
	for net in rdma tcp; do run_rdmaperf "$net" lat 64 1 -test lat -size 64 -duration "${secs}s" -stats; done
	perftest_lat "perftest -e" 64 2000 -e
	# No perftest beside the stream: ib_send_bw, busy or -e, moved 0.8-2 MB/s across these 1-vCPU
	# VMs (its receives reposted too late, the sender waiting on RNR retries), no reference.
	for net in rdma tcp; do run_rdmaperf "$net" bw 65536 1 -test bw -size 65536 -duration "${secs}s" -stats; done
	for conns in 1 20; do
		for net in rdma tcp; do run_rdmaperf "$net" dial 0 "$conns" -test dial -conns "$conns" -duration "${secs}s"; done
	done
	for net in rdma tcp; do run_rdmaperf "$net" http 64 20 -test http -size 64 -conns 20 -duration "${secs}s"; done
	for net in rdma tcp; do run_rdmaperf "$net" http-kept 64 20 -test http -keep -size 64 -conns 20 -duration "${secs}s"; done
}

# setup_round: connection setup and teardown at scale (BENCH_ONLY=setup): bursts of
# BENCH_SETUP_CONNS (1000 4000) connections dialed, used once and closed at once, beside Go TCP and
# cmtime (rdma_cm in C, which takes all of them through each step in turn).
setup_round() {
	local conns net
	echo "== connection setup at scale (round $round)"
	for conns in ${BENCH_SETUP_CONNS:-1000 4000}; do
		for net in rdma tcp; do
			run_rdmaperf "$net" dial 0 "$conns" -test dial -conns "$conns" -duration "${secs}s"
		done
		cmtime_run "$conns"
	done
}

one_round() {
	local net size
	if [[ $only == pair ]]; then
		pair_round
		return
	fi
	if [[ $only == onesided ]]; then
		onesided_round
		objstore_round
		return
	fi
	if [[ $only == siw ]]; then
		siw_round
		return
	fi
	if [[ $only == ud ]]; then
		ud_round
		return
	fi
	if [[ $only == setup ]]; then
		setup_round
		return
	fi
	echo "== latency (round $round)"
	for size in 64 4096; do
		for net in rdma tcp; do run_rdmaperf "$net" lat "$size" 1 -test lat -size "$size" -duration "${secs}s" -stats; done
		run_rdmaperf rdma lat "$size" 1 -test lat -size "$size" -duration "${secs}s" -poll busy -stats
		[[ $go_mode == pinned ]] && run_rdmaperf_oneproc rdma lat "$size" 1 -test lat -size "$size" -duration "${secs}s" -stats
		perftest_lat perftest "$size" 2000
		perftest_lat "perftest -e" "$size" 2000 -e
		rstream_run lat "$size" 1 2000
	done
	echo "== throughput (round $round)"
	for size in 4096 65536 1048576; do
		for net in rdma tcp; do run_rdmaperf "$net" bw "$size" 1 -test bw -size "$size" -duration "${secs}s" -stats; done
		[[ $go_mode == pinned ]] && run_rdmaperf_oneproc rdma bw "$size" 1 -test bw -size "$size" -duration "${secs}s" -stats
		case $size in
		4096) perftest_bw bw 4096 3000 1; rstream_run bw 4096 2000 1 ;;
		65536) perftest_bw bw 65536 300 1; rstream_run bw 65536 200 1 ;;
		1048576) perftest_bw bw 1048576 20 1; rstream_run bw 1048576 20 1 ;;
		esac
	done
	echo "== message rate, 64 B (round $round)"
	for net in rdma tcp; do run_rdmaperf "$net" rate 64 1 -test rate -size 64 -duration "${secs}s" -stats; done
	perftest_bw rate 64 10000 1
	rstream_run rate 64 10000 1
	# One message per Write, like the peers: the reader is message-oriented, so the writer never
	# gathers. The peers' rows are measured again so that each row compares one run's figures.
	run_rdmaperf rdma rate-msg 64 1 -test rate -size 64 -duration "${secs}s" -messages -stats
	perftest_bw rate-msg 64 10000 1
	rstream_run rate-msg 64 10000 1
	postrate_run rate-msg 8
	# The same with every Write posted on its own (SetNoDelay(true)), as the peers post.
	run_rdmaperf rdma rate-msg-nodelay 64 1 -test rate -size 64 -duration "${secs}s" -messages -nodelay -stats
	perftest_bw rate-msg-nodelay 64 10000 1
	rstream_run rate-msg-nodelay 64 10000 1
	postrate_run rate-msg-nodelay 1
	for net in rdma tcp; do run_rdmaperf "$net" rate 64 8 -test rate -size 64 -conns 8 -duration "${secs}s"; done
	perftest_bw rate 64 2000 8
	echo "== io.Copy of a file, $copy_bytes B (round $round)"
	for net in rdma tcp; do run_rdmaperf "$net" copy "$copy_bytes" 1 -test copy -bytes "$copy_bytes"; done
	run_rdmaperf rdma copy "$copy_bytes" 1 -test copy -bytes "$copy_bytes" -plain
	echo "== connection setup (round $round)"
	local conns
	for conns in 1 20; do
		for net in rdma tcp; do
			run_rdmaperf "$net" dial 0 "$conns" -test dial -conns "$conns" -duration "${secs}s"
		done
		cmtime_run "$conns"
	done
	for net in rdma tcp; do run_rdmaperf "$net" http 64 20 -test http -size 64 -conns 20 -duration "${secs}s"; done
	for net in rdma tcp; do run_rdmaperf "$net" http-kept 64 20 -test http -keep -size 64 -conns 20 -duration "${secs}s"; done
	onesided_round
	[[ $go_mode == pair ]] || objstore_round
	ud_round
}

if [[ $only == pair ]]; then
	go_mode=pair
	if [[ ${RDMA_TEST_ROLE:-} == agent ]]; then
		# The serving host: both servers until the driver's run ends (the harness then stops
		# this VM).
		"$rdmaperf" -s -addr "$addr:$pair_port_rdma" -net rdma &
		"$rdmaperf" -s -addr "$addr:$pair_port_tcp" -net tcp &
		# perftest with -e: with one vCPU a busy-polling process starves rxe's own work on it.
		while :; do ib_send_lat -R -e -p "$pair_port_lat" -s 64 -n 2000 >/dev/null 2>&1 || sleep 0.2; done &
		wait
		exit 0
	fi
	[[ ${RDMA_TEST_ROLE:-} == driver ]] || { echo "run.sh: BENCH_ONLY=pair runs on testbed/vm.sh --pair" >&2; exit 2; }
	environment=${BENCH_ENVIRONMENT:-"$provider across two 1-vCPU TCG VMs joined by a virtual NIC (frames as UDP datagrams over the host's loopback), RDMA link MTU ${link_mtu:-unknown}; only ratios within one run mean anything"}
fi

echo "rdma bench: $(uname -r), $(nproc) CPUs, rdmaperf $rdmaperf, rounds: $rounds, ${secs} s per rdmaperf test"
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# Bring every binary and its libraries in once: the first exec over 9p is slow.
for t in "$rdmaperf" "$(command -v ib_send_lat)" "$(command -v ib_send_bw)" "$(command -v rstream)" "$(command -v cmtime)" \
	"$(command -v ib_write_lat)" "$(command -v ib_read_lat)" "$(command -v ib_write_bw)" "$(command -v ib_read_bw)" \
	"$(command -v ib_atomic_lat)" "$(command -v ib_atomic_bw)"; do
	[[ -n $t ]] && cat "$t" >/dev/null
done
start=$SECONDS
last=0
done_rounds=0
for ((r = 1; r <= rounds; r++)); do
	if ((r > 1 && SECONDS - start + last > budget)); then
		echo "== stopping after $done_rounds rounds: another would pass the ${budget}s budget"
		break
	fi
	round=$r
	t0=$SECONDS
	one_round
	last=$((SECONDS - t0))
	done_rounds=$r
	if ((r == 1)) && [[ $only == all ]]; then
		# Once is enough: idle CPU varies little, and it costs 5 s a transport.
		echo "== idle connection, 5 s (round $round)"
		for net in rdma tcp; do run_rdmaperf "$net" idle 64 1 -idle 5s; done
	fi
done
echo "== done in $((SECONDS - start)) s"

notes=(
	"the tools are interleaved per workload; rounds: $done_rounds; each figure is the median of its rounds"
	"this library and Go TCP: rdmaperf, mode $go_mode (local: both ends in one Go process, unpinned; pinned: -s and -c as two processes on CPUs 0 and 1 like the C peers; pair: -s on one VM, serving the whole run, and -c on the other); latency is half the round trip, as perftest's; MB = 10^6 bytes; ${secs} s per test, after 100 unmeasured round trips for latency; default poll mode (adaptive: spin, then park) except the busy column (-poll busy, spinning like busy perftest); registered KiB per connection with the default options"
	"perftest: ib_send_lat / ib_send_bw -R (rdma_cm), server pinned to CPU 0 and client to CPU 1 (unpinned, two busy-polling processes on 2 vCPUs often wait for 4 ms scheduler ticks); p50 is t_typical; MB/s converted from perftest's MiB/s; msg/s from MsgRate; 8 conns is -q 8 (8 QPs)"
	"io.Copy: rdmaperf -test copy writes a file (in the VM's RAM-backed /tmp), then times io.Copy(conn, file) and, at the server, io.Copy(io.Discard, conn) until the server has counted every byte; this library goes through Conn.ReadFrom and Conn.WriteTo (the file is read straight into registered send buffers, received messages go to io.Discard straight from the receive buffers: one user-space copy per byte); plain hides them (io.Copy's 32 KiB buffer at the sender, io.Discard's 8 KiB buffer at the receiver: three copies per byte); Go TCP uses its own ReadFrom (sendfile)"
	"one-sided: rdmaperf -test write-lat is a ping-pong of RDMA WRITEs between registered regions, each side polling the last 8 bytes of its block (as ib_write_lat), reported as half the round trip; read-lat times each RDMA READ to its completion (as ib_read_lat, not halved); write-bw and read-bw keep 16 operations in flight on one connection, all on the same bytes (perftest keeps 128); atomic-lat times each fetch-and-add on one word to its completion (as ib_atomic_lat -A FETCH_AND_ADD), atomic-rate keeps 16 in flight (ib_atomic_bw keeps as many as the device allows outstanding); perftest's tools run with -R, pinned like the other peers, their MiB/s converted to MB/s"
	"its post pattern in C: bench/postrate.c sends 100,000 64 B messages as this library does toward a message-oriented reader (an inline RDMA WRITE with immediate per message into a 16 KiB ring, every 8th signaled, credits back in a SEND of their own every 16 messages), both sides busy-polling and pinned like perftest; 8 messages per ibv_post_send for the corked row (this library's corked chains are shorter), 1 for the SetNoDelay row: what the pattern costs the provider without Go; on soft-iWARP, whose latency row it has instead, postrate -L: 10,000 round trips of this library's 64 B message there (a 72 B inline SEND, its header and the payload, into 128-byte receive slots, every 32nd signaled), both sides busy-polling and pinned like perftest, half the round trip"
	"rsockets: rstream in its default non-blocking (busy-polling) mode, pinned like perftest; latency is -C 1 -I 2000, average only (usec/xfer, half the round trip); throughput and rate are -C N (N transfers one way, then N back), MB/s = size / usec-per-xfer"
	"connection setup: rdmaperf -test dial repeats, for ${secs} s, a sample of Dial, the first round trip (the test header out, the server's ready byte back) and Close; with 20 conns a sample is a burst of 20 goroutines doing that at once, timed until the last has closed; p50/p99 are of the samples (one dial, or one burst), conn/s is connections completed per second, setup is the p50 of the time until the sample's last Dial returned; one unmeasured burst first. HTTP/1.1: rdmaperf -test http, 20 goroutines sending GETs of 64 B bodies for ${secs} s on one http.Client with http.DefaultTransport's settings (2 idle connections per host kept, so requests often dial) dialing through the transport; p50/p99 are of a request, including any dial it waited for; http-kept (-keep) is the README's Transport, which keeps an idle connection per client (MaxIdleConnsPerHost 20), so requests reuse connections"
	"datagrams: rdmaperf -test dgram-lat is a ping-pong of datagrams between a PacketConn at each end (-net udp: Go's *net.UDPConn), half the round trip, lost round trips (1 s without an answer) counted and not timed; dgram-rate and dgram-bw send datagrams one way for ${secs} s, one WriteTo each or 32 per WriteBatch (-batch 32: PacketConn.WriteBatch; for Go UDP golang.org/x/net's, sendmmsg), and the server counts what arrived (ReadBatch of 64, recvmmsg for UDP): sent is the sender's rate, received what arrived over the longer of the sending time and the first-to-last arrival; perftest: ib_send_lat / ib_send_bw -c UD with -d and -x (the RoCE v2 GID of the address, no rdma_cm), pinned like the other peers, sent from its client's report and received from its server's; perftest's UD sends at most the MTU, so its figure beside the largest datagrams is ib_send_bw -c UD -s 4096"
	"cmtime (rdmacm-utils, C, the rdma_cm peer): server cmtime -b ADDR -c N, client cmtime -s ADDR -c N, pinned like perftest, one run per round (its figure is the median of the rounds, and it has no p99); its client takes all N connections through each rdma_cm step before the next (create id, resolve address, resolve route, create QP, connect; then disconnect, destroy) and prints each step's wall time; setup is the sum of the steps up to connect (all N established), p50 is that plus disconnect and destroy (all N torn down), conn/s is N over that. Unlike rdmaperf's figure it exchanges no data (no first round trip), its QPs have one send and one receive entry and no registered buffers, and with N > 1 every connection finishes a step before any starts the next"
)
{
	printf '{"date":"%s","kernel":"%s","environment":"%s","notes":[' "$date" "$(jstr "$(uname -r)")" \
		"$(jstr "$environment")"
	sep=''
	for n in "${notes[@]}"; do printf '%s"%s"' "$sep" "$(jstr "$n")"; sep=,; done
	printf '],"results":[\n'
	sep=''
	while IFS= read -r line; do printf '%s%s' "$sep" "$line"; sep=$',\n'; done <"$results"
	printf '\n]}\n'
} >"$work/results.json"

echo BEGIN-JSON
cat "$work/results.json"
echo END-JSON
if [[ -n $out_file ]]; then
	cp "$work/results.json" "$out_file" || echo "run.sh: could not write $out_file" >&2
fi
rm -rf "$work"
