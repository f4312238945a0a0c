#!/usr/bin/awk -f
# Renders bench/clients.sh's output (bench/results-clients.txt) as the many-client table of
# make bench: per connection count, the medians of the rounds over RDMA and over Go TCP.
function med(key,   n, a, i, j, t) {
	n = split(v[key], a, " ")
	if (n == 0) return ""
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function worst(key,   n, a, i, w) {
	n = split(v[key], a, " ")
	for (i = 1; i <= n; i++) if (i == 1 || a[i] + 0 > w + 0) w = a[i]
	return w
}
function add(key, x) { v[key] = v[key] " " x }
# after(s): the number that follows the word s on the line.
function after(s,   i) { for (i = 1; i < NF; i++) if ($i == s) { x = $(i + 1); gsub(/[^0-9.]/, "", x); return x } return "" }
function r(a, b) { return (a != "" && b != "" && b + 0 > 0) ? sprintf("%.2f", a / b) : "-" }
function f(x, d) { return x == "" ? "-" : sprintf("%." d "f", x) }
NR == 1 && /^# / { when = substr($0, 3) }
/^clients: [0-9]+ CPUs/ { cpus = $2 }
/^rdmaperf\/(rdma|tcp) clients/ {
	net = substr($1, 10); n = $6
	if (!(n in seen)) { seen[n] = 1; ns[++nn] = n }
	k = n SUBSEP net
	add(k SUBSEP "rate", $8)
	add(k SUBSEP "p99", after("p99") / 1000)
	for (i = 1; i < NF; i++) if ($(i + 1) == "CPU") { add(k SUBSEP "cpu", $i) }
	m = after("min"); md = after("median")
	add(k SUBSEP "fair", md > 0 ? m / md : 0)
	for (i = 1; i < NF; i++) if ($(i + 1) == "under") add(k SUBSEP "starved", $i)
	for (i = 1; i < NF; i++) {
		if ($i == "dialing") add(k SUBSEP "dial", $(i + 2))
		if ($i == "closing") add(k SUBSEP "close", $(i + 2))
	}
}
/^cmtime [0-9]+ conns: setup/ {
	n = $2; add(n SUBSEP "cm" SUBSEP "setup", $5); add(n SUBSEP "cm" SUBSEP "teardown", $8)
}
END {
	printf "Many clients, one 64 B request outstanding on each, both ends in one process, Soft-RoCE VM (%s vCPUs), %s, median of the rounds:\n\n", cpus, when
	print "| connections | RDMA req/s | TCP req/s | RDMA/TCP | RDMA CPU µs/req | TCP CPU µs/req | CPU RDMA/TCP | RDMA p99 ms | TCP p99 ms | fewest ÷ median requests, RDMA (worst round) | under half the median, RDMA (worst round) | RDMA dial s | TCP dial s | cmtime setup s | RDMA close s | TCP close s | cmtime teardown s |"
	print "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
	for (j = 1; j <= nn; j++) {
		n = ns[j]; a = n SUBSEP "rdma"; b = n SUBSEP "tcp"
		split(v[a SUBSEP "fair"], fa, " "); fw = ""
		for (i in fa) if (fw == "" || fa[i] + 0 < fw + 0) fw = fa[i]
		printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n,
			f(med(a SUBSEP "rate"), 0), f(med(b SUBSEP "rate"), 0), r(med(a SUBSEP "rate"), med(b SUBSEP "rate")),
			f(med(a SUBSEP "cpu"), 1), f(med(b SUBSEP "cpu"), 1), r(med(a SUBSEP "cpu"), med(b SUBSEP "cpu")),
			f(med(a SUBSEP "p99"), 1), f(med(b SUBSEP "p99"), 1), f(fw, 2), worst(a SUBSEP "starved"),
			f(med(a SUBSEP "dial"), 2), f(med(b SUBSEP "dial"), 2), f(med(n SUBSEP "cm" SUBSEP "setup"), 2),
			f(med(a SUBSEP "close"), 2), f(med(b SUBSEP "close"), 2), f(med(n SUBSEP "cm" SUBSEP "teardown"), 2)
	}
	print ""
	print "Made by `bench/clients.sh --table` (rdmaperf -test clients -local, RDMA and TCP interleaved); the run's lines are in results-clients.txt. Above 1 in RDMA/TCP is faster; in CPU RDMA/TCP, dearer."
}
