// Command rdmaperf measures github.com/goverbs/rdma connections the way
// iperf measures TCP: a server on one host, a client on another.
//
//	rdmaperf -s [-addr host:port]                  # server, on port 5301 unless told
//	rdmaperf -c host -test lat -l 64 -n 10000      # ping-pong latency
//	rdmaperf -c host -test bw -t 10 -P 4           # one-way throughput, client to server
//	rdmaperf -c host -test bw -R                   # reverse: the server sends
//	rdmaperf -c host -test rate -P 8               # 64 B message rate
//	rdmaperf -c host:port -idle 5s                 # CPU used while idle
//	rdmaperf -c host -test dial -P 20              # bursts of 20 dials, each with one round trip and Close
//	rdmaperf -c host -test http -P 20              # 20 HTTP/1.1 clients on http.DefaultTransport's settings
//	rdmaperf -c host -test clients -P 1000 -t 8    # 1,000 connections, one 64 B request outstanding on each
//	rdmaperf -c host -test write-lat -l 64         # one-sided: RDMA WRITE ping-pong (also read-lat, write-bw, read-bw)
//	rdmaperf -c host -test dgram-lat               # datagram ping-pong over a PacketConn (-net udp: Go's UDP)
//	rdmaperf -c host -test dgram-rate -batch 32    # 64 B datagrams, 32 per WriteBatch (also dgram-bw)
//	rdmaperf -local -addr 10.77.0.1:0 -test lat    # both ends in one process
//	rdmaperf -render results.json                  # bench JSON to markdown
//
// iperf3's flags work as its users type them: -c host without a port
// connects to 5301, the server's default; -t SECONDS (or a duration such as
// 500ms) is -duration, -P is -conns, -l is -size, -J is -json; -R reverses
// a bw or rate test (the server writes, the client counts what arrives);
// -i SECONDS prints what moved in each interval of a bw or rate test
// (default 1; 0: none), measured at the client: the bytes its Writes
// accepted, or, reverse, the bytes it received. With -json the intervals
// go into the JSON document instead.
//
// -net tcp runs the same tests over Go's TCP on the same addresses, for
// comparison. Latency is reported as half the round trip (p50, p99 and
// average, in µs), as ib_send_lat does; throughput in MB/s (1 MB = 1e6
// bytes) of one direction; message rate in messages/s summed over the
// connections. -test dial times what a client that dials, asks and hangs
// up pays: Dial, the first round trip and Close, one connection at a time
// or, with -P N, in bursts of N at once (p50, p99 and average of a dial or
// burst, in µs; connections per second). -test http times GET requests of
// -P clients on one http.Client with http.DefaultTransport's settings
// (requests per second; p50 and p99 of a request, in µs). -test clients
// dials -P connections to one echo server, -P at a time up to 64, then
// keeps one -size request outstanding on each for -t seconds: requests
// per second summed, p50 and p99 of a request, CPU per request (of this
// process: the client's, or with -local both ends'), the time to dial and
// to close them all, and how evenly they were served: the requests each
// connection completed in the window (fewest, 10th percentile, median,
// most, and how many got fewer than half the median).
//
// -json (-J) prints, instead of a sentence, one JSON document on one line
// in the shape of iperf3 -J's, so that what parses iperf3's JSON parses
// it: "start" (connected, version, system_info, timestamp, connecting_to,
// test_start), "intervals" and "end" with iperf3's names and types, an
// "error" string when the test failed, and, last, "rdmaperf": the test's
// own record (impl, workload, size, conns, metrics, error, the intervals
// in MB/s, stats), which bench/run.sh collects and -render reads. Every
// test has start (test_start's protocol is TCP, RDMA, UDP or RDMA UD;
// connected numbers the connections from 1 as socket, and is empty for
// dial and http, whose connections come and go) and end's
// cpu_utilization_percent: the client process's CPU time over the test's
// window, in percent of one CPU (with -local both ends'; remote_* are 0,
// the server does not report its own). Only the throughput tests fill
// intervals and end's streams and sums: bw and rate (intervals with -i,
// per connection), copy, write-bw and read-bw as iperf3's TCP tests do
// (sum_sent, sum_received; reverse for -R and read-bw), dgram-rate and
// dgram-bw as its UDP tests do (sum, sum_sent, sum_received: what the
// sink received, lost_packets, lost_percent; jitter is not measured and
// is 0). Latency, setup, idle, clients, atomic and dgram-lat tests have
// intervals [] and no sums, since their bytes per second would read as a
// throughput never measured: their figures are the record's metrics.
//
// The one-sided tests (-net rdma only) move -size bytes between registered
// regions with RDMA WRITE and READ (rdma.RemoteRegion), as perftest's
// ib_write_lat, ib_read_lat, ib_write_bw and ib_read_bw do: see
// onesided.go.
//
// The datagram tests send -size byte datagrams over rdma.PacketConn (RDMA
// unreliable datagrams) or, with -net udp, over Go's UDP on the same
// addresses: dgram-lat is a ping-pong (half the round trip, as
// ib_send_lat -c UD reports; lost round trips are counted, not timed),
// dgram-rate and dgram-bw a one-way blast, -batch datagrams per WriteBatch
// (one WriteTo each with -batch 1), reporting both the rate sent and the
// rate that arrived at the server, and the share lost: see dgram.go.
//
// The client tells the server what to do with a small header at the start
// of each connection, so one server serves every test.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma"
)

