package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const smallRun = `{"date": "2026-01-02T03:04:05Z", "kernel": "k", "environment": "a test bed",
"results": [
 {"impl": "rdmaperf/rdma", "workload": "lat", "size": 64, "metrics": {"p50_us": 10}, "round": 1},
 {"impl": "rdmaperf/rdma", "workload": "lat", "size": 64, "metrics": {"p50_us": 30}, "round": 2},
 {"impl": "rdmaperf/rdma", "workload": "lat", "size": 64, "metrics": {"p50_us": 20}, "round": 3},
 {"impl": "rdmaperf/rdma", "workload": "lat", "size": 64, "error": "timed out", "round": 4},
 {"impl": "rdmaperf/rdma", "workload": "lat", "size": 4096, "metrics": {"p50_us": 40}, "round": 1},
 {"impl": "rdmaperf/rdma", "workload": "lat", "size": 4096, "metrics": {"p50_us": 60}, "round": 2},
 {"impl": "rdmaperf/rdma", "workload": "lat", "size": 64, "conns": 8, "metrics": {"p50_us": 999}, "round": 1},
 {"impl": "perftest", "workload": "dgram-bw", "size": 65507, "metrics": {"recv_mb_s": 60, "size_b": 4096}, "round": 1}
]}`

func TestParseRun(t *testing.T) {
	br, err := parseRun(strings.NewReader(smallRun))
	require.NoError(t, err)
	require.Equal(t, "2026-01-02T03:04:05Z", br.Date)
	require.Equal(t, "a test bed", br.Environment)
	require.Equal(t, 4, br.rounds())
	// The median of the rounds, odd and even counts; the failed round
	// and the 8-connection row are not in it; sorted by size.
	require.Equal(t, []point{{64, 20}, {4096, 50}}, br.series("lat", self, "p50_us"))
	// What perftest really sent, not the row's size.
	require.Equal(t, []point{{4096, 60}}, br.series("dgram-bw", perftest, "recv_mb_s"))
	require.Empty(t, br.series("lat", perftest, "p50_us"))
	require.Empty(t, br.series("lat", self, "p99_us"))
}

