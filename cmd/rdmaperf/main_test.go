package main

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"
)

// startTCP runs a server on loopback TCP: the client and server logic is
// the same for both transports, and TCP needs no RDMA device.
func startTCP(t *testing.T) dialFunc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serve(ln, false)
	return func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }
}

func TestLatency(t *testing.T) {
	r := &run{dial: startTCP(t), size: 4096, count: 50, warmup: 5, conns: 1}
	m, err := r.latency()
	if err != nil {
		t.Fatal(err)
	}
	if m["count"] != 50 || m["p50_us"] <= 0 || m["p99_us"] < m["p50_us"] || m["min_us"] > m["p50_us"] {
		t.Errorf("implausible latency figures %v", m)
	}
}

func TestStream(t *testing.T) {
	r := &run{dial: startTCP(t), size: 1000, count: 200, conns: 3}
	m, err := r.stream()
	if err != nil {
		t.Fatal(err)
	}
	// The sink's count is checked against what was sent: a completed
	// stream means every byte arrived.
	if m["count"] != 600 || m["mb_s"] <= 0 || m["msg_s"] <= 0 {
		t.Errorf("implausible stream figures %v", m)
	}
}

func TestStreamForDuration(t *testing.T) {
	r := &run{dial: startTCP(t), size: 64, duration: 50 * time.Millisecond, conns: 1}
	m, err := r.stream()
	if err != nil {
		t.Fatal(err)
	}
	if m["count"] < 1 || m["seconds"] < 0.05 {
		t.Errorf("implausible stream figures %v", m)
	}
}

func TestIdle(t *testing.T) {
	r := &run{dial: startTCP(t), size: 64, conns: 1}
	m, err := r.idle(20 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if m["seconds"] < 0.02 || m["cpu_s"] < 0 {
		t.Errorf("implausible idle figures %v", m)
	}
}

func TestHeaderRejectsStrangers(t *testing.T) {
	if _, err := readHeader(strings.NewReader("GET / HTTP/1.1\r\n")); err == nil {
		t.Error("an HTTP request was taken for a header")
	}
	h := header{kind: kindSink, size: 65536}
	got, err := readHeader(bytes.NewReader(h.marshal()))
	if err != nil || got != h {
		t.Errorf("round trip: got %+v, %v; want %+v", got, err, h)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i))
	}
	if p := percentile(s, 50); p != 50 {
		t.Errorf("p50 of 1..100 = %d", p)
	}
	if p := percentile(s, 99); p != 99 {
		t.Errorf("p99 of 1..100 = %d", p)
	}
	if p := percentile(s[:1], 99); p != 1 {
		t.Errorf("p99 of one sample = %d", p)
	}
}

func TestRender(t *testing.T) {
	br := &benchRun{
		Date: "2026-01-01T00:00:00Z", Kernel: "6.1", Environment: "test bed",
		Results: []Result{
			{Round: 1, Impl: "rdmaperf/rdma", Workload: "lat", Size: 64, Conns: 1, Metrics: map[string]float64{"p50_us": 10, "p99_us": 30, "avg_us": 12}},
			{Round: 2, Impl: "rdmaperf/rdma", Workload: "lat", Size: 64, Conns: 1, Metrics: map[string]float64{"p50_us": 20, "p99_us": 40, "avg_us": 22}},
			{Round: 3, Impl: "rdmaperf/rdma", Workload: "lat", Size: 64, Conns: 1, Metrics: map[string]float64{"p50_us": 90, "p99_us": 90, "avg_us": 90}},
			{Round: 1, Impl: "rdmaperf/rdma busy", Workload: "lat", Size: 64, Conns: 1, Metrics: map[string]float64{"p50_us": 6, "p99_us": 16, "avg_us": 9}},
			{Round: 1, Impl: "perftest", Workload: "lat", Size: 64, Conns: 1, Metrics: map[string]float64{"p50_us": 5, "p99_us": 8, "avg_us": 6}},
			{Round: 2, Impl: "perftest", Workload: "lat", Size: 64, Conns: 1, Metrics: map[string]float64{"p50_us": 5, "p99_us": 8, "avg_us": 6}},
			{Round: 3, Impl: "perftest", Workload: "lat", Size: 64, Conns: 1, Metrics: map[string]float64{"p50_us": 90, "p99_us": 90, "avg_us": 90}},
			{Round: 1, Impl: "rsockets", Workload: "bw", Size: 4096, Conns: 1, Error: "rstream exit 1"},
			{Round: 1, Impl: "rdmaperf/rdma", Workload: "copy", Size: 256 << 20, Conns: 1, Metrics: map[string]float64{"mb_s": 40, "cpu_s": 2}},
			{Round: 1, Impl: "rdmaperf/rdma plain", Workload: "copy", Size: 256 << 20, Conns: 1, Metrics: map[string]float64{"mb_s": 20, "cpu_s": 4}},
			{Round: 1, Impl: "rdmaperf/tcp", Workload: "copy", Size: 256 << 20, Conns: 1, Metrics: map[string]float64{"mb_s": 100, "cpu_s": 1}},
		},
	}
	var b strings.Builder
	renderMarkdown(&b, br)
	out := b.String()
	for _, want := range []string{
		// Figures are medians (of 10, 20, 90 and of 5, 5, 90); ratios are the
		// medians of the per-round ratios (2, 4, 1), not 20 / 5.
		"| latency (one-way) 64 B | p50 µs | 20.0 | 6.00 | — | 5.00 | — | — | — | 2.00 |  |  | 1.20 |  |",
		"| latency (one-way) 64 B | avg µs | 22.0 | 9.00 | — | 6.00 | — | — | — | 2.00 |  |  | 1.50 |  |",
		// io.Copy with the connection's ReadFrom/WriteTo beside plain io.Copy.
		"| io.Copy file → conn → io.Discard 256 MiB | MB/s | 40.0 | — | 100 | — | — | — | 20.0 |  |  |  |  | 2.00 |",
		"rsockets, throughput 4 KiB (round 1): rstream exit 1",
		"median of up to 3 rounds",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "| throughput 4 KiB |") {
		t.Errorf("a row with only failed measurements was rendered:\n%s", out)
	}
}

func TestWithDefaultPort(t *testing.T) {
	for in, want := range map[string]string{
		"10.77.0.1":      "10.77.0.1:5301",
		"10.77.0.1:7000": "10.77.0.1:7000",
		"host":           "host:5301",
		"fd77::1":        "[fd77::1]:5301",
		"[fd77::1]":      "[fd77::1]:5301",
		"[fd77::1]:9":    "[fd77::1]:9",
		"":               "",
	} {
		if got := withDefaultPort(in); got != want {
			t.Errorf("withDefaultPort(%q) = %q, want %q", in, got, want)
		}
	}
}
