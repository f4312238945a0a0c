// Command dns runs a miekg/dns server over RDMA datagrams, and queries it:
// the server's dns.Server takes an rdma.PacketConn as its PacketConn, and
// the client's dns.Conn wraps another (a few lines of adapter, below). One
// answer, of a few hundred records, is a datagram larger than the port's
// MTU: the PacketConn fragments it and reassembles it, as IP does UDP's.
//
//	go run . -addr 10.0.0.1:0
//
// The address must belong to an interface with an RDMA device. -server
// only serves (until interrupted); -client only queries the server at
// -addr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"time"

	"github.com/miekg/dns"

	"github.com/goverbs/rdma"
)

// names are the names the client asks for.
var names = []string{"db.example.", "pool.example.", "nowhere.example."}

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR")+":0", "the server's address: an RDMA interface's IP and a port (0 picks one)")
	local := flag.String("local", "", "with -client, the client's IP (empty: the host's one RDMA device)")
	serverOnly := flag.Bool("server", false, "only serve, until interrupted")
	clientOnly := flag.Bool("client", false, "only query the server at -addr")
	flag.Parse()
	if err := run(*addr, *local, *serverOnly, *clientOnly); err != nil {
		log.Fatal(err)
	}
}

func run(addr, local string, serverOnly, clientOnly bool) error {
	if clientOnly {
		server, err := rdma.ResolveAddr("rdma", addr)
		if err != nil {
			return err
		}
		return query(local, server)
	}
	srv, err := startServer(addr)
	if err != nil {
		return err
	}
	if serverOnly {
		fmt.Println("serving on", srv.addr())
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		<-ctx.Done()
		return srv.shutdown()
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.Join(err, srv.shutdown())
	}
	return errors.Join(query(host, srv.addr()), srv.shutdown())
}

// query asks server for each of names, from a PacketConn on local, and
// prints the answers.
func query(local string, server net.Addr) error {
	rs, err := newResolver(local, server)
	if err != nil {
		return err
	}
	defer rs.Close()
	for _, name := range names {
		before := rs.pc.Stats().BytesReceived
		r, rtt, err := rs.lookup(name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		size := rs.pc.Stats().BytesReceived - before // the datagram, as the PacketConn counted it
		fmt.Printf("%-17s %-8s %3d records, a datagram of %5d bytes, in %v\n", name, dns.RcodeToString[r.Rcode], len(r.Answer), size, rtt.Round(time.Microsecond))
	}
	return nil
}

// resolver queries one server from a PacketConn of its own.
type resolver struct {
	pc   *rdma.PacketConn
	conn *dns.Conn
	c    *dns.Client
}

func newResolver(local string, server net.Addr) (*resolver, error) {
	pc, err := rdma.ListenPacket("rdma", net.JoinHostPort(local, "0"))
	if err != nil {
		return nil, err
	}
	conn := &dns.Conn{Conn: serverConn{PacketConn: pc, server: server}}
	return &resolver{pc: pc, conn: conn, c: &dns.Client{Timeout: 5 * time.Second}}, nil
}

// lookup asks for name's A records, taking answers of up to 64 KiB.
func (rs *resolver) lookup(name string) (*dns.Msg, time.Duration, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.SetEdns0(dns.MaxMsgSize, false)
	return rs.c.ExchangeWithConn(m, rs.conn)
}

func (rs *resolver) Close() error { return rs.pc.Close() }

// serverConn is the net.Conn a dns.Conn needs to query one server over a
// PacketConn: reads take the server's datagrams only, writes go to it.
// It is a net.PacketConn too, as miekg/dns expects of a datagram
// connection (on any other net.Conn it frames messages as on TCP).
type serverConn struct {
	*rdma.PacketConn
	server net.Addr
}

func (c serverConn) Read(b []byte) (int, error) {
	for {
		n, from, err := c.ReadFrom(b)
		if err != nil || from.String() == c.server.String() {
			return n, err
		}
	}
}

func (c serverConn) Write(b []byte) (int, error) { return c.WriteTo(b, c.server) }

func (c serverConn) RemoteAddr() net.Addr { return c.server }
