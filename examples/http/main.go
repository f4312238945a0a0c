// Command http serves HTTP/1.1 over RDMA and runs concurrent clients
// against it through one http.Transport sized for them. The clients'
// requests share a few kept connections instead of dialing one each: an
// RDMA connection costs milliseconds to set up, far more than a request
// on a kept one.
//
//	go run ./examples/http -addr 10.0.0.1:0
//
// The address must belong to an interface with an RDMA device. -server
// only serves (until interrupted); -client only runs the clients against
// the server at -addr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/rdma"
)

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR")+":0", "the server's address: an RDMA interface's IP and a port (0 picks one)")
	serverOnly := flag.Bool("server", false, "only serve, until interrupted")
	clientOnly := flag.Bool("client", false, "only run the clients, against the server at -addr")
	clients := flag.Int("clients", 8, "clients sending requests at once")
	requests := flag.Int("requests", 50, "requests each client sends, one after another")
	flag.Parse()
	if err := run(*addr, *serverOnly, *clientOnly, *clients, *requests); err != nil {
		log.Fatal(err)
	}
}

func run(addr string, serverOnly, clientOnly bool, clients, requests int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if clientOnly {
		res, err := runClients(ctx, addr, clients, requests)
		fmt.Println(res)
		return err
	}
	s, err := startServer(addr)
	if err != nil {
		return err
	}
	if serverOnly {
		fmt.Println("serving on", s.ln.Addr())
		<-ctx.Done()
		return s.shutdown()
	}
	res, err := runClients(ctx, s.ln.Addr().String(), clients, requests)
	fmt.Println(res)
	fmt.Printf("the server accepted %d connections\n", s.ln.Stats().Accepted)
	return errors.Join(err, s.shutdown())
}

// result is what the clients saw.
type result struct {
	Requests int // answered as expected
	Dials    int // connections the transport dialed
	Reused   int // requests sent on a connection an earlier request used
	RDMA     int // requests sent on an RDMA connection
}

func (r result) String() string {
	return fmt.Sprintf("%d requests, %d over RDMA, on %d connections dialed (%d requests on a kept connection)",
		r.Requests, r.RDMA, r.Dials, r.Reused)
}

// runClients sends requests from clients goroutines at once, each one
// request after another, through one transport.
func runClients(ctx context.Context, addr string, clients, requests int) (result, error) {
	var dials, reused, overRDMA, ok atomic.Int64
	d := &rdma.Dialer{Timeout: 5 * time.Second}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr) // "tcp" is taken to mean "rdma"
	}
	// The default keeps 2 idle connections per host: with more clients, a
	// request finding none idle dials, and a finished one's is closed.
	tr.MaxIdleConnsPerHost = clients
	tr.MaxIdleConns = max(tr.MaxIdleConns, clients)
	// And a request waits for a busy connection rather than dial beyond
	// them: a client's next request may come before the connection of its
	// last one is back among the idle ones.
	tr.MaxConnsPerHost = clients
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if info.Reused {
			reused.Add(1)
		}
		if rdma.IsRDMA(info.Conn) {
			overRDMA.Add(1)
		}
	}}
	ctx = httptrace.WithClientTrace(ctx, trace)

	errs := make([]error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			for j := range requests {
				path := fmt.Sprintf("/client/%d/request/%d", i, j)
				if errs[i] = get(ctx, hc, "http://"+addr+path, path); errs[i] != nil {
					return
				}
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	res := result{Requests: int(ok.Load()), Dials: int(dials.Load()), Reused: int(reused.Load()), RDMA: int(overRDMA.Load())}
	return res, errors.Join(errs...)
}

// get fetches url and checks that the answer is want.
func get(ctx context.Context, hc *http.Client, url, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || string(body) != want {
		return fmt.Errorf("GET %s: %s %q", url, resp.Status, body)
	}
	return nil
}