// Result is one test's outcome; it is also the record bench/run.sh collects
// (with results of the peer tools in the same shape) and -render reads.
type Result struct {
	Impl     string             `json:"impl"`     // who measured: "rdmaperf/rdma", "perftest", ...
	Workload string             `json:"workload"` // lat, bw, rate, idle, copy, dial or http
	Size     int                `json:"size,omitempty"`
	Conns    int                `json:"conns,omitempty"`
	Metrics  map[string]float64 `json:"metrics,omitempty"`
	Error    string             `json:"error,omitempty"`
	// Intervals are a bw or rate test's progress reports (-i), with -json.
	Intervals []Interval `json:"intervals,omitempty"`
	// Stats are the client connections' counters summed (-stats, rdma).
	Stats *rdma.ConnStats `json:"stats,omitempty"`
	Round int             `json:"round,omitempty"` // set by bench/run.sh, which repeats every test
}

// config is the command line, parsed and checked.
type config struct {
	server, local bool
	connect       string // -c as given
	target        string // -c with the default port added
	render, addr  string
	netw, test    string
	workload      string // what runs: -test, or idle with -idle
	copyLen       int64
	plain         bool
	size, count   int
	conns, warmup int
	duration      time.Duration
	interval      time.Duration
	idle          time.Duration
	reverse       bool
	asJSON        bool
	verbose       bool
	stats         bool
	tail          bool
	messages      bool
	bufSize       int
	sdepth        int
	rdepth        int
	poll          rdma.PollMode
	spin          time.Duration
	cpuProfile    string
	noDelay       bool
	keepConns     bool
	batch         int
	perConn       string
}

// seconds is a flag of a duration given as iperf3 does, in seconds ("10",
// "0.5"), or as Go does ("500ms").
type seconds struct{ d *time.Duration }

func (s seconds) String() string {
	if s.d == nil {
		return ""
	}
	return s.d.String()
}

func (s seconds) Set(v string) error {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		*s.d = time.Duration(f * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("want seconds (10, 0.5) or a duration (500ms)")
	}
	*s.d = d
	return nil
}

// errUsage is a command line that parsed but makes no sense; the message
// has said why.
var errUsage = errors.New("usage")

