#!/usr/bin/env bash
# The application rows of make bench (interop/apps_test.go): gRPC, HTTP/2, a pipelined protocol,
# TLS and a TCP relay, each over RDMA and over Go TCP in the same Soft-RoCE VM run, as a table
# with the date. Writes bench/results-apps.md (and .txt, go test's own output).
#
#   bench/apps.sh [--render]
#
# --render renders the table again from bench/results-apps.txt, with no run.
#
# Environment: GO (go), BENCH_APPS_TIME (the -benchtime of each sub-benchmark, 2s),
# BENCH_APPS_COUNT (rounds, 3: the table shows the medians), BENCH_APPS (the -bench pattern, all
# of them). Each round is a process that runs every benchmark once, so that RDMA and TCP take
# turns and a slow spell of the host's falls on both; a ratio is the median of the rounds' ratios.
# After each round bench/ceiling.sh measures the provider's ceiling for the rows' shapes of
# traffic with perftest (BENCH_APPS_CEILING=0: not).
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
bin=.testbed-out
out=bench/results-apps
count=${BENCH_APPS_COUNT:-3}
time=${BENCH_APPS_TIME:-2s}
if [[ ${1:-} != --render ]]; then
	mkdir -p "$bin"
	trap 'rm -f $out.txt.tmp' EXIT
	(cd interop && "$go" test -c -o "../$bin/interop.test" .)
	# The first line says when and how; go test's output follows.
	echo "# $(date -u +%Y-%m-%dT%H:%MZ), median of $count rounds of $time each" >"$out.txt.tmp"
	testbed/vm.sh --timeout 1200 -- sh -c 'for i in $(seq "$1"); do "$2" -test.run "^\$" -test.bench "$3" -test.benchtime "$4" -test.timeout 5m || exit; [ "$5" = 0 ] || bench/ceiling.sh; done' \
		sh "$count" "$bin/interop.test" "${BENCH_APPS:-.}" "$time" "${BENCH_APPS_CEILING:-1}" | tee -a "$out.txt.tmp"
	if ! grep -q '^PASS' "$out.txt.tmp"; then
		mv "$out.txt.tmp" "$out.txt.failed"
		echo "apps: the benchmarks did not pass; see $out.txt.failed" >&2
		exit 1
	fi
	mv "$out.txt.tmp" "$out.txt"
fi
{
	echo "Applications over RDMA (Soft-RoCE) and over Go TCP, one 2-vCPU TCG VM, $(head -1 "$out.txt" | sed 's/^# //'):"
	echo
	echo "| application | figure | RDMA | TCP | RDMA/TCP | ceiling (perftest) | RDMA/ceiling | TCP/ceiling | RDMA µs/op | TCP µs/op | RDMA allocs/op | TCP allocs/op |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
	awk '
	# The value before a unit, in a benchmark line.
	function val(unit,   i) { for (i = 3; i < NF; i++) if ($(i + 1) == unit) return $i; return "" }
	function num(v) { return v >= 100 ? sprintf("%.0f", v) : sprintf("%.3g", v) }
	function median(key,   n, a, i, j, t) {
		n = split(vals[key], a, " ")
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		return a[int((n + 1) / 2)]
	}
	/^ceiling [a-z0-9]+ / { vals["ceil" SUBSEP $2] = vals["ceil" SUBSEP $2] " " $3 }
	/^Benchmark[A-Za-z0-9]+\/(rdma|tcp)/ {
		split($1, p, "/"); row = p[1]; sub(/^Benchmark/, "", row); side = p[2]; sub(/-[0-9]+$/, "", side)
		if (!(row in seen)) { seen[row] = 1; rows[++nrows] = row }
		# The figure: MB/s where the benchmark sets bytes, else its rate.
		if (!(row in fig)) fig[row] = val("MB/s") != "" ? "MB/s" : val("req/s") != "" ? "req/s" : val("msg/s") != "" ? "msg/s" : "op/s"
		f = fig[row] == "op/s" ? 1e9 / val("ns/op") : val(fig[row])
		vals[row SUBSEP side SUBSEP "fig"] = vals[row SUBSEP side SUBSEP "fig"] " " f
		# Rounds take turns: the kth figure of a side is from round k.
		k = ++nth[row SUBSEP side]; fig_k[row SUBSEP side SUBSEP k] = f
		if (side == "tcp" && fig_k[row SUBSEP "rdma" SUBSEP k] != "" && f > 0)
			vals[row SUBSEP "ratio"] = vals[row SUBSEP "ratio"] " " fig_k[row SUBSEP "rdma" SUBSEP k] / f
		vals[row SUBSEP side SUBSEP "ns"] = vals[row SUBSEP side SUBSEP "ns"] " " val("ns/op")
		vals[row SUBSEP side SUBSEP "allocs"] = vals[row SUBSEP side SUBSEP "allocs"] " " val("allocs/op")
	}
	# ceiling(row): perftest'"'"'s figure for the row'"'"'s shape, in the row'"'"'s unit ("" if not measured).
	function ceiling(row,   v) {
		if (row == "GRPCUnary") { v = median("ceil" SUBSEP "lat1k"); return v > 0 ? 1e6 / (2 * v) : "" }
		if (row == "GRPCStream") return median("ceil" SUBSEP "bw1k")
		if (row == "HTTP2" || row == "Pipelined") { v = median("ceil" SUBSEP "rate64"); return v > 0 ? v / 2 : "" }
		if (row == "TLS" || row == "Relay") return median("ceil" SUBSEP "bw1m")
		return ""
	}
	function over(a, b) { return (a != "" && b != "" && b + 0 > 0) ? sprintf("%.2f", a / b) : "-" }
	END {
		for (r = 1; r <= nrows; r++) {
			row = rows[r]
			rf = median(row SUBSEP "rdma" SUBSEP "fig"); tf = median(row SUBSEP "tcp" SUBSEP "fig"); cf = ceiling(row)
			printf "| %s | %s | %s | %s | %.2f | %s | %s | %s | %s | %s | %s | %s |\n", row, fig[row], num(rf), num(tf), median(row SUBSEP "ratio"),
				(cf == "" ? "-" : num(cf)), over(rf, cf), over(tf, cf),
				num(median(row SUBSEP "rdma" SUBSEP "ns") / 1e3), num(median(row SUBSEP "tcp" SUBSEP "ns") / 1e3),
				median(row SUBSEP "rdma" SUBSEP "allocs"), median(row SUBSEP "tcp" SUBSEP "allocs")
		}
	}' "$out.txt"
	echo
	echo "RDMA/TCP is the median of the rounds' ratios of the figure: above 1 is faster. What each row does: interop/apps_test.go."
	echo "The ceiling is perftest's for the row's shape of traffic, measured after each round (bench/ceiling.sh, the medians): gRPC unary, one 1 KiB round trip per call (10^6 / (2 × ib_send_lat -s 1024's typical µs)); gRPC stream, ib_send_bw -b -s 1024 (both directions, as the row counts them); HTTP/2 and pipelined, one 64 B message each way per request (half of ib_send_bw -b -s 64's messages/s); TLS and the relay, ib_send_bw -b -s 1048576. perftest runs pinned, one process per end, with nothing else to do (no TLS, no HTTP, no TCP side)."
} >"$out.md"
echo
cat "$out.md"
