package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestMain makes the test binary the command itself when asked to, so the
// command-line tests run rdmaperf as users do: as processes with flags.
func TestMain(m *testing.M) {
	if os.Getenv("RDMAPERF_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

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

// TestLatencyTail: -tail reports the round trips it timed (the warm-up's
// too), the slowest 1 % of them beside all, and the scheduler's latencies.
func TestLatencyTail(t *testing.T) {
	var report string
	r := &run{dial: startTCP(t), size: 64, count: 200, warmup: 5, conns: 1, tail: func(s string) { report = s }}
	if _, err := r.latency(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"tail: 205 round trips, p99 ", "scheduler latency over the run: ", "\n  all              n=205  median Write ", "\n  at or above p99  n=", "parked 0.0%"} {
		if !strings.Contains(report, want) {
			t.Errorf("the tail report lacks %q:\n%s", want, report)
		}
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
	for _, h := range []header{
		{kind: kindSink, size: 65536},
		{kind: kindSource, size: 64, count: 1 << 40},
		{kind: kindSource, size: 1000},
		{kind: kindHTTP, size: 64},
		{kind: kindRegion, size: 4096},
		{kind: kindRegionPong, size: 64},
		{kind: kindDgramEcho, size: 64},
		{kind: kindDgramSink, size: 65507},
	} {
		b := h.marshal()
		want := headerLen
		if h.kind == kindSource {
			want += countExt // the write count follows
		}
		if len(b) != want {
			t.Errorf("%+v marshals to %d bytes, want %d", h, len(b), want)
		}
		got, err := readHeader(bytes.NewReader(b))
		if err != nil || got != h {
			t.Errorf("round trip: got %+v, %v; want %+v", got, err, h)
		}
	}
	// The kind after the newest is refused, as an older server refuses
	// kindHTTP, the one-sided and the datagram kinds; they carry nothing
	// after the header.
	if _, err := readHeader(bytes.NewReader(header{kind: kindDgramSink + 1, size: 64}.marshal())); err == nil ||
		!strings.Contains(err.Error(), "unknown test kind") {
		t.Errorf("kind %d: %v, want unknown test kind", kindDgramSink+1, err)
	}
	for k, name := range map[kind]string{kindHTTP: "http", kindRegion: "region", kindRegionPong: "region ping-pong",
		kindDgramEcho: "datagram echo", kindDgramSink: "datagram sink"} {
		if k.String() != name {
			t.Errorf("kind %d is %q, want %q", byte(k), k, name)
		}
	}
	// A source header cut short is an error, not a count of zero.
	b := header{kind: kindSource, size: 64, count: 5}.marshal()
	if _, err := readHeader(bytes.NewReader(b[:headerLen+3])); err == nil {
		t.Error("a source header without its whole count was accepted")
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
		"| latency (one-way) 64 B | p50 µs | 20.0 | 6.00 | — | — | 5.00 | — | — | — | — | — | 2.00 |  |  |  |  | 1.20 |  |  |  |",
		"| latency (one-way) 64 B | avg µs | 22.0 | 9.00 | — | — | 6.00 | — | — | — | — | — | 2.00 |  |  |  |  | 1.50 |  |  |  |",
		// io.Copy with the connection's ReadFrom/WriteTo beside plain io.Copy.
		"| io.Copy file → conn → io.Discard 256 MiB | MB/s | 40.0 | — | — | 100 | — | — | — | — | — | 20.0 |  |  |  |  |  |  |  |  | 2.00 |",
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
	if strings.Contains(out, "object store") {
		t.Errorf("the object store's columns are in a run that did not measure it:\n%s", out)
	}
}

// TestRenderObjectStore: the object store's rows get their columns and
// their ratios to perftest's figure and to HTTP bodies over TCP.
func TestRenderObjectStore(t *testing.T) {
	br := &benchRun{
		Date: "2026-01-01T00:00:00Z", Kernel: "6.1", Environment: "test bed",
		Results: []Result{
			{Round: 1, Impl: "perftest", Workload: "objstore-put", Size: 1 << 20, Conns: 1, Metrics: map[string]float64{"mb_s": 50}},
			{Round: 1, Impl: objToken, Workload: "objstore-put", Size: 1 << 20, Conns: 1, Metrics: map[string]float64{"mb_s": 40}},
			{Round: 1, Impl: objBody, Workload: "objstore-put", Size: 1 << 20, Conns: 1, Metrics: map[string]float64{"mb_s": 30}},
			{Round: 1, Impl: objTCP, Workload: "objstore-put", Size: 1 << 20, Conns: 1, Metrics: map[string]float64{"mb_s": 80}},
		},
	}
	var b strings.Builder
	renderMarkdown(&b, br)
	out := b.String()
	for _, want := range []string{
		"| object store by token | object store, HTTP bodies | object store, HTTP bodies over Go TCP |",
		"| token ÷ perftest | token ÷ bodies over TCP |",
		"| object store PUT (examples/objectstore; perftest: ib_read_bw) 1 MiB | MB/s | — | — | — | — | 50.0 | — | — | — | — | — | 40.0 | 30.0 | 80.0 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered table lacks %q:\n%s", want, out)
		}
	}
	row := strings.SplitN(strings.SplitN(out, "ib_read_bw) 1 MiB", 2)[1], "\n", 2)[0]
	if !strings.HasSuffix(row, "| 0.80 | 0.50 |") {
		t.Errorf("the ratios are not 40 / 50 and 40 / 80: %s", row)
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

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want func(*config) bool
	}{
		{[]string{"-c", "10.77.0.1", "-t", "1"}, func(c *config) bool {
			return c.target == "10.77.0.1:5301" && c.duration == time.Second && c.workload == "lat" && c.interval == time.Second && !c.reverse
		}},
		{[]string{"-c", "h:7", "-test", "bw", "-t", "2.5", "-P", "4", "-l", "1000", "-J", "-R", "-i", "0.5"}, func(c *config) bool {
			return c.target == "h:7" && c.duration == 2500*time.Millisecond && c.conns == 4 && c.size == 1000 &&
				c.asJSON && c.reverse && c.interval == 500*time.Millisecond
		}},
		// The long names, and Go durations where iperf3 has seconds.
		{[]string{"-c", "h", "-test", "rate", "-duration", "300ms", "-conns", "2", "-size", "32", "-json", "-i", "250ms"}, func(c *config) bool {
			return c.duration == 300*time.Millisecond && c.conns == 2 && c.size == 32 && c.asJSON && c.interval == 250*time.Millisecond && c.workload == "rate"
		}},
		{[]string{"-c", "h", "-test", "bw", "-i", "0"}, func(c *config) bool { return c.interval == 0 && c.size == 64<<10 }},
		{[]string{"-c", "h", "-test", "rate", "-R"}, func(c *config) bool { return c.reverse && c.size == 64 }},
		{[]string{"-local", "-addr", "10.77.0.1:0", "-test", "bw", "-R", "-n", "10"}, func(c *config) bool { return c.local && c.reverse && c.count == 10 }},
		{[]string{"-c", "h", "-test", "dial", "-P", "20"}, func(c *config) bool {
			return c.workload == "dial" && c.conns == 20 && c.size == 64 && c.duration == 5*time.Second
		}},
		{[]string{"-local", "-test", "http", "-conns", "20", "-n", "5", "-size", "1000"}, func(c *config) bool {
			return c.local && c.workload == "http" && c.conns == 20 && c.count == 5 && c.size == 1000
		}},
		{[]string{"-s"}, func(c *config) bool { return c.server && c.addr == "" }},
		{[]string{"-render", "x.json"}, func(c *config) bool { return c.render == "x.json" }},
	} {
		var out strings.Builder
		c, err := parseArgs(tc.args, &out)
		if err != nil || !tc.want(c) {
			t.Errorf("%q: got %+v, %v (%s)", tc.args, c, err, out.String())
		}
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-c", "h", "-R"}, "-R reverses -test bw or rate, not lat"},
		{[]string{"-c", "h", "-test", "copy", "-R"}, "not copy"},
		{[]string{"-c", "h", "-R", "-idle", "1s"}, "not idle"},
		{[]string{"-c", "h", "-test", "dial", "-R"}, "not dial"},
		{[]string{"-c", "h", "-test", "http", "-P", "0"}, "-conns must be at least 1"},
		{[]string{"-c", "h", "-test", "bw", "-i", "-1"}, "-i must not be negative"},
		{[]string{"-c", "h", "-t", "ten"}, "want seconds"},
		{[]string{"-c", "h", "-t", "0"}, "positive -duration"},
		{[]string{"-s", "-c", "h"}, "need one of"},
		{[]string{}, "need one of"},
		{[]string{"-c", "h", "extra"}, `unexpected argument "extra"`},
		{[]string{"-c", "h", "-P", "0"}, "-conns must be at least 1"},
	} {
		var out strings.Builder
		if c, err := parseArgs(tc.args, &out); err == nil {
			t.Errorf("%q accepted: %+v", tc.args, c)
		} else if !strings.Contains(out.String(), tc.says) {
			t.Errorf("%q: the complaint %q does not say %q", tc.args, out.String(), tc.says)
		}
	}
}

func TestStreamReverse(t *testing.T) {
	r := &run{dial: startTCP(t), size: 1000, count: 200, conns: 3, reverse: true}
	m, err := r.stream()
	if err != nil {
		t.Fatal(err)
	}
	// With a count, the client checks that it received exactly what the
	// server was to send.
	if m["count"] != 600 || m["mb_s"] <= 0 || m["msg_s"] <= 0 {
		t.Errorf("implausible reverse stream figures %v", m)
	}
}

// collect returns a report function that keeps the intervals, and a way to
// read them.
func collect() (func(Interval), func() []Interval) {
	var mu sync.Mutex
	var ivs []Interval
	return func(iv Interval) {
			mu.Lock()
			defer mu.Unlock()
			ivs = append(ivs, iv)
		}, func() []Interval {
			mu.Lock()
			defer mu.Unlock()
			return ivs
		}
}

func TestStreamIntervals(t *testing.T) {
	for _, reverse := range []bool{false, true} {
		report, got := collect()
		r := &run{dial: startTCP(t), size: 4096, duration: 250 * time.Millisecond, conns: 2,
			reverse: reverse, interval: 50 * time.Millisecond, report: report}
		m, err := r.stream()
		if err != nil {
			t.Fatal(err)
		}
		ivs := got()
		if len(ivs) < 3 {
			t.Fatalf("reverse %v: %d intervals in 250 ms at 50 ms: %v", reverse, len(ivs), ivs)
		}
		// The intervals tile the test and add up to what it moved.
		var sum int64
		for i, iv := range ivs {
			sum += iv.Bytes
			if iv.End <= iv.Start || (i > 0 && iv.Start != ivs[i-1].End) || iv.MBs < 0 {
				t.Errorf("reverse %v: interval %d is %+v after %+v", reverse, i, iv, ivs[max(i-1, 0)])
			}
		}
		if ivs[0].Start != 0 || float64(sum) != m["count"]*4096 {
			t.Errorf("reverse %v: intervals from %v sum to %d bytes, the test moved %v", reverse, ivs[0].Start, sum, m["count"]*4096)
		}
		if !strings.HasPrefix(ivs[0].String(), "[  0.00-  0.0") || !strings.Contains(ivs[0].String(), " MB/s ") {
			t.Errorf("interval line %q", ivs[0])
		}
	}
}

// command runs this test binary as rdmaperf with args.
func command(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), "RDMAPERF_TEST_MAIN=1")
	return cmd
}

