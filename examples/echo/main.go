// Command echo shows this library beside Go's TCP on one address. It names
// the RDMA device that serves the address and the state of its port, then,
// for a few message sizes, measures over RDMA and over TCP:
//
//   - the round trip: one Write of the message, echoed back whole by the
//     server (the median, in µs);
//   - the one-way throughput: the client writes messages of that size for a
//     moment and the server counts what arrived (MB/s, 1 MB = 10^6 bytes;
//     data flows in one direction only, nothing is counted twice).
//
// Run it on a host with an RDMA device:
//
//	go run ./examples/echo -addr 10.77.0.1:0
//
// The address must belong to an interface with an RDMA device (a RoCE or
// IPoIB netdev, or one with a Soft-RoCE device on it); port 0 picks free
// ports. make demo runs it in the Soft-RoCE VM of testbed/vm.sh.
//
// Both transports go through the same code: rdma.Listen returns a
// net.Listener and rdma.Dialer.Dial a net.Conn, so only the two
// constructors differ.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/goverbs/rdma"
)

// The sizes measured: a small request, a page, and the library's default
// buffer size (the largest message it sends in one piece).
var sizes = []int{64, 4 << 10, 64 << 10}

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR")+":0", "listen address (an RDMA interface's IP and a port)")
	each := flag.Duration("time", 400*time.Millisecond, "how long each measurement runs")
	spin := flag.Duration("spin", 0, "how long a waiting Read polls before it parks (0: the default; negative: never)")
	flag.Parse()
	if err := run(*addr, *each, rdma.Options{SpinTime: *spin}); err != nil {
		log.Fatal(err)
	}
}

// transport is all that differs between RDMA and TCP here.
type transport struct {
	name   string
	listen func(addr string) (net.Listener, error)
	dial   func(addr string) (net.Conn, error)
}

// The server's first byte from a client says what to do with the
// connection.
const (
	modeEcho = 'e' // write every byte back: round trips
	modeSink = 's' // read to EOF, then answer with the byte count: throughput
)

func run(addr string, each time.Duration, opts rdma.Options) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	lc := rdma.ListenConfig{Options: opts}
	d := rdma.Dialer{Options: opts}
	transports := []transport{
		{
			name:   "RDMA",
			listen: func(a string) (net.Listener, error) { return lc.Listen(context.Background(), "rdma", a) },
			dial:   func(a string) (net.Conn, error) { return d.Dial("rdma", a) },
		},
		{
			name:   "TCP",
			listen: func(a string) (net.Listener, error) { return net.Listen("tcp", a) },
			dial:   func(a string) (net.Conn, error) { return net.Dial("tcp", a) },
		},
	}

	// One server per transport, on the same IP, and one long-lived echo
	// connection to each for the round trips.
	servers := make([]string, len(transports))
	echoes := make([]net.Conn, len(transports))
	for i, t := range transports {
		a := addr
		if t.name == "TCP" {
			a = net.JoinHostPort(host, "0") // the RDMA port may be taken for TCP
		}
		ln, err := t.listen(a)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		defer ln.Close()
		go serve(ln)
		servers[i] = ln.Addr().String()
		if echoes[i], err = open(t, servers[i], modeEcho); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		defer echoes[i].Close()
	}
	// The library knows its devices once a connection holds one.
	dev, software := device()
	fmt.Printf("%s serves %s\n", dev, host)
	fmt.Printf("servers: RDMA %s, TCP %s\n\n", servers[0], servers[1])

	fmt.Printf("%8s  %23s  %23s\n", "", "round trip, µs (median)", "one way, MB/s")
	fmt.Printf("%8s  %11s %11s  %11s %11s\n", "size", "RDMA", "TCP", "RDMA", "TCP")
	for _, size := range sizes {
		rtt := make([]time.Duration, len(transports))
		mbs := make([]float64, len(transports))
		for i, t := range transports {
			if rtt[i], err = roundTrip(echoes[i], size, each); err != nil {
				return fmt.Errorf("%s round trip of %d bytes: %w", t.name, size, err)
			}
		}
		for i, t := range transports {
			if mbs[i], err = oneWay(t, servers[i], size, each); err != nil {
				return fmt.Errorf("%s one way with %d-byte writes: %w", t.name, size, err)
			}
		}
		us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
		fmt.Printf("%8s  %11.1f %11.1f  %11.1f %11.1f\n", sizeName(size), us(rtt[0]), us(rtt[1]), mbs[0], mbs[1])
	}
	fmt.Println()
	if software {
		// Why TCP can win here: it never leaves the kernel for a local
		// address, while rxe does a NIC's work on the CPU.
		fmt.Println("On Soft-RoCE (RDMA in software, here in an emulated VM) each post is a system call and each packet (of the link's MTU) is built by the CPU, while TCP to a local address stays in the kernel: the figures show the library at work, not RDMA's speed; RDMA NICs are orders of magnitude faster.")
	} else {
		fmt.Println("A hardware RDMA device: these are its figures with this library, and Go's TCP on the same interface beside them.")
	}
	return nil
}

