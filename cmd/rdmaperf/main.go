// Command rdmaperf measures github.com/goverbs/rdma connections the way
// iperf measures TCP: a server on one host, a client on another.
//
//	rdmaperf -s [-addr host:port]                      # server
//	rdmaperf -c host:port -test lat -size 64 -n 10000  # ping-pong latency
//	rdmaperf -c host:port -test bw -size 65536 -duration 10s
//	rdmaperf -c host:port -test rate -conns 8          # 64 B message rate
//	rdmaperf -c host:port -idle 5s                     # CPU used while idle
//	rdmaperf -local -addr 10.77.0.1:0 -test lat        # both ends in one process
//	rdmaperf -render results.json                      # bench JSON to markdown
//
// -net tcp runs the same tests over Go's TCP on the same addresses, for
// comparison. Latency is reported as half the round trip (p50, p99 and
// average, in µs), as ib_send_lat does; throughput in MB/s (1 MB = 1e6
// bytes); message rate in messages/s summed over the connections. -json
// prints one JSON object per test instead of a sentence.
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
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/goverbs/rdma"
)

// Result is one test's outcome; it is also the record bench/run.sh collects
// (with results of the peer tools in the same shape) and -render reads.
type Result struct {
	Impl     string             `json:"impl"`     // who measured: "rdmaperf/rdma", "perftest", ...
	Workload string             `json:"workload"` // lat, bw, rate or idle
	Size     int                `json:"size,omitempty"`
	Conns    int                `json:"conns,omitempty"`
	Metrics  map[string]float64 `json:"metrics,omitempty"`
	Error    string             `json:"error,omitempty"`
	// Stats are the client connections' counters summed (-stats, rdma).
	Stats *rdma.ConnStats `json:"stats,omitempty"`
	Round int             `json:"round,omitempty"` // set by bench/run.sh, which repeats every test
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("rdmaperf: ")
	var (
		server   = flag.Bool("s", false, "run a server")
		connect  = flag.String("c", "", "run a client against the server at `host[:port]` (default port 5301, the server's)")
		local    = flag.Bool("local", false, "run a server and a client in this process (listening on -addr)")
		render   = flag.String("render", "", "print the bench results `file` (JSON) as a markdown table and exit")
		addr     = flag.String("addr", "", "listen `address` (default :5301 for -s; $RDMA_TEST_ADDR:0 for -local)")
		netw     = flag.String("net", "rdma", "transport: rdma (this library) or tcp (Go's net, for comparison)")
		test     = flag.String("test", "lat", "client test: lat (ping-pong latency), bw (one-way throughput), rate (message rate) or copy (io.Copy of a file to the connection, and to io.Discard at the server)")
		copyLen  = flag.Int64("bytes", 1<<30, "copy: the file's size in bytes")
		plain    = flag.Bool("plain", false, "copy: hide the connection's ReadFrom and WriteTo, so io.Copy goes through its own buffers")
		size     = flag.Int("size", 0, "message (write) size in bytes (default 64 for lat and rate, 65536 for bw)")
		count    = flag.Int("n", 0, "round trips (lat) or writes per connection (bw, rate); 0: run for -duration")
		duration = flag.Duration("duration", 5*time.Second, "how long to run when -n is 0")
		conns    = flag.Int("conns", 1, "parallel connections (bw, rate)")
		warmup   = flag.Int("warmup", 100, "unmeasured round trips before a latency test")
		idle     = flag.Duration("idle", 0, "instead of -test: hold one connection idle this long and report the CPU time used")
		asJSON   = flag.Bool("json", false, "print each result as a JSON object")
		verbose  = flag.Bool("v", false, "server: log every connection and error")
		stats    = flag.Bool("stats", false, "rdma client: print the connections' counters (Conn.Stats) summed, and the devices' totals")
		bufSize  = flag.Int("buffer", 0, "rdma: per-connection buffer size in bytes (0: library default)")
		sdepth   = flag.Int("sdepth", 0, "rdma: send buffers per connection (0: library default)")
		rdepth   = flag.Int("rdepth", 0, "rdma: receive buffers per connection (0: library default)")
		poll     = flag.String("poll", "adaptive", "rdma: how a waiting Read/Write learns of completions: adaptive (spin, then park), busy (spin) or event (park)")
		spin     = flag.Duration("spin", 0, "rdma: with -poll adaptive, how long a waiting Read/Write polls before it parks (0: library default, 50µs, longer while recent waits were short)")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: rdmaperf -s [-addr host:port] | -c host[:port] [options] | -local [-addr ip:port] [options] | -render results.json\n")
		flag.PrintDefaults()
	}
	// iperf3's names for the same settings, for its users' fingers.
	flag.DurationVar(duration, "t", *duration, "alias of -duration (iperf3)")
	flag.IntVar(conns, "P", *conns, "alias of -conns (iperf3)")
	flag.IntVar(size, "l", *size, "alias of -size (iperf3)")
	flag.BoolVar(asJSON, "J", *asJSON, "alias of -json (iperf3)")
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if *render != "" {
		if err := renderFile(os.Stdout, *render); err != nil {
			log.Fatal(err)
		}
		return
	}

	modes := 0
	for _, on := range []bool{*server, *connect != "", *local} {
		if on {
			modes++
		}
	}
	if modes != 1 {
		log.Print("need one of -s, -c, -local or -render")
		flag.Usage()
		os.Exit(2)
	}
	pm, err := rdma.ParsePollMode(*poll)
	if err != nil {
		log.Fatal(err)
	}
	opts := rdma.Options{BufferSize: *bufSize, SendDepth: *sdepth, RecvDepth: *rdepth, Poll: pm, SpinTime: *spin}
	tr, err := newTransport(*netw, opts)
	if err != nil {
		log.Fatal(err)
	}

	if *server {
		if *addr == "" {
			*addr = ":" + defaultPort
		}
		ln, err := tr.listen(*addr)
		if err != nil {
			log.Fatal(err)
		}
		log.Printf("%s server listening on %s", tr.name, ln.Addr())
		log.Fatal(serve(ln, *verbose))
	}

	target := withDefaultPort(*connect)
	if *local {
		if *addr == "" {
			a := os.Getenv("RDMA_TEST_ADDR")
			if a == "" {
				log.Fatal("-local needs -addr (an address of an RDMA interface, port 0 for any)")
			}
			*addr = net.JoinHostPort(a, "0")
		}
		ln, err := tr.listen(*addr)
		if err != nil {
			log.Fatal(err)
		}
		defer ln.Close()
		go func() {
			if err := serve(ln, *verbose); err != nil {
				log.Fatal(err)
			}
		}()
		target = ln.Addr().String()
	}

	workload := *test
	if *idle > 0 {
		workload = "idle"
	}
	if *size == 0 {
		*size = 64
		if workload == "bw" {
			*size = 64 << 10
		}
	}
	switch {
	case *size < 1 || *size > maxMsgSize:
		log.Fatalf("-size %d outside [1, %d]", *size, maxMsgSize)
	case *conns < 1:
		log.Fatal("-conns must be at least 1")
	case *count < 0 || *warmup < 0:
		log.Fatal("-n and -warmup must not be negative")
	case *count == 0 && *duration <= 0:
		log.Fatal("need -n or a positive -duration")
	}
	r := &run{
		copyLen:  *copyLen,
		plain:    *plain,
		dial:     func() (net.Conn, error) { return tr.dial(target) },
		size:     *size,
		count:    *count,
		duration: *duration,
		conns:    *conns,
		warmup:   *warmup,
	}
	res := Result{Impl: "rdmaperf/" + tr.name, Workload: workload, Size: *size, Conns: *conns}
	if tr.name == "rdma" && pm != rdma.PollAdaptive {
		res.Impl += " " + pm.String()
	}
	if workload == "copy" && *plain {
		res.Impl += " plain"
	}
	switch workload {
	case "lat":
		res.Conns = 1
		res.Metrics, err = r.latency()
	case "bw", "rate":
		res.Metrics, err = r.stream()
	case "idle":
		res.Conns = 1
		res.Metrics, err = r.idle(*idle)
	case "copy":
		res.Conns, res.Size = 1, int(min(*copyLen, maxMsgSize))
		res.Metrics, err = r.copyFile()
	default:
		log.Fatalf("unknown -test %q (lat, bw, rate or copy)", workload)
	}
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
	if *stats && tr.name == "rdma" {
		s := tr.stats()
		res.Stats = &s
	}
	if *asJSON {
		b, _ := json.Marshal(res)
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

	mu    sync.Mutex
	conns []*rdma.Conn // dialed (rdma), for -stats
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
		sum.CreditWaits += s.CreditWaits
		sum.CreditWaitTime += s.CreditWaitTime
		sum.CompletionErrors += s.CompletionErrors
		sum.RegisteredBytes += s.RegisteredBytes
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
			if err == nil {
				t.mu.Lock()
				t.conns = append(t.conns, c.(*rdma.Conn))
				t.mu.Unlock()
			}
			return c, err
		}
		return t, nil
	case "tcp":
		d := net.Dialer{Timeout: dialTimeout}
		return &transport{
			name:   name,
			listen: func(a string) (net.Listener, error) { return net.Listen("tcp", a) },
			dial:   func(a string) (net.Conn, error) { return d.Dial("tcp", a) },
		}, nil
	}
	return nil, errors.New("-net must be rdma or tcp")
}

// describe is the one-line, human-readable form of a result.
func describe(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %d B", r.Impl, r.Workload, r.Size)
	if r.Conns > 1 {
		fmt.Fprintf(&b, " x %d conns", r.Conns)
	}
	m := r.Metrics
	switch {
	case r.Error != "":
		fmt.Fprintf(&b, ": error: %s", r.Error)
	case r.Workload == "lat":
		fmt.Fprintf(&b, ": one-way p50 %.2f µs, p99 %.2f µs, avg %.2f µs (%.0f round trips in %.2f s)",
			m["p50_us"], m["p99_us"], m["avg_us"], m["count"], m["seconds"])
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