// startServer runs rdmaperf -s with args and returns the address it
// listens on, once it does; the server is killed when the test ends.
func startServer(t *testing.T, args ...string) string {
	t.Helper()
	cmd := command(context.Background(), t, append([]string{"-s", "-v"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	logDone := make(chan struct{})
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		<-logDone
		if t.Failed() {
			t.Logf("server log:\n%s", log.String())
		}
	})
	listening := make(chan string, 1)
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if _, a, ok := strings.Cut(sc.Text(), " server listening on "); ok {
				listening <- a
			}
		}
		close(listening)
	}()
	select {
	case a, ok := <-listening:
		if !ok {
			t.Fatal("the server ended before it listened")
		}
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not listen within 30 s")
	}
	return ""
}

var (
	intervalLine = regexp.MustCompile(`(?m)^\[ *[0-9.]+- *[0-9.]+ s\] +([0-9.]+) MB/s +[0-9]+ msg/s$`)
	summaryLine  = regexp.MustCompile(`(?m)^rdmaperf/(\w+)( reverse)? bw 65536 B: ([0-9.]+) MB/s`)
	statsLine    = regexp.MustCompile(`(?m)^client stats: \{BytesWritten:(\d+) BytesRead:(\d+) `)
)

// client runs rdmaperf -test bw with args, checks that it printed interval
// lines and a summary with data moved (reverse or not), and returns its
// output.
func client(t *testing.T, reverse bool, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := command(ctx, t, append([]string{"-test", "bw"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	out := string(b)
	t.Logf("rdmaperf %s:\n%s%s", strings.Join(args, " "), out, stderr.String())
	if err != nil {
		t.Fatalf("rdmaperf %s: %v", strings.Join(args, " "), err)
	}
	ivs := intervalLine.FindAllStringSubmatch(out, -1)
	moved := false
	for _, iv := range ivs {
		v, _ := strconv.ParseFloat(iv[1], 64)
		moved = moved || v > 0
	}
	if len(ivs) == 0 || !moved {
		t.Errorf("no interval line with data moving in the output")
	}
	m := summaryLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no summary line in the output")
	}
	if v, _ := strconv.ParseFloat(m[3], 64); v <= 0 || (m[2] != "") != reverse {
		t.Errorf("summary %q: want MB/s above 0, reverse %v", m[0], reverse)
	}
	return out
}

// TestCommandTCP runs the command as users do, over TCP, so the host
// covers what TestCommandDevice does in the VM.
func TestCommandTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the command as processes")
	}
	addr := startServer(t, "-net", "tcp", "-addr", "127.0.0.1:0")
	for _, reverse := range []bool{false, true} {
		args := []string{"-c", addr, "-net", "tcp", "-t", "0.5", "-i", "0.2"}
		if reverse {
			args = append(args, "-R")
		}
		out := client(t, reverse, args...)
		if n := len(intervalLine.FindAllString(out, -1)); n < 2 {
			t.Errorf("%d interval lines in 0.5 s at 0.2 s", n)
		}
	}
}

