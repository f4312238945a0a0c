package main

import (
	"math"
	"net"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/rdma"
)

// The -json document has the shape of iperf3 -J's, so that what reads
// iperf3's JSON reads rdmaperf's: the same names and the same JSON types
// (iperf3's integers are integers here, its booleans booleans). iperf3
// fills some fields from exchanges with its server that rdmaperf's
// protocol does not have; what is not measured is zero, never a guess.
// The record rdmaperf printed before (Result) is kept whole under the
// extension key "rdmaperf", the document's last member.

// iperfDoc is one test's -json document.
type iperfDoc struct {
	Start     iperfStart      `json:"start"`
	Intervals []iperfInterval `json:"intervals"`
	End       iperfEnd        `json:"end"`
	Error     string          `json:"error,omitempty"`
	// Last: bench/run.sh cuts the record out of the line as the value
	// of the final key.
	Rdmaperf Result `json:"rdmaperf"`
}

type iperfStart struct {
	Connected    []iperfConnected `json:"connected"`
	Version      string           `json:"version"`
	SystemInfo   string           `json:"system_info"`
	Timestamp    iperfTimestamp   `json:"timestamp"`
	ConnectingTo iperfHostPort    `json:"connecting_to"`
	TestStart    iperfTestStart   `json:"test_start"`
}

// iperfConnected is a connection the test measured over. Socket numbers
// the connections from 1 in the order they were opened (a connection of
// this library has no descriptor of its own); the streams of intervals and
// end use the same numbers.
type iperfConnected struct {
	Socket     int    `json:"socket"`
	LocalHost  string `json:"local_host"`
	LocalPort  int    `json:"local_port"`
	RemoteHost string `json:"remote_host"`
	RemotePort int    `json:"remote_port"`
}

type iperfTimestamp struct {
	Time          string `json:"time"`
	Timesecs      int64  `json:"timesecs"`
	Timemillisecs int64  `json:"timemillisecs"`
}

type iperfHostPort struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// iperfTestStart is the test's settings. iperf3 counts duration in whole
// seconds: a fractional -t is rounded up, and a test bounded by -n (or
// -bytes for copy) has duration 0, as iperf3's -n and -k have.
type iperfTestStart struct {
	Protocol      string  `json:"protocol"`
	NumStreams    int     `json:"num_streams"`
	Blksize       int     `json:"blksize"`
	Omit          int     `json:"omit"`
	Duration      int     `json:"duration"`
	Bytes         int64   `json:"bytes"`
	Blocks        int     `json:"blocks"`
	Reverse       int     `json:"reverse"`
	Tos           int     `json:"tos"`
	TargetBitrate int64   `json:"target_bitrate"`
	Bidir         int     `json:"bidir"`
	Fqrate        int64   `json:"fqrate"`
	Interval      float64 `json:"interval"`
}

type iperfInterval struct {
	Streams []iperfIntervalStream `json:"streams"`
	Sum     iperfIntervalSum      `json:"sum"`
}

// iperfIntervalSum is what moved in one interval. Sender is true when
// this host sent the data: false for a reverse (-R) test.
type iperfIntervalSum struct {
	Start         float64 `json:"start"`
	End           float64 `json:"end"`
	Seconds       float64 `json:"seconds"`
	Bytes         int64   `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Omitted       bool    `json:"omitted"`
	Sender        bool    `json:"sender"`
}

type iperfIntervalStream struct {
	Socket int `json:"socket"`
	iperfIntervalSum
}

// iperfEnd is the summary. Only the throughput tests have sums: a latency
// or setup test's bytes per second would be read as a throughput it never
// measured.
type iperfEnd struct {
	Streams []iperfEndStream `json:"streams"`
	// Sum is the datagram tests' alone, as it is UDP's alone in iperf3.
	Sum         *iperfDgramSum `json:"sum,omitempty"`
	SumSent     any            `json:"sum_sent,omitempty"`     // *iperfSum, or *iperfDgramSum for datagrams
	SumReceived any            `json:"sum_received,omitempty"` // the same
	CPU         *iperfCPU      `json:"cpu_utilization_percent,omitempty"`
}

type iperfEndStream struct {
	Sender   *iperfStreamSum   `json:"sender,omitempty"`
	Receiver *iperfStreamSum   `json:"receiver,omitempty"`
	UDP      *iperfDgramStream `json:"udp,omitempty"`
}

type iperfSum struct {
	Start         float64 `json:"start"`
	End           float64 `json:"end"`
	Seconds       float64 `json:"seconds"`
	Bytes         int64   `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Sender        bool    `json:"sender"`
}