// device names the RDMA device the connections use and the state of its
// first port, read from sysfs ("unknown" where there is none, e.g. off
// Linux or in a container without /sys), and says whether it is a software
// device (Soft-RoCE, siw), whose figures say little about RDMA hardware.
func device() (desc string, software bool) {
	var names []string
	mtu := 0
	for _, d := range rdma.Devices() {
		names = append(names, d.Name)
		if mtu == 0 {
			mtu = d.ActiveMTU
		}
	}
	if len(names) == 0 {
		return "RDMA device unknown", false
	}
	name := names[0]
	dir := filepath.Join("/sys/class/infiniband", name)
	state := "unknown"
	if b, err := os.ReadFile(filepath.Join(dir, "ports", "1", "state")); err == nil {
		state = strings.TrimSpace(string(b)) // e.g. "4: ACTIVE"
		if _, s, ok := strings.Cut(state, ": "); ok {
			state = s
		}
	}
	desc = fmt.Sprintf("RDMA device %s (port 1 %s, link MTU %d", strings.Join(names, ", "), state, mtu)
	// Software devices sit under /sys/devices/virtual; their "parent" is
	// the netdev they run on.
	if p, err := filepath.EvalSymlinks(dir); err == nil && strings.Contains(p, "/devices/virtual/") {
		software = true
		desc += ", software RDMA"
		if b, err := os.ReadFile(filepath.Join(dir, "parent")); err == nil {
			desc += " on " + strings.TrimSpace(string(b))
		}
	}
	return desc + ")", software
}

// open dials and tells the server what the connection is for.
func open(t transport, addr string, mode byte) (net.Conn, error) {
	c, err := t.dial(addr)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{mode}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// roundTrip writes size bytes and reads them back, again and again for
// about d, and returns the median: under emulation a few round trips take
// far longer than the rest (a missed scheduler tick), and the median does
// not let them decide.
func roundTrip(c net.Conn, size int, d time.Duration) (time.Duration, error) {
	msg := make([]byte, size)
	rand.Read(msg)
	back := make([]byte, size)
	once := func() error {
		if _, err := c.Write(msg); err != nil {
			return err
		}
		_, err := io.ReadFull(c, back)
		return err
	}
	// A few unmeasured round trips first: buffers fault in, the transport
	// settles.
	for range 10 {
		if err := once(); err != nil {
			return 0, err
		}
	}
	var samples []time.Duration
	for start := time.Now(); time.Since(start) < d || len(samples) < 10; {
		t := time.Now()
		if err := once(); err != nil {
			return 0, err
		}
		samples = append(samples, time.Since(t))
	}
	if !bytes.Equal(msg, back) {
		return 0, errors.New("the echo came back different")
	}
	slices.Sort(samples)
	return samples[len(samples)/2], nil
}

// oneWay writes size-byte messages for about d on a fresh connection and
// returns the throughput in MB/s. The clock stops when the server has
// counted every byte, so data still queued at the sender does not count.
func oneWay(t transport, addr string, size int, d time.Duration) (float64, error) {
	c, err := open(t, addr, modeSink)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	msg := make([]byte, size)
	var sent uint64
	start := time.Now()
	for time.Since(start) < d {
		if _, err := c.Write(msg); err != nil {
			return 0, err
		}
		sent += uint64(size)
	}
	// Both *rdma.Conn and *net.TCPConn half-close: the server sees EOF,
	// the answer still comes back.
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return 0, err
	}
	var count [8]byte
	if _, err := io.ReadFull(c, count[:]); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	if got := binary.BigEndian.Uint64(count[:]); got != sent {
		return 0, fmt.Errorf("the server received %d bytes, %d were sent", got, sent)
	}
	return float64(sent) / elapsed.Seconds() / 1e6, nil
}

// serve answers each connection as its first byte asks.
func serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var mode [1]byte
			if _, err := io.ReadFull(c, mode[:]); err != nil {
				return
			}
			switch mode[0] {
			case modeEcho:
				io.Copy(c, c)
			case modeSink:
				n, err := io.Copy(io.Discard, c)
				if err != nil {
					return
				}
				var count [8]byte
				binary.BigEndian.PutUint64(count[:], uint64(n))
				c.Write(count[:])
			}
		}()
	}
}

func sizeName(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
