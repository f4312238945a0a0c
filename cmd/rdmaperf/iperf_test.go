package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// iperf3Doc is iperf3 -J's document as a parser of it declares it, apart
// from the encoder's types: a field renamed, or given another JSON type
// (a fractional number where iperf3 has an integer, a number for a
// boolean), fails to decode here.
type iperf3Doc struct {
	Start struct {
		Connected []struct {
			Socket     int    `json:"socket"`
			LocalHost  string `json:"local_host"`
			LocalPort  int    `json:"local_port"`
			RemoteHost string `json:"remote_host"`
			RemotePort int    `json:"remote_port"`
		} `json:"connected"`
		Version    string `json:"version"`
		SystemInfo string `json:"system_info"`
		Timestamp  struct {
			Time     string `json:"time"`
			Timesecs int64  `json:"timesecs"`
		} `json:"timestamp"`
		ConnectingTo struct {
			Host string `json:"host"`
			Port int    `json:"port"`
		} `json:"connecting_to"`
		TestStart struct {
			Protocol   string `json:"protocol"`
			NumStreams int    `json:"num_streams"`
			Blksize    int    `json:"blksize"`
			Omit       int    `json:"omit"`
			Duration   int    `json:"duration"`
			Bytes      int64  `json:"bytes"`
			Blocks     int    `json:"blocks"`
			Reverse    int    `json:"reverse"`
		} `json:"test_start"`
	} `json:"start"`
	Intervals []struct {
		Streams []iperf3Flow `json:"streams"`
		Sum     iperf3Flow   `json:"sum"`
	} `json:"intervals"`
	End struct {
		Streams []struct {
			Sender   *iperf3Flow `json:"sender"`
			Receiver *iperf3Flow `json:"receiver"`
			UDP      *iperf3Flow `json:"udp"`
		} `json:"streams"`
		Sum         *iperf3Flow `json:"sum"`
		SumSent     *iperf3Flow `json:"sum_sent"`
		SumReceived *iperf3Flow `json:"sum_received"`
		CPU         *struct {
			HostTotal    float64 `json:"host_total"`
			HostUser     float64 `json:"host_user"`
			HostSystem   float64 `json:"host_system"`
			RemoteTotal  float64 `json:"remote_total"`
			RemoteUser   float64 `json:"remote_user"`
			RemoteSystem float64 `json:"remote_system"`
		} `json:"cpu_utilization_percent"`
	} `json:"end"`
	Error    string `json:"error"`
	Rdmaperf Result `json:"rdmaperf"`
}