// parseArgs parses and checks the command line (without the program name).
// Errors of flag syntax are flag's (flag.ErrHelp for -h), already printed
// to out with the usage; others say what is wrong.
func parseArgs(args []string, out io.Writer) (*config, error) {
	cfg := &config{duration: 5 * time.Second, interval: time.Second}
	fs := flag.NewFlagSet("rdmaperf", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.BoolVar(&cfg.server, "s", false, "run a server")
	fs.StringVar(&cfg.connect, "c", "", "run a client against the server at `host[:port]` (default port "+defaultPort+", the server's)")
	fs.BoolVar(&cfg.local, "local", false, "run a server and a client in this process (listening on -addr)")
	fs.StringVar(&cfg.render, "render", "", "print the bench results `file` (JSON) as a markdown table and exit")
	fs.StringVar(&cfg.addr, "addr", "", "listen `address` (default :"+defaultPort+" for -s; $RDMA_TEST_ADDR:0 for -local)")
	fs.StringVar(&cfg.netw, "net", "rdma", "transport: rdma (this library) or tcp (Go's net, for comparison); udp: the datagram tests over Go's UDP (a server of tcp or udp serves them)")
	fs.StringVar(&cfg.test, "test", "lat", "client test: lat (ping-pong latency), bw (one-way throughput), rate (message rate), copy (io.Copy of a file to the connection, and to io.Discard at the server), dial (Dial, first round trip, Close), clients (-P connections, one request outstanding on each, with the spread of requests per connection), http (HTTP/1.1 GETs of -size bytes), or one-sided RDMA between registered regions: write-lat (WRITE ping-pong), read-lat, write-bw, read-bw, atomic-lat (fetch-and-add), atomic-rate; or datagrams: dgram-lat (ping-pong), dgram-rate, dgram-bw (one-way, counted at the server)")
	fs.Int64Var(&cfg.copyLen, "bytes", 1<<30, "copy: the file's size in bytes")
	fs.BoolVar(&cfg.plain, "plain", false, "copy: hide the connection's ReadFrom and WriteTo, so io.Copy goes through its own buffers")
	fs.IntVar(&cfg.size, "size", 0, "message (write) size in bytes (default 64 for lat and rate, 65536 for bw)")
	fs.IntVar(&cfg.count, "n", 0, "round trips (lat), writes per connection (bw, rate), dials or bursts (dial) or requests per client (http); 0: run for -duration")
	fs.Var(seconds{&cfg.duration}, "duration", "how long to run when -n is 0: `seconds` or a duration (500ms)")
	fs.IntVar(&cfg.conns, "conns", 1, "parallel connections (bw, rate), connections dialed at once (dial) or concurrent clients (http, clients)")
	fs.BoolVar(&cfg.reverse, "R", false, "bw, rate: reverse, the server sends and the client receives (iperf3)")
	fs.Var(seconds{&cfg.interval}, "i", "bw, rate: `seconds` between progress reports of what moved (iperf3; 0: none)")
	fs.IntVar(&cfg.warmup, "warmup", 100, "unmeasured round trips before a latency test (dial, http: above 0, one unmeasured dial or request first)")
	fs.DurationVar(&cfg.idle, "idle", 0, "instead of -test: hold one connection idle this long and report the CPU time used")
	fs.BoolVar(&cfg.asJSON, "json", false, "print the result as one JSON document on one line, shaped as iperf3 -J's (start, intervals, end; sums for the throughput tests only), with rdmaperf's own record under the key \"rdmaperf\"")
	fs.BoolVar(&cfg.verbose, "v", false, "server: log every connection and error")
	fs.BoolVar(&cfg.tail, "tail", false, "lat: split each round trip into its Write and its Read, note parks and GC cycles, and print how the round trips above the 99th percentile differ from all of them, with the Go scheduler's latencies (to stderr)")
	fs.BoolVar(&cfg.stats, "stats", false, "rdma client: print the connections' counters (Conn.Stats) summed, and the devices' totals")
	fs.BoolVar(&cfg.messages, "messages", false, "rdma: message-oriented Reads at both ends (Options.Messages): every Write travels as a message of its own, never gathered with others; a rate test then reports workload rate-msg")
	fs.IntVar(&cfg.bufSize, "buffer", 0, "rdma: per-connection buffer size in bytes (0: library default)")
	fs.IntVar(&cfg.sdepth, "sdepth", 0, "rdma: data messages in flight per connection (0: library default)")
	fs.IntVar(&cfg.rdepth, "rdepth", 0, "rdma: receives posted per connection (0: library default)")
	poll := fs.String("poll", "adaptive", "rdma: how a waiting Read/Write learns of completions: adaptive (spin, then park), busy (spin) or event (park)")
	fs.DurationVar(&cfg.spin, "spin", 0, "rdma: with -poll adaptive, how long a waiting Read/Write polls before it parks (0: library default, 50µs, longer while recent waits were short)")
	fs.IntVar(&cfg.batch, "batch", 1, "dgram-rate, dgram-bw: datagrams per WriteBatch (rdma: PacketConn.WriteBatch; udp: golang.org/x/net's, sendmmsg); 1: one WriteTo each")
	fs.BoolVar(&cfg.keepConns, "keep", false, "http: the README's Transport, which keeps an idle connection for each of the -P clients (MaxIdleConnsPerHost), instead of http.DefaultTransport's two; reports workload http-kept")
	fs.BoolVar(&cfg.noDelay, "nodelay", false, "rdma client: SetNoDelay(true) on every connection: a small Write goes out at once even while the peer is behind (Go's TCP connections have it on already)")
	fs.StringVar(&cfg.perConn, "perconn", "", "clients: write each connection's requests in the window to `file`, a line each in dial order: index, local address, requests completed in the window, all requests answered, slowest µs, then the requests completed in each second of the window")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write the process's CPU profile (runtime/pprof) to `file` when the client's test ends, or when the server is stopped by SIGINT or SIGTERM")
	// iperf3's names for the same settings, for its users' fingers.
	fs.Var(seconds{&cfg.duration}, "t", "alias of -duration (iperf3): `seconds`")
	fs.IntVar(&cfg.conns, "P", cfg.conns, "alias of -conns (iperf3)")
	fs.IntVar(&cfg.size, "l", cfg.size, "alias of -size (iperf3)")
	fs.BoolVar(&cfg.asJSON, "J", cfg.asJSON, "alias of -json (iperf3)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: rdmaperf -s [-addr host:port] | -c host[:port] [options] | -local [-addr ip:port] [options] | -render results.json\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	bad := func(format string, a ...any) (*config, error) {
		fmt.Fprintf(out, "rdmaperf: "+format+"\n", a...)
		return nil, errUsage
	}
	if fs.NArg() > 0 {
		return bad("unexpected argument %q", fs.Arg(0))
	}
	if cfg.render != "" {
		return cfg, nil
	}
	modes := 0
	for _, on := range []bool{cfg.server, cfg.connect != "", cfg.local} {
		if on {
			modes++
		}
	}
	if modes != 1 {
		return bad("need one of -s, -c, -local or -render (-h for help)")
	}
	var err error
	if cfg.poll, err = rdma.ParsePollMode(*poll); err != nil {
		return bad("%v", err)
	}
	if cfg.server {
		return cfg, nil
	}
	cfg.target = withDefaultPort(cfg.connect)
	cfg.workload = cfg.test
	if cfg.idle > 0 {
		cfg.workload = "idle"
	}
	if cfg.size == 0 {
		cfg.size = 64
		if cfg.workload == "bw" || strings.HasSuffix(cfg.workload, "-bw") {
			cfg.size = 64 << 10
		}
		if cfg.workload == "dgram-bw" {
			cfg.size = maxDatagram
		}
	}
	switch {
	case cfg.size < 1 || cfg.size > maxMsgSize:
		return bad("-size %d outside [1, %d]", cfg.size, maxMsgSize)
	case isDgram(cfg.workload) && cfg.size > maxDatagram:
		return bad("-size %d: a datagram has at most %d bytes", cfg.size, maxDatagram)
	case isDgram(cfg.workload) && cfg.netw == "tcp":
		return bad("-test %s sends datagrams: -net rdma or udp", cfg.workload)
	case cfg.netw == "udp" && !isDgram(cfg.workload):
		return bad("-net udp runs the datagram tests (dgram-lat, dgram-rate, dgram-bw), not %s", cfg.workload)
	case cfg.batch < 1:
		return bad("-batch must be at least 1")
	case isDgram(cfg.workload) && cfg.conns != 1:
		return bad("-test %s runs on one datagram end point: no -conns", cfg.workload)
	case cfg.conns < 1:
		return bad("-conns must be at least 1")
	case cfg.count < 0 || cfg.warmup < 0:
		return bad("-n and -warmup must not be negative")
	case cfg.count == 0 && cfg.duration <= 0:
		return bad("need -n or a positive -duration")
	case cfg.interval < 0:
		return bad("-i must not be negative")
	case cfg.reverse && cfg.workload != "bw" && cfg.workload != "rate":
		return bad("-R reverses -test bw or rate, not %s", cfg.workload)
	case isOneSided(cfg.workload) && cfg.netw != "rdma":
		return bad("-test %s is one-sided RDMA: -net rdma only", cfg.workload)
	case cfg.workload == "clients" && cfg.count > 0:
		return bad("-test clients runs for -t seconds: no -n")
	case cfg.perConn != "" && cfg.workload != "clients":
		return bad("-perconn is for -test clients")
	case cfg.workload == "write-lat" && (cfg.size < 8 || cfg.size%8 != 0):
		return bad("-test write-lat polls the block's last 8 bytes: -size must be a multiple of 8")
	}
	return cfg, nil
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("rdmaperf: ")
	cfg, err := parseArgs(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		os.Exit(2)
	}
	if cfg.render != "" {
		if err := renderFile(os.Stdout, cfg.render); err != nil {
			log.Fatal(err)
		}
		return
	}
	opts := rdma.Options{BufferSize: cfg.bufSize, SendDepth: cfg.sdepth, RecvDepth: cfg.rdepth, Poll: cfg.poll, SpinTime: cfg.spin, Messages: cfg.messages}
	tr, err := newTransport(cfg.netw, opts)
	if err != nil {
		log.Fatal(err)
	}
	tr.keep = cfg.stats
	tr.noDelay = cfg.noDelay

	if cfg.server {
		addr := cfg.addr
		if addr == "" {
			addr = ":" + defaultPort
		}
		ln, err := tr.listen(addr)
		if err != nil {
			log.Fatal(err)
		}
		stop := func() {}
		if cfg.cpuProfile != "" {
			if stop, err = startProfile(cfg.cpuProfile); err != nil {
				log.Fatal(err)
			}
		}
		// A server runs until it is stopped: the profile is written then,
		// and an RDMA listener's counters (refusals by reason, evictions)
		// are printed, then the signal is raised again, so that the
		// server ends as it would have without them.
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		go func() {
			s := <-sig
			stop()
			if rl, ok := ln.(*rdma.Listener); ok {
				log.Printf("listener: %s", listenerCounters(rl.Stats()))
			}
			signal.Reset(s)
			syscall.Kill(os.Getpid(), s.(syscall.Signal))
		}()
		log.Printf("%s server listening on %s", tr.name, ln.Addr())
		log.Fatal(serve(ln, cfg.verbose))
	}

	target := cfg.target
	if cfg.local {
		addr := cfg.addr
		if addr == "" {
			a := os.Getenv("RDMA_TEST_ADDR")
			if a == "" {
				log.Fatal("-local needs -addr (an address of an RDMA interface, port 0 for any)")
			}
			addr = net.JoinHostPort(a, "0")
		}
		ln, err := tr.listen(addr)
		if err != nil {
			log.Fatal(err)
		}
		defer ln.Close()
		go func() {
			if err := serve(ln, cfg.verbose); err != nil {
				log.Fatal(err)
			}
		}()
		target = ln.Addr().String()
	}

	workload := cfg.workload
	res := Result{Impl: "rdmaperf/" + tr.name, Workload: workload, Size: cfg.size, Conns: cfg.conns}
	if workload == "rate" && cfg.messages && tr.name == "rdma" {
		// Not the gathered rate: a row of its own (one message per Write,
		// as perftest and rstream post them).
		res.Workload = "rate-msg"
		if cfg.noDelay {
			res.Workload = "rate-msg-nodelay"
		}
	}
	if workload == "http" && cfg.keepConns {
		res.Workload = "http-kept"
	}
	var obs *observed
	if cfg.asJSON {
		obs = &observed{}
	}
	r := &run{
		keepConns: cfg.keepConns,
		copyLen:   cfg.copyLen,
		plain:     cfg.plain,
		dial:      func() (net.Conn, error) { return tr.dial(target) },
		size:      cfg.size,
		count:     cfg.count,
		duration:  cfg.duration,
		conns:     cfg.conns,
		warmup:    cfg.warmup,
		batch:     cfg.batch,
		rdma:      tr.name == "rdma",
		reverse:   cfg.reverse,
		interval:  cfg.interval,
		obs:       obs,
		// Called from one goroutine, and never after stream returns.
		report: func(iv Interval) {
			if cfg.asJSON {
				res.Intervals = append(res.Intervals, iv)
			} else {
				fmt.Println(iv)
			}
		},
	}
	if cfg.perConn != "" {
		f, err := os.Create(cfg.perConn)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		r.perConn = func(i int, addr string, s clientSample) {
			slowest := time.Duration(0)
			for _, d := range s.lat {
				slowest = max(slowest, d)
			}
			fmt.Fprintf(f, "%d %s %d %d %.0f", i, addr, s.done, len(s.lat), slowest.Seconds()*1e6)
			for _, n := range s.perSecond {
				fmt.Fprintf(f, " %d", n)
			}
			fmt.Fprintln(f)
		}
	}
	if cfg.tail {
		r.tail = func(s string) { fmt.Fprintln(os.Stderr, s) }
	}
	if tr.name == "rdma" && cfg.poll != rdma.PollAdaptive {
		res.Impl += " " + cfg.poll.String()
	}
	if workload == "copy" && cfg.plain {
		res.Impl += " plain"
	}
	if cfg.noDelay && tr.name == "rdma" && res.Workload != "rate-msg-nodelay" {
		res.Impl += " nodelay"
	}
	if cfg.reverse {
		res.Impl += " reverse"
	}
	if cfg.batch > 1 && isDgram(workload) && workload != "dgram-lat" {
		res.Impl += " batch"
	}
	stopProfile := func() {}
	if cfg.cpuProfile != "" {
		if stopProfile, err = startProfile(cfg.cpuProfile); err != nil {
			log.Fatal(err)
		}
	}
	cgo0 := runtime.NumCgoCall()
	began := time.Now()
	switch workload {
	case "lat":
		res.Conns = 1
		res.Metrics, err = r.latency()
	case "bw", "rate":
		res.Metrics, err = r.stream()
	case "idle":
		res.Conns = 1
		res.Metrics, err = r.idle(cfg.idle)
	case "copy":
		res.Conns, res.Size = 1, int(min(cfg.copyLen, maxMsgSize))
		res.Metrics, err = r.copyFile()
	case "dial":
		// No payload is measured: the round trip is the header and the
		// ready byte whatever -size is.
		res.Size = 0
		res.Metrics, err = r.dials()
	case "http":
		res.Metrics, err = r.httpLoad()
	case "clients":
		res.Metrics, err = r.clients()
	case "write-lat", "read-lat", "write-bw", "read-bw", "atomic-lat", "atomic-rate":
		res.Conns = 1
		res.Metrics, err = r.oneSided(workload)
	case "dgram-lat":
		res.Metrics, err = r.dgramLatency()
	case "dgram-rate", "dgram-bw":
		res.Metrics, err = r.dgramStream()
		if res.Metrics != nil && cfg.batch > 1 {
			res.Metrics["batch"] = float64(cfg.batch)
		}
	default:
		log.Fatalf("unknown -test %q (lat, bw, rate, copy, dial, http, clients, write-lat, read-lat, write-bw, read-bw, atomic-lat, atomic-rate, dgram-lat, dgram-rate or dgram-bw)", workload)
	}
	stopProfile()
	if err != nil {
		res.Error = err.Error()
	} else if tr.name == "rdma" && workload == "idle" {
		// What each connection pins, whatever its traffic: with the
		// idle figure, the cost of a connection that is kept open.
		mem, err := opts.RegisteredMemory()
		if err != nil {
			log.Fatal(err)
		}
		res.Metrics["reg_kib"] = float64(mem) / 1024
	}
	if cfg.stats && tr.name == "rdma" {
		s := tr.stats()
		res.Stats = &s
		// What carries over to a NIC without system calls: the library's
		// crossings into C (posts, polls, CM calls; the dial's few
		// included) and posts, per message this client sent.
		if workload == "clients" && res.Metrics != nil && res.Metrics["count"] > 0 {
			// How the client's waits for answers ended, per request.
			res.Metrics["parks_per_req"] = float64(s.Parks) / res.Metrics["count"]
			res.Metrics["spins_per_req"] = float64(s.Spins) / res.Metrics["count"]
		}
		if s.MessagesSent > 0 && res.Metrics != nil {
			res.Metrics["cgo_per_msg"] = float64(runtime.NumCgoCall()-cgo0) / float64(s.MessagesSent)
			res.Metrics["posts_per_msg"] = float64(s.SendPosts) / float64(s.MessagesSent)
		}
	}
	if cfg.asJSON {
		b, _ := json.Marshal(iperfReport(cfg, target, began, res, obs))
		fmt.Println(string(b))
	} else {
		fmt.Println(describe(res))
		if res.Stats != nil {
			fmt.Printf("client stats: %+v\ndevices: %+v\n", *res.Stats, rdma.Devices())
		}
	}
	if err != nil {
		os.Exit(1)
	}
}

// transport hides the difference between this library and Go's TCP.
type transport struct {
	name   string
	listen func(addr string) (net.Listener, error)
	dial   func(addr string) (net.Conn, error)

	// keep says to remember the connections dialed, for -stats; not
	// otherwise, since a dial test makes thousands.
	keep    bool
	noDelay bool // rdma: SetNoDelay(true) on every connection dialed
	mu      sync.Mutex
	conns   []*rdma.Conn // dialed (rdma), with keep
}

// stats sums the counters of every rdma connection dialed.
func (t *transport) stats() rdma.ConnStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	var sum rdma.ConnStats
	for _, c := range t.conns {
		s := c.Stats()
		sum.BytesWritten += s.BytesWritten
		sum.BytesRead += s.BytesRead
		sum.MessagesSent += s.MessagesSent
		sum.MessagesReceived += s.MessagesReceived
		sum.CreditMessagesSent += s.CreditMessagesSent
		sum.SendPosts += s.SendPosts
		sum.CreditWaits += s.CreditWaits
		sum.CreditWaitTime += s.CreditWaitTime
		sum.CompletionErrors += s.CompletionErrors
		sum.RegisteredBytes += s.RegisteredBytes
		sum.KeepAliveProbes += s.KeepAliveProbes
		sum.Spins += s.Spins
		sum.Parks += s.Parks
	}
	return sum
}

