#!/usr/bin/env bash
# The zero-cost rows of make bench (BenchmarkZeroCost, zerocost_bench_test.go): the library
# against C per message over internal/zerocost, on this host (no device, no VM), as a table
# with the date. Writes bench/results-zerocost.md (and .txt, go test's own output).
#
#   bench/zerocost.sh
#
# Environment: GO (go), BENCH_ZC_TIME (the -benchtime of each sub-benchmark, 1s), BENCH_ZC_COUNT
# (runs of each, 3: the table shows the median).
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
out=bench/results-zerocost
trap 'rm -f $out.txt.tmp' EXIT
"$go" test -count="${BENCH_ZC_COUNT:-3}" -run '^$' -bench '^BenchmarkZeroCost(CgoCall)?$' -benchtime "${BENCH_ZC_TIME:-1s}" . | tee "$out.txt.tmp"
mv "$out.txt.tmp" "$out.txt"
{
	echo "Zero-cost provider, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, GOMAXPROCS unset, median of ${BENCH_ZC_COUNT:-3} runs of ${BENCH_ZC_TIME:-1s}:"
	echo
	echo "| row | Go ns/msg | C ns/msg | Go/C | cgo floor ns/msg | Go/floor | Go CPU ns/msg | C CPU ns/msg | Go cgo calls/msg | Go verbs/msg | C verbs/msg | Go polls/msg | Go wakeups/msg | Go allocs/msg |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	awk '
	# The value before a unit, in a benchmark line.
	function val(unit,   i) { for (i = 3; i < NF; i++) if ($(i + 1) == unit) return $i; return "" }
	function median(key,   n, a, i, j, t) {
		n = split(vals[key], a, " ")
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		return a[int((n + 1) / 2)]
	}
	/^BenchmarkZeroCostCgoCall/ { vals["cgo"] = vals["cgo"] " " val("ns/op") }
	/^BenchmarkZeroCost\/RoundTrip64Goroutines\/Chan/ { vals["chan"] = vals["chan"] " " val("ns/op") }
	/^BenchmarkZeroCost\// {
		split($1, p, "/"); row = p[2]; side = p[3]; sub(/-[0-9]+$/, "", side)
		if (!(row in seen)) { seen[row] = 1; rows[++nrows] = row }
		for (k = 1; k <= 7; k++) {
			u = (k == 1 ? "ns/op" : k == 2 ? "cpu-ns/msg" : k == 3 ? "cgo/msg" : k == 4 ? "verbs/msg" : k == 5 ? "polls/msg" : k == 6 ? "wakeups/msg" : "allocs/op")
			v = val(u); if (v != "") vals[row SUBSEP side SUBSEP u] = vals[row SUBSEP side SUBSEP u] " " v
		}
	}
	END {
		cgo = median("cgo")
		for (r = 1; r <= nrows; r++) {
			row = rows[r]
			g = median(row SUBSEP "Go" SUBSEP "ns/op"); c = median(row SUBSEP "C" SUBSEP "ns/op")
			# The least a Go program making the same cgo calls could take: the C time and the calls.
			floor = c + median(row SUBSEP "Go" SUBSEP "cgo/msg") * cgo
			printf "| %s | %.0f | %.0f | %.1f | %.0f | %.1f | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", row, g, c, (c > 0 ? g / c : 0),
				floor, (floor > 0 ? g / floor : 0),
				median(row SUBSEP "Go" SUBSEP "cpu-ns/msg"), median(row SUBSEP "C" SUBSEP "cpu-ns/msg"),
				median(row SUBSEP "Go" SUBSEP "cgo/msg"), median(row SUBSEP "Go" SUBSEP "verbs/msg"),
				median(row SUBSEP "C" SUBSEP "verbs/msg"), median(row SUBSEP "Go" SUBSEP "polls/msg"),
				median(row SUBSEP "Go" SUBSEP "wakeups/msg"), median(row SUBSEP "Go" SUBSEP "allocs/op")
		}
		printf "\nWakeups are goroutines made runnable and then run (woken, or put back by Gosched), estimated from the runtime'"'"'s sample of one in eight (/sched/latencies).\n"
		if (vals["chan"] != "") {
			chan = median("chan"); rt = median("RoundTrip64" SUBSEP "Go" SUBSEP "cgo/msg") * cgo + median("RoundTrip64" SUBSEP "C" SUBSEP "ns/op")
			printf "\nA ping-pong of two goroutines over channels, the Go runtime'"'"'s own cost of the two handoffs: %.0f ns (RoundTrip64Goroutines/Chan). RoundTrip64Goroutines is %.1fx RoundTrip64'"'"'s cgo floor plus that.\n", chan, median("RoundTrip64Goroutines" SUBSEP "Go" SUBSEP "ns/op") / (rt + chan)
		}
		printf "\nOne cgo call to a C function that does nothing: %.1f ns (BenchmarkZeroCostCgoCall). The cgo floor is a row'"'"'s C time plus the Go side'"'"'s cgo calls at that cost.\n", cgo
	}' "$out.txt"
} >"$out.md"
echo
cat "$out.md"