type iperfStreamSum struct {
	Socket int `json:"socket"`
	iperfSum
}

// iperfDgramSum is a datagram test's sum. As in iperf3's UDP sums, Sender
// says which side counted it: sum_sent the client's, sum_received the
// server's sink's (and sum, iperf3's older one, what was sent with the
// sink's losses). Jitter is not measured (0).
type iperfDgramSum struct {
	iperfSum
	JitterMs    float64 `json:"jitter_ms"`
	LostPackets int64   `json:"lost_packets"`
	Packets     int64   `json:"packets"`
	LostPercent float64 `json:"lost_percent"`
}

// iperfDgramStream is the datagram end point's summary; neither jitter
// nor reordering is measured (0).
type iperfDgramStream struct {
	Socket int `json:"socket"`
	iperfDgramSum
	OutOfOrder int64 `json:"out_of_order"`
}

// iperfCPU is the CPU time of the test's window (its cpu_s) in percent of
// one CPU: host_* are this process's (with -local, both ends'); remote_*
// are 0, since the server does not report its own.
type iperfCPU struct {
	HostTotal    float64 `json:"host_total"`
	HostUser     float64 `json:"host_user"`
	HostSystem   float64 `json:"host_system"`
	RemoteTotal  float64 `json:"remote_total"`
	RemoteUser   float64 `json:"remote_user"`
	RemoteSystem float64 `json:"remote_system"`
}

// observed is what the document needs beyond a test's metrics, noted while
// it runs. A nil *observed notes nothing.
type observed struct {
	mu        sync.Mutex // connected: a clients test opens connections from several goroutines
	connected []iperfConnected
	// streams: a bw or rate test's bytes moved by each connection, in
	// the order they were opened.
	streams []int64
	// cpu: the CPU time the metrics' cpu_s counts, its user and system
	// parts apart.
	cpu cpuSample
	// dgram: what a datagram blast's sink counted.
	dgram *sinkCounts
}

// sinkCounts is what a datagram sink received, and over how long.
type sinkCounts struct {
	datagrams, bytes int64
	seconds          float64
}

// connect notes a connection (or datagram end point) the test measures over.
func (o *observed) connect(local, remote net.Addr) {
	if o == nil {
		return
	}
	lh, lp := hostPort(local)
	rh, rp := hostPort(remote)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.connected = append(o.connected, iperfConnected{Socket: len(o.connected) + 1, LocalHost: lh, LocalPort: lp, RemoteHost: rh, RemotePort: rp})
}

func hostPort(a net.Addr) (string, int) {
	switch a := a.(type) {
	case *rdma.Addr:
		return a.IP.String(), a.Port
	case *net.TCPAddr:
		return a.IP.String(), a.Port
	case *net.UDPAddr:
		return a.IP.String(), a.Port
	case nil:
		return "", 0
	}
	h, p, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String(), 0
	}
	port, _ := strconv.Atoi(p)
	return h, port
}

// streamTests and dgramBlasts are the tests whose documents have sums: the
// throughput tests.
var (
	streamTests = []string{"bw", "rate", "copy", "write-bw", "read-bw"}
	dgramBlasts = []string{"dgram-rate", "dgram-bw"}
)