func newTransport(name string, opts rdma.Options) (*transport, error) {
	const dialTimeout = 30 * time.Second
	switch name {
	case "rdma":
		lc := rdma.ListenConfig{Options: opts}
		d := rdma.Dialer{Timeout: dialTimeout, Options: opts}
		t := &transport{
			name:   name,
			listen: func(a string) (net.Listener, error) { return lc.Listen(context.Background(), "rdma", a) },
		}
		t.dial = func(a string) (net.Conn, error) {
			c, err := d.Dial("rdma", a)
			if err == nil && t.noDelay {
				if err := c.(*rdma.Conn).SetNoDelay(true); err != nil {
					c.Close()
					return nil, err
				}
			}
			if err == nil && t.keep {
				t.mu.Lock()
				t.conns = append(t.conns, c.(*rdma.Conn))
				t.mu.Unlock()
			}
			return c, err
		}
		return t, nil
	case "tcp", "udp":
		// udp: the datagram tests' datagrams over UDP, their connection
		// over TCP.
		d := net.Dialer{Timeout: dialTimeout}
		return &transport{
			name:   name,
			listen: func(a string) (net.Listener, error) { return net.Listen("tcp", a) },
			dial:   func(a string) (net.Conn, error) { return d.Dial("tcp", a) },
		}, nil
	}
	return nil, errors.New("-net must be rdma, tcp or udp")
}