func TestParseRunMalformed(t *testing.T) {
	for _, tc := range []struct{ name, doc, want string }{
		{"empty", ``, "not a results document"},
		{"not JSON", `date: today`, "not a results document"},
		{"cut short", `{"date": "d", "results": [`, "not a results document"},
		{"wrong type", `{"date": 7}`, "not a results document"},
		{"trailing data", `{"date": "d", "environment": "e", "results": [{"impl": "a", "workload": "w"}]} {}`, "data after"},
		{"no date", `{"environment": "e", "results": [{"impl": "a", "workload": "w"}]}`, "no date"},
		{"no environment", `{"date": "d", "results": [{"impl": "a", "workload": "w"}]}`, "no environment"},
		{"no results", `{"date": "d", "environment": "e", "results": []}`, "no results"},
		{"no impl", `{"date": "d", "environment": "e", "results": [{"workload": "w"}]}`, "result 0: no impl"},
		{"no workload", `{"date": "d", "environment": "e", "results": [{"impl": "a", "workload": "w"}, {"impl": "a"}]}`, "result 1: no impl or no workload"},
		{"negative size", `{"date": "d", "environment": "e", "results": [{"impl": "a", "workload": "w", "size": -1}]}`, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseRun(strings.NewReader(tc.doc))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

const smallClients = `# 2026-11-28T08:20Z
clients: 2 CPUs, load 0.00 0.00 0.00, ulimit -n 1048576, 2026-11-28T08:20:40Z
round 1: rdmaperf -local -addr 10.77.0.1:0 -net rdma -test clients -P 100 -t 8 -stats
rdmaperf/rdma clients 64 B x 100 conns: 30000 req/s, p50 3300 µs, p99 5000 µs, max 24461 µs a request, 65.1 CPU µs a request
client stats: {BytesWritten:15706928}
  mean requests by tenth of dial order: 2442.8 2449.6
round 1: rdmaperf -local -addr 10.77.0.1:0 -net tcp -test clients -P 100 -t 8
rdmaperf/tcp clients 64 B x 100 conns: 32000 req/s, p50 2899 µs, p99 8000 µs, max 18606 µs a request
round 1: rdmaperf -local -addr 10.77.0.1:0 -net rdma -test clients -P 1000 -t 8 -stats
rdmaperf/rdma clients 64 B x 1000 conns: 20000 req/s, p50 46062 µs, p99 90000 µs
rdmaperf: some other line the run printed
rdmaperf/tcp clients 64 B x 1000 conns: error: dial tcp: too many open files
rdmaperf/tcp clients 64 B: 900 req/s, p50 1000 µs, p99 3000 µs
round 2: rdmaperf -local -addr 10.77.0.1:0 -net rdma -test clients -P 100 -t 8 -stats
rdmaperf/rdma clients 64 B x 100 conns: 31000 req/s, p50 3300 µs, p99 7000 µs
round 2: rdmaperf -local -addr 10.77.0.1:0 -net rdma -test clients -P 1000 -t 8 -stats
rdmaperf/rdma clients 64 B x 1000 conns: 22000.5 req/s, p50 46062 µs, p99 110000 µs
cmtime 100 conns: setup 0.110 s, teardown 0.050 s
clients: done, load 1.00 1.00 1.00, 2026-11-28T08:40:40Z
`

func TestParseClients(t *testing.T) {
	cr, err := parseClients(strings.NewReader(smallClients))
	require.NoError(t, err)
	require.Equal(t, "2026-11-28T08:20Z", cr.date)
	require.Equal(t, 2, cr.cpus)
	require.Equal(t, 64, cr.size)
	require.Equal(t, 2, cr.rounds)
	require.Equal(t, 1, cr.failed)
	rate, p99 := cr.series("rdma")
	require.Equal(t, []point{{100, 30500}, {1000, 21000.25}}, rate)
	require.Equal(t, []point{{100, 6}, {1000, 100}}, p99)
	// One connection's line has no "x N conns"; the failed run is not
	// a figure.
	rate, p99 = cr.series("tcp")
	require.Equal(t, []point{{1, 900}, {100, 32000}}, rate)
	require.Equal(t, []point{{1, 3}, {100, 8}}, p99)
}

func TestParseClientsMalformed(t *testing.T) {
	const head = "# 2026-11-28T08:20Z\n"
	for _, tc := range []struct{ name, text, want string }{
		{"empty", "", "empty"},
		{"no date line", "clients: 2 CPUs\n", "line 1: want"},
		{"blank date", "# \n", "line 1: want"},
		{"no summary lines", head + "clients: 2 CPUs\nclients: done\n", "no rdmaperf clients lines"},
		{"no p99", head + "rdmaperf/rdma clients 64 B x 100 conns: 30000 req/s, p50 3300 µs\n", "line 2: a clients summary without"},
		{"not a number", head + "rdmaperf/tcp clients 64 B x 100 conns: 1.2.3 req/s, p50 1 µs, p99 2 µs\n", `line 2: "1.2.3"`},
		{"no connections", head + "rdmaperf/rdma clients 64 B x 0 conns: 1 req/s, p50 1 µs, p99 2 µs\n", "must be positive"},
		{"no requests", head + "rdmaperf/rdma clients 64 B x 10 conns: 0 req/s, p50 1 µs, p99 2 µs\n", "must be positive"},
		{"sizes mixed", head + "rdmaperf/rdma clients 64 B x 10 conns: 1 req/s, p50 1 µs, p99 2 µs\n" +
			"rdmaperf/tcp clients 128 B x 10 conns: 1 req/s, p50 1 µs, p99 2 µs\n", "line 3: requests of 128 B in a run of 64 B"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseClients(strings.NewReader(tc.text))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// A peer that a run did not measure is left out of its chart with a
// note; this library's own series cannot be.
func TestBuildWithoutAPeer(t *testing.T) {
	f, notes, err := buildLatency("results.json", []byte(smallRun))
	require.NoError(t, err)
	require.Len(t, f.panels, 1)
	require.Contains(t, notes, "results.json: no rdmaperf/rdma p99 latency: its series is left out")
	require.Contains(t, notes, "results.json: no perftest p50 latency: its series is left out")
	require.Contains(t, notes, "results.json: no rdmaperf/tcp p99 latency: its series is left out")

	_, _, err = buildThroughput("results.json", []byte(smallRun))
	require.ErrorContains(t, err, "no mb_s of rdmaperf/rdma in the throughput rows")

	_, _, err = buildClients("results-clients.txt", []byte("# d\nrdmaperf/tcp clients 64 B x 10 conns: 1 req/s, p50 1 µs, p99 2 µs\n"))
	require.ErrorContains(t, err, "no rdmaperf/rdma clients lines")

	_, notes, err = buildClients("results-clients.txt", []byte(smallClients))
	require.NoError(t, err)
	require.Equal(t, []string{`results-clients.txt: 1 failed runs ("error:") left out`}, notes)
}

func TestBuildRejectsWhatALogScaleCannotShow(t *testing.T) {
	doc := `{"date": "d", "environment": "e", "results": [{"impl": "rdmaperf/rdma", "workload": "lat", "size": 64, "metrics": {"p50_us": 0}}]}`
	_, _, err := buildLatency("results.json", []byte(doc))
	require.ErrorContains(t, err, "does not fit a log scale")
}

func TestNumberAndSizeNames(t *testing.T) {
	for v, want := range map[float64]string{0.5: "0.5", 0.3: "0.3", 5: "5", 1000: "1,000", 10000: "10,000", 1234567: "1,234,567"} {
		require.Equal(t, want, number(v), "%v", v)
	}
	for v, want := range map[float64]string{64: "64 B", 4092: "4092 B", 4096: "4 KiB", 65536: "64 KiB", 65507: "65507 B", 1 << 20: "1 MiB"} {
		require.Equal(t, want, sizeName(v), "%v", v)
	}
}

func TestWrap(t *testing.T) {
	sty := textStyle(8, 0, 0)
	para := strings.Repeat("a caption that goes on and on ", 20)
	width := sty.Width("a caption that goes on")
	lines := wrap(sty, []string{para, "second"}, width)
	require.Greater(t, len(lines), 2)
	for _, l := range lines {
		require.LessOrEqual(t, sty.Width(l), width, l)
	}
	require.Equal(t, strings.Fields(para+" second"), strings.Fields(strings.Join(lines, " ")))
	require.Equal(t, "second", lines[len(lines)-1])
}