// iperfReport builds the document of a test run by cfg against target
// (host:port as dialed), begun at began, with its record res.
func iperfReport(cfg *config, target string, began time.Time, res Result, obs *observed) iperfDoc {
	if obs == nil {
		obs = &observed{}
	}
	host, p, _ := net.SplitHostPort(target)
	port, _ := strconv.Atoi(p)
	reverse := cfg.reverse || cfg.workload == "read-bw"
	doc := iperfDoc{
		Start: iperfStart{
			Connected:    append([]iperfConnected{}, obs.connected...),
			Version:      "rdmaperf " + buildVersion(),
			SystemInfo:   systemInfo(),
			Timestamp:    iperfTimestamp{began.UTC().Format(http.TimeFormat), began.Unix(), began.UnixMilli()},
			ConnectingTo: iperfHostPort{host, port},
			TestStart: iperfTestStart{
				Protocol:   iperfProtocol(cfg.netw, cfg.workload),
				NumStreams: max(res.Conns, 1),
				Blksize:    res.Size,
				Blocks:     cfg.count,
				Reverse:    boolInt(reverse),
				Interval:   cfg.interval.Seconds(),
			},
		},
		Intervals: []iperfInterval{},
		End:       iperfEnd{Streams: []iperfEndStream{}},
		Error:     res.Error,
		Rdmaperf:  res,
	}
	ts := &doc.Start.TestStart
	switch {
	case cfg.workload == "idle":
		ts.Duration = wholeSeconds(cfg.idle)
	case cfg.workload == "copy":
		ts.Bytes = cfg.copyLen
	case cfg.count == 0:
		ts.Duration = wholeSeconds(cfg.duration)
	}
	sender := !reverse
	for _, iv := range res.Intervals {
		secs := iv.End - iv.Start
		sum := iperfIntervalSum{Start: iv.Start, End: iv.End, Seconds: secs, Bytes: iv.Bytes, BitsPerSecond: bitsPerSecond(iv.Bytes, secs), Sender: sender}
		out := iperfInterval{Streams: []iperfIntervalStream{}, Sum: sum}
		for i, b := range iv.Streams {
			s := sum
			s.Bytes, s.BitsPerSecond = b, bitsPerSecond(b, secs)
			out.Streams = append(out.Streams, iperfIntervalStream{Socket: i + 1, iperfIntervalSum: s})
		}
		doc.Intervals = append(doc.Intervals, out)
	}
	m := res.Metrics
	if res.Error != "" || m == nil {
		return doc
	}
	secs := m["seconds"]
	if _, ok := m["cpu_s"]; ok && secs > 0 {
		pct := func(s float64) float64 { return 100 * s / secs }
		doc.End.CPU = &iperfCPU{HostTotal: pct(obs.cpu.user + obs.cpu.sys), HostUser: pct(obs.cpu.user), HostSystem: pct(obs.cpu.sys)}
	}
	switch {
	case slices.Contains(streamTests, cfg.workload):
		streams := obs.streams
		if len(streams) == 0 {
			// One connection, counted in operations (one-sided) or
			// given in bytes (copy).
			n := int64(math.Round(m["count"])) * int64(res.Size)
			if cfg.workload == "copy" {
				n = cfg.copyLen
			}
			streams = []int64{n}
		}
		// The receiving side has every byte sent when the clock stops
		// (see stream), so the sender's and the receiver's figures agree.
		var total int64
		for i, b := range streams {
			total += b
			s := &iperfStreamSum{Socket: i + 1, iperfSum: wholeRun(b, secs, sender)}
			doc.End.Streams = append(doc.End.Streams, iperfEndStream{Sender: s, Receiver: s})
		}
		sum := wholeRun(total, secs, sender)
		doc.End.SumSent, doc.End.SumReceived = &sum, &sum
	case slices.Contains(dgramBlasts, cfg.workload) && obs.dgram != nil:
		sent := int64(m["count"])
		got := obs.dgram
		lost := max(sent-got.datagrams, 0)
		sentSum := iperfDgramSum{iperfSum: wholeRun(sent*int64(res.Size), secs, true), Packets: sent}
		recvSum := iperfDgramSum{iperfSum: wholeRun(got.bytes, got.seconds, false), Packets: sent, LostPackets: lost, LostPercent: m["loss_pct"]}
		// iperf3's own sum: what was sent, with the receiver's losses.
		sum := sentSum
		sum.LostPackets, sum.LostPercent = lost, recvSum.LostPercent
		doc.End.Sum, doc.End.SumSent, doc.End.SumReceived = &sum, &sentSum, &recvSum
		doc.End.Streams = append(doc.End.Streams, iperfEndStream{UDP: &iperfDgramStream{Socket: 1, iperfDgramSum: sum}})
	}
	return doc
}

// iperfProtocol is test_start's protocol: what carried the test.
func iperfProtocol(netw, workload string) string {
	switch {
	case isDgram(workload) && netw == "udp":
		return "UDP"
	case isDgram(workload):
		return "RDMA UD"
	case netw == "tcp":
		return "TCP"
	}
	return "RDMA"
}

func wholeRun(bytes int64, secs float64, sender bool) iperfSum {
	return iperfSum{Start: 0, End: secs, Seconds: secs, Bytes: bytes, BitsPerSecond: bitsPerSecond(bytes, secs), Sender: sender}
}

func bitsPerSecond(bytes int64, secs float64) float64 {
	if secs <= 0 {
		return 0
	}
	return float64(bytes) * 8 / secs
}

func wholeSeconds(d time.Duration) int { return int(math.Ceil(d.Seconds())) }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// buildVersion is the module version the binary was built from, as go
// version -m reports it.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// systemInfo is uname's fields, in the order iperf3 prints them.
func systemInfo() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	s := unix.ByteSliceToString
	return s(u.Sysname[:]) + " " + s(u.Nodename[:]) + " " + s(u.Release[:]) + " " + s(u.Version[:]) + " " + s(u.Machine[:])
}