// describe is the one-line, human-readable form of a result.
func describe(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Impl, r.Workload)
	if r.Workload != "dial" {
		fmt.Fprintf(&b, " %d B", r.Size)
	}
	if r.Conns > 1 {
		fmt.Fprintf(&b, " x %d conns", r.Conns)
	}
	m := r.Metrics
	switch {
	case r.Error != "":
		fmt.Fprintf(&b, ": error: %s", r.Error)
	case r.Workload == "dial":
		what, setup := "dial", "Dial alone"
		if r.Conns > 1 {
			what, setup = "burst", "until the last Dial returned"
		}
		fmt.Fprintf(&b, ": Dial + round trip + Close p50 %.0f µs, p99 %.0f µs, avg %.0f µs a %s (%s: p50 %.0f µs); %.0f conn/s (%.0f connections in %.2f s, %.2f CPU s)",
			m["p50_us"], m["p99_us"], m["avg_us"], what, setup, m["setup_us"], m["conn_s"], m["count"], m["seconds"], m["cpu_s"])
	case r.Workload == "http" || r.Workload == "http-kept":
		fmt.Fprintf(&b, ": %.0f req/s, p50 %.0f µs, p99 %.0f µs, avg %.0f µs a request (%.0f requests, %.0f connections dialed, in %.2f s, %.2f CPU s)",
			m["req_s"], m["p50_us"], m["p99_us"], m["avg_us"], m["count"], m["dials"], m["seconds"], m["cpu_s"])
	case r.Workload == "clients":
		fmt.Fprintf(&b, ": %.0f req/s, p50 %.0f µs, p99 %.0f µs, max %.0f µs a request, %.1f CPU µs a request; requests per connection in %.2f s: min %.0f, p10 %.0f, median %.0f, max %.0f, %.0f under half the median",
			m["req_s"], m["p50_us"], m["p99_us"], m["max_us"], m["cpu_us_per_req"], m["seconds"], m["min_req"], m["p10_req"], m["median_req"], m["max_req"], m["starved"])
		if m["unanswered"] > 0 {
			fmt.Fprintf(&b, ", %.0f unanswered", m["unanswered"])
		}
		fmt.Fprintf(&b, "; dialing all %.3f s, closing all %.3f s", m["dial_s"], m["close_s"])
		if v, ok := m["release_s"]; ok {
			fmt.Fprintf(&b, ", device resources released %.2f s later", v)
		}
		if v, ok := m["parks_per_req"]; ok {
			fmt.Fprintf(&b, "; %.2f parks, %.2f spins a request", v, m["spins_per_req"])
		}
	case r.Workload == "lat" || r.Workload == "write-lat":
		fmt.Fprintf(&b, ": one-way p50 %.2f µs, p99 %.2f µs, avg %.2f µs (%.0f round trips in %.2f s)",
			m["p50_us"], m["p99_us"], m["avg_us"], m["count"], m["seconds"])
	case r.Workload == "dgram-lat":
		fmt.Fprintf(&b, ": one-way p50 %.2f µs, p99 %.2f µs, avg %.2f µs (%.0f round trips in %.2f s, %.0f lost)",
			m["p50_us"], m["p99_us"], m["avg_us"], m["count"], m["seconds"], m["lost"])
	case r.Workload == "dgram-rate" || r.Workload == "dgram-bw":
		fmt.Fprintf(&b, ": sent %.2f MB/s, %.0f msg/s; received %.2f MB/s, %.0f msg/s (%.0f of %.0f datagrams, %.2f%% lost; %.2f s, %.2f CPU s)",
			m["mb_s"], m["msg_s"], m["recv_mb_s"], m["recv_msg_s"], m["recv_count"], m["count"], m["loss_pct"], m["seconds"], m["cpu_s"])
	case r.Workload == "read-lat" || r.Workload == "atomic-lat":
		what := "READ"
		if r.Workload == "atomic-lat" {
			what = "fetch-and-add"
		}
		fmt.Fprintf(&b, ": p50 %.2f µs, p99 %.2f µs, avg %.2f µs per %s (%.0f in %.2f s)",
			m["p50_us"], m["p99_us"], m["avg_us"], what, m["count"], m["seconds"])
	case r.Workload == "atomic-rate":
		fmt.Fprintf(&b, ": %.0f fetch-and-adds/s (%.0f in %.2f s, %.2f CPU s)", m["msg_s"], m["count"], m["seconds"], m["cpu_s"])
	case r.Workload == "copy":
		fmt.Fprintf(&b, ": %.2f MB/s (%.2f s, %.2f CPU s)", m["mb_s"], m["seconds"], m["cpu_s"])
	case r.Workload == "idle":
		fmt.Fprintf(&b, ": %.3f CPU s in %.2f s idle (%.2f%% of one CPU)", m["cpu_s"], m["seconds"], m["cpu_pct"])
		if v, ok := m["reg_kib"]; ok {
			fmt.Fprintf(&b, ", %.0f KiB registered per connection", v)
		}
	default:
		fmt.Fprintf(&b, ": %.2f MB/s, %.0f msg/s (%.0f writes in %.2f s, %.2f CPU s)",
			m["mb_s"], m["msg_s"], m["count"], m["seconds"], m["cpu_s"])
	}
	return b.String()
}

// defaultPort is where a server listens unless told otherwise, and where a
// client connects when its -c has no port.
const defaultPort = "5301"

// withDefaultPort adds defaultPort to a host given without one: "10.0.0.1",
// "[fd00::1]" and "fd00::1" (an IPv6 address alone) all get it.
func withDefaultPort(hostport string) string {
	if hostport == "" {
		return ""
	}
	if _, _, err := net.SplitHostPort(hostport); err == nil {
		return hostport
	}
	host := strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
	return net.JoinHostPort(host, defaultPort)
}

// startProfile starts the process's CPU profile into file; stop ends it
// and closes the file.
func startProfile(file string) (stop func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			log.Print(err)
		}
	}, nil
}

// listenerCounters is a listener's counters on one line, the refusals
// by reason.
func listenerCounters(s rdma.ListenerStats) string {
	var b strings.Builder
	fmt.Fprintf(&b, "accepted %d, evicted %d, half-open %d", s.Accepted, s.Evicted, s.HalfOpen)
	for r := range rdma.NumRefuseReasons {
		if n := s.Refused[r]; n > 0 {
			fmt.Fprintf(&b, ", refused %d (%s)", n, r)
		}
	}
	return b.String()
}