// TestCommandDevice runs rdmaperf -c HOST -t 1 (no port: the default one)
// against rdmaperf -s, forward and with -R, and checks from the client
// connections' counters that the data went the right way.
func TestCommandDevice(t *testing.T) {
	host := os.Getenv("RDMA_TEST_ADDR")
	if host == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test runs this in the VM)")
	}
	if a := startServer(t); !strings.HasSuffix(a, ":"+defaultPort) {
		t.Fatalf("the server listens on %s, not the default port %s", a, defaultPort)
	}
	for _, reverse := range []bool{false, true} {
		args := []string{"-c", host, "-t", "1", "-stats"}
		if reverse {
			args = append(args, "-R")
		}
		out := client(t, reverse, args...)
		m := statsLine.FindStringSubmatch(out)
		if m == nil {
			t.Fatal("no client stats in the output")
		}
		written, _ := strconv.ParseUint(m[1], 10, 64)
		read, _ := strconv.ParseUint(m[2], 10, 64)
		// Besides the data, the client writes the header (and, reverse,
		// the start byte) and reads the ready byte (and, forward, the
		// sink's count): a few dozen bytes at most.
		data, control := written, read
		if reverse {
			data, control = read, written
		}
		if data < 64<<10 || control > 64 {
			t.Errorf("reverse %v: the client wrote %d bytes and read %d", reverse, written, read)
		}
	}
}

// countingDial wraps a dial function and counts its calls.
func countingDial(dial dialFunc, n *atomic.Int64) dialFunc {
	return func() (net.Conn, error) {
		n.Add(1)
		return dial()
	}
}

func TestDial(t *testing.T) {
	for _, conns := range []int{1, 5} {
		var dials atomic.Int64
		r := &run{dial: countingDial(startTCP(t), &dials), size: 64, count: 4, conns: conns, warmup: 1}
		m, err := r.dials()
		if err != nil {
			t.Fatal(err)
		}
		// Four samples of conns connections each, after one unmeasured
		// burst; the setup (until the last Dial returned) is part of each
		// sample, so its median cannot exceed the samples'.
		if m["samples"] != 4 || m["count"] != float64(4*conns) || m["p50_us"] <= 0 || m["p99_us"] < m["p50_us"] ||
			m["setup_us"] <= 0 || m["setup_us"] > m["p50_us"] || m["conn_s"] <= 0 {
			t.Errorf("conns %d: implausible dial figures %v", conns, m)
		}
		if got := dials.Load(); got != int64(5*conns) {
			t.Errorf("conns %d: %d dials, want %d", conns, got, 5*conns)
		}
	}
}

func TestDialForDuration(t *testing.T) {
	r := &run{dial: startTCP(t), size: 64, duration: 50 * time.Millisecond, conns: 3}
	m, err := r.dials()
	if err != nil {
		t.Fatal(err)
	}
	if m["samples"] < 1 || m["count"] != 3*m["samples"] || m["seconds"] < 0.05 {
		t.Errorf("implausible dial figures %v", m)
	}
}

