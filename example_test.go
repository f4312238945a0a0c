package rdma_test

import (
	"context"
	"expvar"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/goverbs/rdma"
)

// The examples but the last three need an RDMA device at 10.0.0.1, so they
// have no Output comments: go test compiles them but does not run them.

// Exporting a connection's counters and the devices' totals with expvar,
// so that they show under /debug/vars of a service's HTTP server.
func ExampleConn_Stats() {
	c, err := rdma.Dial("rdma", "10.0.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	expvar.Publish("rdma_conn", expvar.Func(func() any { return c.Stats() }))
	expvar.Publish("rdma_devices", expvar.Func(func() any { return rdma.Devices() }))
	s := c.Stats()
	fmt.Printf("%d bytes in %d messages; %d Writes waited for credit\n", s.BytesWritten, s.MessagesSent, s.CreditWaits)
}

// Logging a listener's refusals by reason, say once a minute: a count
// that grows says which limit the service runs into (the backlog, locked
// memory).
func ExampleListener_Stats() {
	ln, err := rdma.Listen("rdma", "10.0.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	st := ln.Stats()
	for r := range rdma.NumRefuseReasons {
		if n := st.Refused[r]; n > 0 {
			log.Printf("refused %d connection requests: %v", n, r)
		}
	}
	log.Printf("accepted %d, %d handshakes in progress", st.Accepted, st.HalfOpen)
}

// An echo server: every connection gets back what it sends.
func ExampleListen() {
	ln, err := rdma.Listen("rdma", "10.0.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func(c net.Conn) {
			defer c.Close()
			io.Copy(c, c)
		}(c)
	}
}

// A client of the echo server.
func ExampleDial() {
	c, err := rdma.Dial("rdma", "10.0.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if _, err := c.Write([]byte("hello")); err != nil {
		log.Fatal(err)
	}
	buf := make([]byte, len("hello"))
	if _, err := io.ReadFull(c, buf); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s\n", buf)
}

// HTTP over RDMA: the Transport dials with an rdma.Dialer. It asks for a
// "tcp" connection, so the dial function substitutes "rdma".
func ExampleDialer_DialContext() {
	d := &rdma.Dialer{Timeout: 5 * time.Second}
	// http.Transport dials network "tcp", which DialContext takes to mean
	// "rdma".
	client := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}

	// The URL's host is the server's RDMA address: the IP of its RDMA
	// interface (IPoIB or RoCE) and the port its rdma listener has.
	resp, err := client.Get("http://10.0.0.1:7471/")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %s", resp.Status, body)
}

// An HTTP server on an rdma listener.
func ExampleListenConfig_Listen() {
	lc := rdma.ListenConfig{Options: rdma.Options{BufferSize: 256 << 10}}
	ln, err := lc.Listen(context.Background(), "rdma", "10.0.0.1:7471")
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello over RDMA, %s\n", r.RemoteAddr)
	})
	srv := &http.Server{Handler: mux}
	log.Fatal(srv.Serve(ln))
}

// Options size each connection and choose how it waits. RegisteredMemory
// tells what a connection with them pins, for sizing a server that keeps
// many connections open.
func ExampleOptions() {
	opts := rdma.Options{
		BufferSize: 16 << 10,      // small messages: smaller rings
		RecvDepth:  32,            // more messages in flight per connection: no memory
		Poll:       rdma.PollBusy, // dedicated cores: spin instead of parking
	}
	mem, err := opts.RegisteredMemory()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d KiB registered per idle connection\n", mem>>10)
	// Output: 32 KiB registered per idle connection
}

// With FallbackTCP on both sides, a service runs where there is no RDMA
// (here: loopback, which no RDMA device serves), over TCP on the same
// address and port, and says so.
func ExampleDialer_fallbackTCP() {
	lc := rdma.ListenConfig{FallbackTCP: true}
	ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()

	d := rdma.Dialer{FallbackTCP: true}
	c, err := d.Dial("rdma", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	b := make([]byte, 5)
	io.ReadFull(c, b)
	fmt.Printf("over %s (RDMA: %v): %s\n", c.LocalAddr().Network(), rdma.IsRDMA(c), b)
	// Output: over tcp (RDMA: false): hello
}

// A client that dials many short-lived connections keeps more ready QPs
// per device than the default 256, so that its dials take one instead of
// creating their own (accepted connections always create theirs); the
// memory bound stays.
func ExampleSetDevicePool() {
	oldBytes, oldQPs := rdma.SetDevicePool(-1, 4096)
	defer rdma.SetDevicePool(oldBytes, oldQPs)
	fmt.Printf("up to %d MiB and 4096 QPs of closed connections kept per device (were %d QPs)\n", oldBytes>>20, oldQPs)
	// Output: up to 32 MiB and 4096 QPs of closed connections kept per device (were 256 QPs)
}