// iperf3Flow is any of iperf3's figures of bytes moved: an interval's
// stream or sum, an end stream's sender or receiver, a sum; the UDP fields
// are the datagram tests'.
type iperf3Flow struct {
	Socket        int     `json:"socket"`
	Start         float64 `json:"start"`
	End           float64 `json:"end"`
	Seconds       float64 `json:"seconds"`
	Bytes         int64   `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Omitted       bool    `json:"omitted"`
	Sender        bool    `json:"sender"`
	LostPackets   int64   `json:"lost_packets"`
	Packets       int64   `json:"packets"`
	LostPercent   float64 `json:"lost_percent"`
}

// jsonKinds are the JSON types of the keys iperf3 always writes, by path
// (a [] step is every element of an array); "int" is a number without a
// fraction.
var jsonKinds = map[string]string{
	"start": "object", "start.connected": "array", "start.version": "string", "start.system_info": "string",
	"start.timestamp.time": "string", "start.timestamp.timesecs": "int", "start.connecting_to.host": "string",
	"start.connecting_to.port": "int", "start.test_start.protocol": "string", "start.test_start.num_streams": "int",
	"start.test_start.blksize": "int", "start.test_start.omit": "int", "start.test_start.duration": "int",
	"start.test_start.bytes": "int", "start.test_start.blocks": "int", "start.test_start.reverse": "int",
	"intervals": "array", "end": "object", "end.streams": "array", "rdmaperf": "object",
	"start.connected[].socket": "int", "start.connected[].local_host": "string", "start.connected[].local_port": "int",
	"start.connected[].remote_host": "string", "start.connected[].remote_port": "int",
}

// flowKinds are the keys of an iperf3 figure of bytes moved.
var flowKinds = map[string]string{"start": "number", "end": "number", "seconds": "number", "bytes": "int", "bits_per_second": "number", "sender": "bool"}

var cpuKinds = map[string]string{"host_total": "number", "host_user": "number", "host_system": "number", "remote_total": "number", "remote_user": "number", "remote_system": "number"}

// requireKinds checks that every path in kinds is in doc with its JSON
// type.
func requireKinds(t *testing.T, doc any, prefix string, kinds map[string]string) {
	t.Helper()
	for path, kind := range kinds {
		for _, v := range lookup(doc, strings.Split(prefix+path, ".")) {
			ok := false
			switch x := v.(type) {
			case map[string]any:
				ok = kind == "object"
			case []any:
				ok = kind == "array"
			case string:
				ok = kind == "string"
			case bool:
				ok = kind == "bool"
			case float64:
				ok = kind == "number" || (kind == "int" && x == math.Trunc(x))
			}
			require.True(t, ok, "%s%s is %T %v, want %s", prefix, path, v, v, kind)
		}
	}
}

// lookup returns the values at path in v (several below an array step);
// a missing key is a nil value, which no kind accepts.
func lookup(v any, path []string) []any {
	if len(path) == 0 {
		return []any{v}
	}
	key, all := strings.CutSuffix(path[0], "[]")
	m, _ := v.(map[string]any)
	next, ok := m[key]
	if !ok {
		return []any{nil}
	}
	if !all {
		return lookup(next, path[1:])
	}
	var out []any
	for _, e := range next.([]any) {
		out = append(out, lookup(e, path[1:])...)
	}
	return out
}

// runJSON runs rdmaperf -json with args and returns its document, decoded
// both as a parser of iperf3's would and as a tree, and how it exited.
func runJSON(t *testing.T, args ...string) (iperf3Doc, map[string]any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := command(ctx, t, append([]string{"-json"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, runErr := cmd.Output()
	t.Logf("rdmaperf -json %s: %s%s", strings.Join(args, " "), out, stderr.String())
	require.Equal(t, 1, bytes.Count(out, []byte("\n")), "one line")
	var doc iperf3Doc
	require.NoError(t, json.Unmarshal(out, &doc))
	var tree map[string]any
	require.NoError(t, json.Unmarshal(out, &tree))
	requireKinds(t, tree, "", jsonKinds)
	// The record is the document's last member, which bench/run.sh
	// relies on to cut it out.
	require.True(t, bytes.HasSuffix(bytes.TrimSpace(out), []byte("}}")))
	rec, _ := json.Marshal(doc.Rdmaperf)
	require.True(t, bytes.HasSuffix(bytes.TrimSpace(out), append([]byte(`,"rdmaperf":`), append(rec, '}')...)), "the record last")
	return doc, tree, runErr
}

// near says whether a and b agree to a part in a million (both are
// computed from the same bytes and seconds).
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(math.Abs(a), math.Abs(b)) }

// requireFlow checks one figure of bytes moved: its seconds span it and
// its rate is its bytes over them.
func requireFlow(t *testing.T, what string, f iperf3Flow) {
	t.Helper()
	require.True(t, f.Seconds > 0 && near(f.Seconds, f.End-f.Start), "%s: %+v", what, f)
	require.True(t, near(f.BitsPerSecond, float64(f.Bytes)*8/f.Seconds), "%s: %+v", what, f)
}

// requireCPU checks the CPU figures: there, in percent of one CPU (at
// most all of the machine's), the total the sum of its parts and what the
// record's cpu_s over its seconds is.
func requireCPU(t *testing.T, tree map[string]any, doc iperf3Doc) {
	t.Helper()
	requireKinds(t, tree, "end.cpu_utilization_percent.", cpuKinds)
	c := doc.End.CPU
	top := 100 * float64(runtime.NumCPU())
	for _, v := range []float64{c.HostTotal, c.HostUser, c.HostSystem} {
		require.True(t, v >= 0 && v <= top, "CPU %+v outside [0, %v]", *c, top)
	}
	require.InDelta(t, c.HostUser+c.HostSystem, c.HostTotal, 1e-9)
	m := doc.Rdmaperf.Metrics
	require.InDelta(t, 100*m["cpu_s"]/m["seconds"], c.HostTotal, 1e-6*c.HostTotal+1e-9)
	// The server does not report its CPU time.
	require.Zero(t, c.RemoteTotal+c.RemoteUser+c.RemoteSystem)
}

// requireStreamDoc checks a bw test's document (conns connections,
// reverse or not, over protocol) against itself and its record.
func requireStreamDoc(t *testing.T, doc iperf3Doc, tree map[string]any, conns int, reverse bool, protocol string) {
	t.Helper()
	ts := doc.Start.TestStart
	require.Equal(t, protocol, ts.Protocol)
	require.Equal(t, conns, ts.NumStreams)
	require.Equal(t, 65536, ts.Blksize)
	require.Equal(t, boolInt(reverse), ts.Reverse)
	require.True(t, strings.HasPrefix(doc.Start.Version, "rdmaperf "), doc.Start.Version)
	require.True(t, strings.HasPrefix(doc.Start.SystemInfo, "Linux "), doc.Start.SystemInfo)
	when, err := time.Parse(http.TimeFormat, doc.Start.Timestamp.Time)
	require.NoError(t, err)
	require.Equal(t, doc.Start.Timestamp.Timesecs, when.Unix())
	require.InDelta(t, time.Now().Unix(), doc.Start.Timestamp.Timesecs, 120)

	require.Len(t, doc.Start.Connected, conns)
	for i, c := range doc.Start.Connected {
		require.Equal(t, i+1, c.Socket)
		require.NotNil(t, net.ParseIP(c.LocalHost), c.LocalHost)
		require.Equal(t, doc.Start.ConnectingTo.Host, c.RemoteHost)
		require.Equal(t, doc.Start.ConnectingTo.Port, c.RemotePort)
		require.Positive(t, c.LocalPort)
	}

	rec := doc.Rdmaperf
	m := rec.Metrics
	require.Empty(t, doc.Error)
	require.Equal(t, "bw", rec.Workload)
	require.Equal(t, reverse, strings.HasSuffix(rec.Impl, " reverse"), rec.Impl)

	// The intervals tile the test, per stream and summed, and are the
	// record's intervals in bits.
	require.GreaterOrEqual(t, len(doc.Intervals), 2)
	require.Len(t, rec.Intervals, len(doc.Intervals))
	requireKinds(t, tree, "intervals[].sum.", flowKinds)
	requireKinds(t, tree, "intervals[].streams[].", flowKinds)
	requireKinds(t, tree, "intervals[].sum.", map[string]string{"omitted": "bool"})
	var moved int64
	for i, iv := range doc.Intervals {
		requireFlow(t, "interval sum", iv.Sum)
		require.Equal(t, !reverse, iv.Sum.Sender)
		require.False(t, iv.Sum.Omitted)
		require.Equal(t, rec.Intervals[i].Bytes, iv.Sum.Bytes)
		require.InDelta(t, rec.Intervals[i].MBs*8e6, iv.Sum.BitsPerSecond, 1e-6*iv.Sum.BitsPerSecond+1e-9)
		if i > 0 {
			require.Equal(t, doc.Intervals[i-1].Sum.End, iv.Sum.Start)
		}
		require.Len(t, iv.Streams, conns)
		var sum int64
		for j, s := range iv.Streams {
			requireFlow(t, "interval stream", s)
			require.Equal(t, j+1, s.Socket)
			require.Equal(t, iv.Sum.Start, s.Start)
			sum += s.Bytes
		}
		require.Equal(t, iv.Sum.Bytes, sum)
		moved += iv.Sum.Bytes
	}

	// The end: every stream's sender and receiver, and the sums, agree
	// with each other, with the intervals and with the record.
	requireKinds(t, tree, "end.sum_sent.", flowKinds)
	requireKinds(t, tree, "end.sum_received.", flowKinds)
	requireKinds(t, tree, "end.streams[].sender.", flowKinds)
	requireKinds(t, tree, "end.streams[].receiver.", flowKinds)
	sent, got := doc.End.SumSent, doc.End.SumReceived
	require.NotNil(t, sent)
	require.NotNil(t, got)
	require.Nil(t, doc.End.Sum, "sum is UDP's")
	requireFlow(t, "sum_sent", *sent)
	requireFlow(t, "sum_received", *got)
	// count is in writes of 65536 bytes; a reverse test's last read
	// may end inside one.
	require.InDelta(t, m["count"]*65536, float64(sent.Bytes), 0.5)
	require.Equal(t, sent.Bytes, got.Bytes)
	require.Equal(t, moved, sent.Bytes)
	require.Equal(t, m["seconds"], sent.Seconds)
	require.Zero(t, sent.Start)
	require.InDelta(t, m["mb_s"]*8e6, sent.BitsPerSecond, 1e-6*sent.BitsPerSecond)
	require.Equal(t, !reverse, sent.Sender)
	require.Len(t, doc.End.Streams, conns)
	var total int64
	for i, s := range doc.End.Streams {
		require.NotNil(t, s.Sender)
		require.NotNil(t, s.Receiver)
		require.Equal(t, i+1, s.Sender.Socket)
		require.Equal(t, *s.Sender, *s.Receiver)
		requireFlow(t, "end stream", *s.Sender)
		total += s.Sender.Bytes
	}
	require.Equal(t, sent.Bytes, total)
	requireCPU(t, tree, doc)
}

// TestJSONStreamTCP runs rdmaperf -J -test bw over TCP, both ends in one
// process, forward and reverse, and reads its document as iperf3's.
func TestJSONStreamTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the command as processes")
	}
	for _, reverse := range []bool{false, true} {
		args := []string{"-local", "-addr", "127.0.0.1:0", "-net", "tcp", "-test", "bw", "-P", "2", "-t", "0.4", "-i", "0.1"}
		if reverse {
			args = append(args, "-R")
		}
		doc, tree, err := runJSON(t, args...)
		require.NoError(t, err)
		requireStreamDoc(t, doc, tree, 2, reverse, "TCP")
		require.Equal(t, 1, doc.Start.TestStart.Duration, "0.4 s in iperf3's whole seconds")
	}
}

// TestJSONLatencyTCP: a test that is not a throughput test has start and
// end, no intervals and no sums, and its figures in the record.
func TestJSONLatencyTCP(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the command as processes")
	}
	doc, tree, err := runJSON(t, "-local", "-addr", "127.0.0.1:0", "-net", "tcp", "-test", "lat", "-n", "300")
	require.NoError(t, err)
	require.Equal(t, "lat", doc.Rdmaperf.Workload)
	require.Equal(t, 300.0, doc.Rdmaperf.Metrics["count"])
	require.Positive(t, doc.Rdmaperf.Metrics["p50_us"])
	ts := doc.Start.TestStart
	require.Equal(t, "TCP", ts.Protocol)
	require.Equal(t, 300, ts.Blocks)
	require.Zero(t, ts.Duration, "bounded by -n")
	require.Len(t, doc.Start.Connected, 1)
	require.Empty(t, doc.Intervals)
	require.Empty(t, doc.End.Streams)
	end := tree["end"].(map[string]any)
	for _, k := range []string{"sum", "sum_sent", "sum_received"} {
		require.NotContains(t, end, k)
	}
	requireCPU(t, tree, doc)

	// A dial test's connections come and go: none is listed.
	doc, _, err = runJSON(t, "-local", "-addr", "127.0.0.1:0", "-net", "tcp", "-test", "dial", "-P", "2", "-t", "0.2")
	require.NoError(t, err)
	require.Empty(t, doc.Start.Connected)
	require.Positive(t, doc.Rdmaperf.Metrics["conn_s"])
}

// TestJSONDgramUDP: a datagram blast's document has iperf3's UDP sums,
// from what was sent and what the sink counted.
func TestJSONDgramUDP(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the command as processes")
	}
	addr := startServer(t, "-net", "udp", "-addr", "127.0.0.1:0")
	doc, tree, err := runJSON(t, "-c", addr, "-net", "udp", "-test", "dgram-rate", "-batch", "8", "-t", "0.3")
	require.NoError(t, err)
	requireDgramDoc(t, doc, tree, "UDP", 64)
}

// requireDgramDoc checks a dgram-rate or dgram-bw document of size-byte
// datagrams over protocol.
func requireDgramDoc(t *testing.T, doc iperf3Doc, tree map[string]any, protocol string, size int) {
	t.Helper()
	require.Equal(t, protocol, doc.Start.TestStart.Protocol)
	// The datagram end points, not the connection that sets them up.
	require.Len(t, doc.Start.Connected, 1)
	require.NotEqual(t, doc.Start.ConnectingTo.Port, doc.Start.Connected[0].RemotePort)
	udp := map[string]string{"jitter_ms": "number", "lost_packets": "int", "packets": "int", "lost_percent": "number"}
	for _, k := range []string{"end.sum.", "end.sum_sent.", "end.sum_received.", "end.streams[].udp."} {
		requireKinds(t, tree, k, flowKinds)
		requireKinds(t, tree, k, udp)
	}
	m := doc.Rdmaperf.Metrics
	sent, got := doc.End.SumSent, doc.End.SumReceived
	requireFlow(t, "sum_sent", *sent)
	requireFlow(t, "sum_received", *got)
	require.True(t, sent.Sender)
	require.False(t, got.Sender)
	require.Equal(t, int64(m["count"]), sent.Packets)
	require.Equal(t, sent.Packets*int64(size), sent.Bytes)
	require.Equal(t, sent.Packets, got.Packets)
	require.Equal(t, int64(m["count"]-m["recv_count"]), got.LostPackets)
	require.InDelta(t, m["loss_pct"], got.LostPercent, 1e-9)
	require.Positive(t, got.Bytes)
	require.LessOrEqual(t, got.Bytes, sent.Bytes)
	require.InDelta(t, m["recv_mb_s"]*8e6, got.BitsPerSecond, 1e-6*got.BitsPerSecond)
	require.InDelta(t, m["mb_s"]*8e6, sent.BitsPerSecond, 1e-6*sent.BitsPerSecond)
	require.Equal(t, sent.Bytes, doc.End.Sum.Bytes)
	require.Equal(t, got.LostPackets, doc.End.Sum.LostPackets)
	require.Len(t, doc.End.Streams, 1)
	require.Equal(t, sent.Bytes, doc.End.Streams[0].UDP.Bytes)
	requireCPU(t, tree, doc)
}

// TestJSONError: a failed test says so in iperf3's top-level error, with
// no sums, and exits 1.
func TestJSONError(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the command as processes")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	doc, tree, err := runJSON(t, "-c", addr, "-net", "tcp", "-test", "bw", "-t", "0.2")
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit) && exit.ExitCode() == 1, "exit: %v", err)
	require.Contains(t, doc.Error, "refused")
	require.Equal(t, doc.Error, doc.Rdmaperf.Error)
	require.Equal(t, map[string]any{"streams": []any{}}, tree["end"])
	_, port, _ := net.SplitHostPort(addr)
	require.Equal(t, port, strconv.Itoa(doc.Start.ConnectingTo.Port))
}

// TestIperfReport builds documents of the tests the host cannot run (the
// one-sided ones need a device) from their records.
func TestIperfReport(t *testing.T) {
	began := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		workload string
		metrics  map[string]float64
		size     int
		bytes    int64
		reverse  bool
		sums     bool
	}{
		{"write-bw", map[string]float64{"count": 1000, "seconds": 0.5, "cpu_s": 0.25, "mb_s": 131.072}, 65536, 1000 * 65536, false, true},
		{"read-bw", map[string]float64{"count": 10, "seconds": 2, "cpu_s": 1}, 4096, 10 * 4096, true, true},
		{"atomic-rate", map[string]float64{"count": 10, "seconds": 1, "cpu_s": 0.5}, 8, 0, false, false},
		{"write-lat", map[string]float64{"count": 10, "seconds": 1, "cpu_s": 0.5, "p50_us": 3}, 64, 0, false, false},
	} {
		cfg := &config{netw: "rdma", workload: tc.workload, size: tc.size, duration: 1500 * time.Millisecond, interval: time.Second}
		res := Result{Impl: "rdmaperf/rdma", Workload: tc.workload, Size: tc.size, Conns: 1, Metrics: tc.metrics}
		obs := &observed{cpu: cpuSample{user: tc.metrics["cpu_s"] / 5, sys: tc.metrics["cpu_s"] * 4 / 5}}
		obs.connect(&net.TCPAddr{IP: net.IPv4(10, 77, 0, 1), Port: 40000}, &net.TCPAddr{IP: net.IPv4(10, 77, 0, 1), Port: 5301})
		b, err := json.Marshal(iperfReport(cfg, "10.77.0.1:5301", began, res, obs))
		require.NoError(t, err)
		var doc iperf3Doc
		require.NoError(t, json.Unmarshal(b, &doc), "%s", b)
		var tree map[string]any
		require.NoError(t, json.Unmarshal(b, &tree))
		requireKinds(t, tree, "", jsonKinds)
		require.Equal(t, "Tue, 14 Nov 2023 22:13:20 GMT", doc.Start.Timestamp.Time)
		require.Equal(t, "RDMA", doc.Start.TestStart.Protocol)
		require.Equal(t, 2, doc.Start.TestStart.Duration, "1.5 s, rounded up")
		require.Equal(t, boolInt(tc.reverse), doc.Start.TestStart.Reverse, tc.workload)
		require.Equal(t, "10.77.0.1", doc.Start.Connected[0].LocalHost)
		require.Equal(t, 5301, doc.Start.ConnectingTo.Port)
		require.Equal(t, res, doc.Rdmaperf)
		requireCPU(t, tree, doc)
		require.InDelta(t, 20*tc.metrics["cpu_s"]/tc.metrics["seconds"], doc.End.CPU.HostUser, 1e-9)
		if !tc.sums {
			require.Nil(t, doc.End.SumSent, tc.workload)
			require.Empty(t, doc.End.Streams, tc.workload)
			continue
		}
		requireFlow(t, tc.workload, *doc.End.SumSent)
		require.Equal(t, tc.bytes, doc.End.SumSent.Bytes)
		require.Equal(t, tc.bytes, doc.End.SumReceived.Bytes)
		require.Equal(t, !tc.reverse, doc.End.SumSent.Sender)
		require.Equal(t, tc.metrics["seconds"], doc.End.SumReceived.Seconds)
		if v, ok := tc.metrics["mb_s"]; ok {
			require.InDelta(t, v*8e6, doc.End.SumSent.BitsPerSecond, 1e-3)
		}
	}
}

// TestJSONDevice runs rdmaperf -J -test bw against rdmaperf -s over this
// library, two connections, and reads its document as iperf3's.
func TestJSONDevice(t *testing.T) {
	host := os.Getenv("RDMA_TEST_ADDR")
	if host == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test runs this in the VM)")
	}
	addr := startServer(t, "-addr", host+":0")
	doc, tree, err := runJSON(t, "-c", addr, "-test", "bw", "-P", "2", "-t", "1", "-i", "0.3")
	require.NoError(t, err)
	requireStreamDoc(t, doc, tree, 2, false, "RDMA")
	require.Equal(t, host, doc.Start.Connected[0].LocalHost)
}