// refuser accepts connections, reads a header's worth and closes them, as
// a server that does not know the kind asked for does.
func refuser(t *testing.T) dialFunc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.ReadFull(c, make([]byte, headerLen))
			}()
		}
	}()
	return func() (net.Conn, error) { return net.Dial("tcp", ln.Addr().String()) }
}

func TestDialFailure(t *testing.T) {
	r := &run{dial: refuser(t), size: 64, count: 1, conns: 3}
	if _, err := r.dials(); err == nil || !strings.Contains(err.Error(), "3 of 3 connections failed") {
		t.Errorf("a burst the server refused: %v", err)
	}
}

func TestHTTP(t *testing.T) {
	var dials atomic.Int64
	r := &run{dial: countingDial(startTCP(t), &dials), size: 1000, count: 10, conns: 4, warmup: 1}
	m, err := r.httpLoad()
	if err != nil {
		t.Fatal(err)
	}
	// The client checks every response's status and length.
	if m["count"] != 40 || m["req_s"] <= 0 || m["p50_us"] <= 0 || m["p99_us"] < m["p50_us"] || m["seconds"] <= 0 {
		t.Errorf("implausible http figures %v", m)
	}
	// Four clients share at most their number of connections at once
	// (and the warm-up's, not counted in the figure).
	if m["dials"] < 1 || m["dials"] > float64(dials.Load()) || dials.Load() < 2 {
		t.Errorf("%v connections counted, %d dialed", m["dials"], dials.Load())
	}
}

func TestHTTPOldServer(t *testing.T) {
	r := &run{dial: refuser(t), size: 64, count: 1, conns: 1}
	if _, err := r.httpLoad(); err == nil || !strings.Contains(err.Error(), "a server older than -test http") {
		t.Errorf("a server that refuses kindHTTP: %v", err)
	}
}

// TestHTTPServerShutsDown checks that the server's HTTP side serves a
// connection handed over by its header, and closes it when the server
// stops.
func TestHTTPServerShutsDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve(ln, false) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c, err = greet(c, header{kind: kindHTTP, size: 5}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: rdmaperf\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK || len(body) != 5 {
		t.Fatalf("response %s with %d bytes, %v", resp.Status, len(body), err)
	}
	ln.Close()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the server stopped, the HTTP connection reads %v, want EOF", err)
	}
	// Connections handed over after that are refused.
	var f httpFront
	f.close()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if f.serve(a, 64) {
		t.Error("a closed HTTP side took a connection")
	}
}

// TestCommandSetupTCP runs -test dial and -test http as users do, over
// TCP, both ends in one process.
func TestCommandSetupTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the command as processes")
	}
	for _, tc := range []struct {
		args   []string
		metric string
		size   int
	}{
		{[]string{"-test", "dial", "-conns", "3"}, "conn_s", 0},
		{[]string{"-test", "http", "-conns", "4", "-size", "100"}, "req_s", 100},
	} {
		args := append([]string{"-local", "-addr", "127.0.0.1:0", "-net", "tcp", "-t", "0.3"}, tc.args...)
		doc, _, err := runJSON(t, args...)
		if err != nil {
			t.Fatalf("rdmaperf %s: %v", strings.Join(args, " "), err)
		}
		res := doc.Rdmaperf
		if res.Impl != "rdmaperf/tcp" || res.Workload != tc.args[1] || res.Size != tc.size || res.Error != "" ||
			res.Metrics[tc.metric] <= 0 || res.Metrics["p50_us"] <= 0 {
			t.Errorf("rdmaperf %s: %+v", strings.Join(args, " "), res)
		}
		if d := describe(res); !strings.Contains(d, "/s") || strings.Contains(d, "error") {
			t.Errorf("described as %q", d)
		}
	}
}

