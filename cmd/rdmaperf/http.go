package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// httpURL is what the http test requests. The host is a placeholder: the
// transport's DialContext ignores the address and dials the rdmaperf
// server.
const httpURL = "http://rdmaperf/"

// httpLoad measures HTTP/1.1 as a Go program would use it over the
// transport: r.conns goroutines send GET requests one after another on one
// http.Client whose Transport has http.DefaultTransport's settings. Those
// keep at most two idle connections to a host (MaxIdleConnsPerHost), so
// with more clients than that most requests find no idle connection and
// dial one, and most connections are closed after a request or two: the
// figure is dominated by connection setup, which is the point. Each
// request reads the whole body (r.size bytes) before the next.
func (r *run) httpLoad() (map[string]float64, error) {
	var dials atomic.Int64
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if r.keepConns {
		// The README's recipe: as many idle connections kept as there
		// are clients, so that requests reuse them instead of dialing.
		tr.MaxIdleConnsPerHost = r.conns
		tr.MaxIdleConns = max(tr.MaxIdleConns, r.conns)
	}
	// The requests are for the rdmaperf server whatever the environment
	// says about proxies.
	tr.Proxy = nil
	tr.DialContext = func(context.Context, string, string) (net.Conn, error) {
		dials.Add(1)
		c, err := r.dial()
		if err != nil {
			return nil, err
		}
		if c, err = greet(c, header{kind: kindHTTP, size: r.size}); err != nil {
			return nil, fmt.Errorf("%w (a server older than -test http closes the connection here)", err)
		}
		return c, nil
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	get := func() error {
		resp, err := client.Get(httpURL)
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			return fmt.Errorf("reading the response: %w", err)
		case resp.StatusCode != http.StatusOK:
			return fmt.Errorf("response %s", resp.Status)
		case n != int64(r.size):
			return fmt.Errorf("response of %d bytes, want %d", n, r.size)
		}
		return nil
	}
	if r.warmup > 0 {
		// As in the dial test: the process's first connection pays for
		// opening the device.
		if err := get(); err != nil {
			return nil, err
		}
		dials.Store(0)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		samples []time.Duration
		errs    []error
	)
	cpu0 := cpuNow()
	start := time.Now()
	deadline := start.Add(r.duration)
	for range r.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			var err error
			for i := 0; r.more(i, deadline); i++ {
				t := time.Now()
				if err = get(); err != nil {
					break
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			defer mu.Unlock()
			samples = append(samples, mine...)
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := r.cpuSince(cpu0)
	if len(errs) > 0 {
		// One cause is enough: the clients' failures are usually all alike.
		return nil, fmt.Errorf("%d of %d clients failed: %w", len(errs), r.conns, errs[0])
	}
	if len(samples) == 0 {
		return nil, errors.New("no request completed")
	}
	us := func(d time.Duration) float64 { return d.Seconds() * 1e6 }
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	slices.Sort(samples)
	return map[string]float64{
		"req_s":   float64(len(samples)) / elapsed.Seconds(),
		"p50_us":  us(percentile(samples, 50)),
		"p99_us":  us(percentile(samples, 99)),
		"avg_us":  us(sum / time.Duration(len(samples))),
		"count":   float64(len(samples)),
		"dials":   float64(dials.Load()),
		"seconds": elapsed.Seconds(),
		"cpu_s":   cpu,
	}, nil
}

// httpFront is the server's HTTP/1.1 side: connections whose header asks
// for kindHTTP are handed to one http.Server, through a listener that
// accepts what is pushed to it. It starts with the first such connection,
// so a server never asked for HTTP runs none, and close shuts it down.
type httpFront struct {
	addr    net.Addr // the rdmaperf server's, for the listener's Addr
	verbose bool

	mu     sync.Mutex
	ln     *handoffListener
	srv    *http.Server
	closed bool
	body   []byte // zeros, the largest response yet; shared, never written

	// sizes holds each handed-off connection's response size until the
	// http.Server's ConnContext moves it into the connection's context.
	sizes sync.Map
}

// sizeKey is the context key of a connection's response size.
type sizeKey struct{}

// serve hands c, whose header asked for responses of size bytes, to the
// HTTP server; false if the server is shut down and c is still the
// caller's to close.
func (f *httpFront) serve(c net.Conn, size int) bool {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return false
	}
	if f.srv == nil {
		f.start()
	}
	ln := f.ln
	f.mu.Unlock()
	f.sizes.Store(c, size)
	if !ln.push(c) {
		f.sizes.Delete(c)
		return false
	}
	return true
}

// start creates the listener and the server and runs it; f.mu is held.
func (f *httpFront) start() {
	f.ln = &handoffListener{addr: f.addr, conns: make(chan net.Conn), done: make(chan struct{})}
	errLog := log.New(io.Discard, "", 0)
	if f.verbose {
		errLog = log.Default()
	}
	f.srv = &http.Server{
		Handler:  http.HandlerFunc(f.respond),
		ErrorLog: errLog,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			size, _ := f.sizes.LoadAndDelete(c)
			return context.WithValue(ctx, sizeKey{}, size)
		},
	}
	go func() {
		// Serve returns once close has closed the listener.
		if err := f.srv.Serve(f.ln); err != nil && !errors.Is(err, http.ErrServerClosed) && f.verbose {
			log.Printf("http server: %v", err)
		}
	}()
}

// respond answers any request with the connection's size in zero bytes.
func (f *httpFront) respond(w http.ResponseWriter, req *http.Request) {
	size, _ := req.Context().Value(sizeKey{}).(int)
	f.mu.Lock()
	if len(f.body) < size {
		f.body = make([]byte, size)
	}
	body := f.body[:size]
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(size))
	w.Write(body)
}

// close shuts the HTTP server down, if it runs, with its connections.
func (f *httpFront) close() {
	f.mu.Lock()
	f.closed = true
	srv := f.srv
	f.mu.Unlock()
	if srv != nil {
		srv.Close()
	}
}

// handoffListener is a net.Listener whose Accept returns the connections
// pushed to it: how an http.Server serves connections that another
// listener accepted and that carried a header first.
type handoffListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// push waits until Accept takes c; false if the listener is closed first.
func (l *handoffListener) push(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }
