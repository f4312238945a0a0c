// Command fallback serves RDMA and TCP clients on one address and port.
// Its listener has ListenConfig.FallbackTCP: it accepts RDMA connections
// and TCP ones on the same port number, and listens over TCP alone where
// no RDMA device serves the address. Two clients dial it: one with
// Dialer.FallbackTCP, which connects over RDMA where both hosts have it
// and over TCP otherwise, and one with net.Dial, as a host without RDMA
// would. The server greets each with the transport it sees (rdma.IsRDMA),
// and each client prints that beside its own.
//
//	go run ./examples/fallback -addr 10.0.0.1:0   # an RDMA interface: one client over each
//	go run ./examples/fallback -addr 127.0.0.1:0  # no RDMA device: both over TCP
//
// -server only serves (until interrupted); -client only runs the clients
// against the server at -addr.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/goverbs/rdma"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "the server's address and port (0 picks one)")
	serverOnly := flag.Bool("server", false, "only serve, until interrupted")
	clientOnly := flag.Bool("client", false, "only run the clients, against the server at -addr")
	flag.Parse()
	if err := run(*addr, *serverOnly, *clientOnly); err != nil {
		log.Fatal(err)
	}
}

func run(addr string, serverOnly, clientOnly bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if !clientOnly {
		ln, err := listen(ctx, addr)
		if err != nil {
			return err
		}
		defer func() {
			ln.Close()
			s := ln.Stats()
			fmt.Printf("the server accepted: %d over RDMA, %d over TCP\n", s.Accepted, s.AcceptedTCP)
		}()
		go serve(ln)
		addr = ln.Addr().String()
		if serverOnly {
			fmt.Println("serving on", addr)
			<-ctx.Done()
			return nil
		}
	}
	results, err := runClients(ctx, addr)
	for _, r := range results {
		fmt.Println(r)
	}
	return err
}

func listen(ctx context.Context, addr string) (*rdma.Listener, error) {
	lc := rdma.ListenConfig{FallbackTCP: true}
	ln, err := lc.Listen(ctx, "rdma", addr)
	if err != nil {
		return nil, err
	}
	return ln.(*rdma.Listener), nil
}

// serve greets each connection with the transport it came by, then
// closes it.
func serve(ln net.Listener) {
	for {
		c, err := ln.Accept() // a *rdma.Conn, or a *net.TCPConn
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			fmt.Fprintf(c, "%s\n", transport(c))
		}()
	}
}

func transport(c net.Conn) string {
	if rdma.IsRDMA(c) {
		return "rdma"
	}
	return "tcp"
}

// result is what one client saw: the transport of its connection, and
// the one the server said it saw.
type result struct {
	client       string
	mine, server string
}

func (r result) String() string {
	return fmt.Sprintf("%-23s connected over %s; the server saw %s", r.client+":", r.mine, r.server)
}

// runClients dials addr with fallback and with plain TCP.
func runClients(ctx context.Context, addr string) ([]result, error) {
	d := rdma.Dialer{Timeout: 10 * time.Second, FallbackTCP: true}
	var nd net.Dialer
	clients := []struct {
		name, network string
		dial          func(context.Context, string, string) (net.Conn, error)
	}{
		{"rdma.Dialer FallbackTCP", "rdma", d.DialContext},
		{"net.Dialer", "tcp", nd.DialContext}, // as a host without RDMA
	}
	var results []result
	for _, cl := range clients {
		c, err := cl.dial(ctx, cl.network, addr)
		if err != nil {
			return results, fmt.Errorf("%s: %w", cl.name, err)
		}
		r := result{client: cl.name, mine: transport(c)}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil {
			return results, fmt.Errorf("%s: %w", cl.name, err)
		}
		r.server = strings.TrimSpace(line)
		results = append(results, r)
		if r.mine != r.server {
			return results, errors.New(cl.name + ": the ends disagree on the transport")
		}
	}
	return results, nil
}