func TestRenderSetup(t *testing.T) {
	br := &benchRun{
		Date: "2026-01-01T00:00:00Z", Kernel: "6.1", Environment: "test bed",
		Notes: []string{"cmtime: its steps, not a round trip"},
		Results: []Result{
			{Round: 1, Impl: "rdmaperf/rdma", Workload: "dial", Conns: 1, Metrics: map[string]float64{"p50_us": 50000, "p99_us": 90000, "conn_s": 19, "setup_us": 37000}},
			{Round: 1, Impl: "rdmaperf/tcp", Workload: "dial", Conns: 1, Metrics: map[string]float64{"p50_us": 88, "p99_us": 270, "conn_s": 9900, "setup_us": 34}},
			{Round: 1, Impl: "cmtime", Workload: "dial", Conns: 1, Metrics: map[string]float64{"p50_us": 40000, "setup_us": 30000, "conn_s": 25}},
			{Round: 1, Impl: "rdmaperf/rdma", Workload: "dial", Conns: 20, Metrics: map[string]float64{"p50_us": 800000, "p99_us": 850000, "conn_s": 26, "setup_us": 620000}},
			{Round: 1, Impl: "cmtime", Workload: "dial", Conns: 20, Metrics: map[string]float64{"p50_us": 80000, "setup_us": 62000, "conn_s": 250}},
			{Round: 2, Impl: "cmtime", Workload: "dial", Conns: 20, Error: "cmtime exit 1: event: RDMA_CM_EVENT_REJECTED, error: 8"},
			{Round: 1, Impl: "rdmaperf/rdma", Workload: "http", Size: 64, Conns: 20, Metrics: map[string]float64{"req_s": 36, "p50_us": 540000, "p99_us": 1200000}},
			{Round: 1, Impl: "rdmaperf/tcp", Workload: "http", Size: 64, Conns: 20, Metrics: map[string]float64{"req_s": 15000, "p50_us": 520, "p99_us": 8700}},
		},
	}
	var b strings.Builder
	renderMarkdown(&b, br)
	out := b.String()
	for _, want := range []string{
		// Columns: this library, busy, one process, Go TCP, perftest, perftest -e,
		// rsockets, cmtime, plain; then ÷ perftest, ÷ perftest -e,
		// ÷ rsockets, ÷ cmtime, busy ÷ perftest, one process ÷ perftest,
		// one process ÷ rsockets, ÷ plain.
		"| dial + round trip + close | p50 µs | 50000 | — | — | 88.0 | — | — | — | 40000 | — | — |  |  |  | 1.25 |  |  |  |  |  |",
		"| dial + round trip + close | p99 µs | 90000 | — | — | 270 | — | — | — | — | — | — |  |  |  |  |  |  |  |  |  |",
		"| dial + round trip + close | conn/s | 19.0 | — | — | 9900 | — | — | — | 25.0 | — | — |  |  |  | 0.76 |  |  |  |  |  |",
		"| dial + round trip + close | setup p50 µs | 37000 | — | — | 34.0 | — | — | — | 30000 | — | — |  |  |  | 1.23 |  |  |  |  |  |",
		"| dial + round trip + close, 20 conns | p50 µs | 800000 | — | — | — | — | — | — | 80000 | — | — |  |  |  | 10.00 |  |  |  |  |  |",
		"| dial + round trip + close, 20 conns | conn/s | 26.0 | — | — | — | — | — | — | 250 | — | — |  |  |  | 0.10 |  |  |  |  |  |",
		"| HTTP/1.1 GET, http.DefaultTransport (2 idle connections kept: most requests dial) 64 B, 20 conns | req/s | 36.0 | — | — | 15000 | — | — | — | — | — | — |  |  |  |  |  |  |  |  |  |",
		"| HTTP/1.1 GET, http.DefaultTransport (2 idle connections kept: most requests dial) 64 B, 20 conns | p99 µs | 1200000 | — | — | 8700 | — | — | — | — | — | — |  |  |  |  |  |  |  |  |  |",
		"cmtime, dial + round trip + close, 20 conns (round 2): cmtime exit 1: event: RDMA_CM_EVENT_REJECTED, error: 8",
		"- cmtime: its steps, not a round trip",
		"| cmtime |",
		"| ÷ cmtime |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered table lacks %q:\n%s", want, out)
		}
	}
}

// A server started with -cpuprofile writes the profile when it is stopped
// by SIGTERM.
func TestServerCPUProfile(t *testing.T) {
	prof := filepath.Join(t.TempDir(), "srv.prof")
	cmd := command(context.Background(), t, "-s", "-addr", "127.0.0.1:0", "-net", "tcp", "-cpuprofile", prof)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.Contains(sc.Text(), " server listening on ") {
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, stderr) // until the server exits
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Errorf("the server did not end by SIGTERM: %v", err)
	}
	b, err := os.ReadFile(prof)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		t.Fatalf("the profile is not gzipped protobuf: %d bytes", len(b))
	}
}
