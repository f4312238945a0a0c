package interop

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/goverbs/rdma"
)

// Applications as benchmarks: each runs its rdma and its tcp sub-benchmark
// over the test bed's address, in the same process, so that their ratio is
// the library's and the provider's cost against Go's TCP on the same host.
// None asserts a time; make bench renders the ratios (bench/apps.sh).

// transport is a way to listen and to dial: RDMA through the library, or
// Go's TCP.
type transport struct {
	name   string
	listen func(tb testing.TB) net.Listener
	dial   func(ctx context.Context, addr string) (net.Conn, error)
}

// transports returns RDMA (with Options.Messages on both sides if
// messages) and TCP, listening on the test bed's address.
func transports(messages bool) []transport {
	opts := rdma.Options{Messages: messages}
	d := &rdma.Dialer{Options: opts}
	var nd net.Dialer
	return []transport{{
		name: "rdma",
		listen: func(tb testing.TB) net.Listener {
			lc := rdma.ListenConfig{Options: opts}
			l, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
			require.NoError(tb, err)
			return l
		},
		dial: func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "rdma", addr) },
	}, {
		name: "tcp",
		listen: func(tb testing.TB) net.Listener {
			l, err := net.Listen("tcp", net.JoinHostPort(testAddr, "0"))
			require.NoError(tb, err)
			return l
		},
		dial: func(ctx context.Context, addr string) (net.Conn, error) { return nd.DialContext(ctx, "tcp", addr) },
	}}
}

// server accepts on l and runs handle on each connection, each on its own
// goroutine; its cleanup closes the listener and every connection and
// waits for the goroutines.
func server(tb testing.TB, l net.Listener, handle func(net.Conn)) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Go(func() {
				handle(c)
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
			})
		}
	})
	tb.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// echo copies what c reads back to it until EOF, then half-closes.
func echo(c net.Conn) {
	io.Copy(c, c)
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// dialT dials addr over tr; its cleanup closes the connection.
func dialT(b *testing.B, tr transport, addr string) net.Conn {
	b.Helper()
	c, err := tr.dial(context.Background(), addr)
	require.NoError(b, err)
	b.Cleanup(func() { c.Close() })
	return c
}

// reportRate reports n operations (requests, say) per second of the
// benchmark's loop under unit.
func reportRate(b *testing.B, n int, unit string) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(n)/s, unit)
	}
}

// randomBytes returns n random bytes.
func randomBytes(tb testing.TB, n int) []byte {
	p := make([]byte, n)
	_, err := rand.Read(p)
	require.NoError(tb, err)
	return p
}

// eachTransport runs bench as an rdma and a tcp sub-benchmark.
func eachTransport(b *testing.B, messages bool, bench func(b *testing.B, tr transport)) {
	needDevice(b)
	for _, tr := range transports(messages) {
		b.Run(tr.name, func(b *testing.B) {
			b.ReportAllocs()
			bench(b, tr)
		})
	}
}

// --- gRPC ---

// rawCodec carries a *[]byte as the message itself: no protobuf, no
// generated code.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	p := v.(*[]byte)
	*p = append((*p)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "raw" }

// echoService is a gRPC service written by hand: Unary returns its
// request, Stream returns every message it receives.
var echoService = grpc.ServiceDesc{
	ServiceName: "interop.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var m []byte
			if err := dec(&m); err != nil {
				return nil, err
			}
			return &m, nil
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(_ any, st grpc.ServerStream) error {
			var m []byte
			for {
				if err := st.RecvMsg(&m); err != nil {
					if err == io.EOF {
						return nil
					}
					return err
				}
				if err := st.SendMsg(&m); err != nil {
					return err
				}
			}
		},
	}},
}

// grpcPair starts the echo service on tr and returns a client connected
// to it; its cleanup stops both.
func grpcPair(b *testing.B, tr transport) *grpc.ClientConn {
	b.Helper()
	l := tr.listen(b)
	s := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	s.RegisterService(&echoService, struct{}{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(l)
	}()
	cc, err := grpc.NewClient("passthrough:///"+l.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(tr.dial),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	require.NoError(b, err)
	b.Cleanup(func() {
		cc.Close()
		s.Stop()
		<-done
	})
	return cc
}

// BenchmarkGRPCUnary is a gRPC unary echo of 1 KiB of random bytes, one
// call at a time.
func BenchmarkGRPCUnary(b *testing.B) {
	eachTransport(b, false, func(b *testing.B, tr transport) {
		cc := grpcPair(b, tr)
		req := randomBytes(b, 1<<10)
		var resp []byte
		ctx := context.Background()
		// The first call connects.
		require.NoError(b, cc.Invoke(ctx, "/interop.Echo/Unary", &req, &resp))
		n := 0
		for b.Loop() {
			if err := cc.Invoke(ctx, "/interop.Echo/Unary", &req, &resp); err != nil {
				b.Fatal(err)
			}
			n++
		}
		require.Equal(b, req, resp)
		reportRate(b, n, "req/s")
	})
}

// BenchmarkGRPCStream streams 1 KiB messages of random bytes through a
// bidirectional echo stream as fast as the stream takes them: a goroutine
// receives the echoes while the loop sends.
func BenchmarkGRPCStream(b *testing.B) {
	eachTransport(b, false, func(b *testing.B, tr transport) {
		cc := grpcPair(b, tr)
		msg := randomBytes(b, 1<<10)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		st, err := cc.NewStream(ctx, &echoService.Streams[0], "/interop.Echo/Stream")
		require.NoError(b, err)
		// One round trip before the loop: the stream is up.
		require.NoError(b, st.SendMsg(&msg))
		var first []byte
		require.NoError(b, st.RecvMsg(&first))
		received := make(chan error, 1)
		var got atomic.Int64
		go func() {
			var m []byte
			for {
				if err := st.RecvMsg(&m); err != nil {
					if err == io.EOF {
						err = nil
					}
					received <- err
					return
				}
				got.Add(1)
			}
		}()
		b.SetBytes(2 << 10) // each way
		n := 0
		for b.Loop() {
			if err := st.SendMsg(&msg); err != nil {
				b.Fatal(err)
			}
			n++
		}
		require.NoError(b, st.CloseSend())
		require.NoError(b, <-received)
		b.StopTimer()
		require.Equal(b, int64(n), got.Load())
		reportRate(b, n, "msg/s")
	})
}

// --- HTTP/2 cleartext ---

// countingListener counts the connections it accepted.
type countingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// loopConcurrently runs op once per iteration of b.Loop on workers
// goroutines: the loop hands the iterations out and returns once all are
// done.
func loopConcurrently(b *testing.B, workers int, op func() error) {
	work := make(chan struct{}, workers)
	var (
		wg    sync.WaitGroup
		first atomic.Pointer[error]
	)
	for range workers {
		wg.Go(func() {
			for range work {
				if err := op(); err != nil {
					first.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	for b.Loop() {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	if err := first.Load(); err != nil {
		b.Fatal(*err)
	}
}

// BenchmarkHTTP2 sends 64 B POSTs from 64 goroutines at once through one
// HTTP/2 cleartext connection (prior knowledge, as h2c clients do) to a
// server that echoes the body.
func BenchmarkHTTP2(b *testing.B) {
	const streams = 64
	eachTransport(b, false, func(b *testing.B, tr transport) {
		l := &countingListener{Listener: tr.listen(b)}
		var protos http.Protocols
		protos.SetUnencryptedHTTP2(true)
		srv := &http.Server{
			Protocols: &protos,
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var body [64]byte
				n, _ := io.ReadFull(r.Body, body[:])
				w.Write(body[:n])
			}),
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.Serve(l)
		}()
		client := &http.Client{Transport: &http.Transport{
			Protocols:   &protos,
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return tr.dial(ctx, addr) },
		}}
		b.Cleanup(func() {
			client.CloseIdleConnections()
			srv.Close()
			<-done
		})
		url := "http://" + l.Addr().String() + "/"
		body := randomBytes(b, 64)
		post := func() error {
			resp, err := client.Post(url, "application/octet-stream", bytes.NewReader(body))
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var got [64]byte
			if _, err := io.ReadFull(resp.Body, got[:]); err != nil {
				return err
			}
			if resp.ProtoMajor != 2 || !bytes.Equal(got[:], body) {
				return fmt.Errorf("got %s %x, want HTTP/2 and %x", resp.Proto, got, body)
			}
			return nil
		}
		require.NoError(b, post())
		loopConcurrently(b, streams, post)
		reportRate(b, b.N, "req/s")
		b.StopTimer()
		require.EqualValues(b, 1, l.n.Load(), "connections")
	})
}

// --- A pipelined request/response protocol ---

// framer reads and writes one request or response: over RDMA with
// Options.Messages a message is one Write and one Read; over TCP a 2-byte
// big-endian length comes first.
type framer struct {
	c        net.Conn
	r        *bufio.Reader // TCP only
	messages bool
	wbuf     []byte
}

func newFramer(c net.Conn, messages bool) *framer {
	f := &framer{c: c, messages: messages}
	if !messages {
		f.r = bufio.NewReader(c)
	}
	return f
}

// read reads one frame into p (large enough for it) and returns its
// length.
func (f *framer) read(p []byte) (int, error) {
	if f.messages {
		return f.c.Read(p)
	}
	var hdr [2]byte
	if _, err := io.ReadFull(f.r, hdr[:]); err != nil {
		return 0, err
	}
	n := int(binary.BigEndian.Uint16(hdr[:]))
	if n > len(p) {
		return 0, fmt.Errorf("frame of %d bytes, buffer of %d", n, len(p))
	}
	return io.ReadFull(f.r, p[:n])
}

// write writes p as one frame.
func (f *framer) write(p []byte) error {
	if f.messages {
		_, err := f.c.Write(p)
		return err
	}
	f.wbuf = binary.BigEndian.AppendUint16(f.wbuf[:0], uint16(len(p)))
	f.wbuf = append(f.wbuf, p...)
	_, err := f.c.Write(f.wbuf)
	return err
}

// BenchmarkPipelined sends 64 B requests, up to 16 of them unanswered at
// a time, on one connection to a server that answers each with 64 B: over
// RDMA as messages (Options.Messages on both sides), over TCP with
// length-prefixed frames. An op is one request and its response.
func BenchmarkPipelined(b *testing.B) {
	const (
		size  = 64
		depth = 16
	)
	for _, tr := range transports(true) {
		messages := tr.name == "rdma"
		b.Run(tr.name, func(b *testing.B) {
			needDevice(b)
			b.ReportAllocs()
			l := tr.listen(b)
			server(b, l, func(c net.Conn) {
				f := newFramer(c, messages)
				buf := make([]byte, size)
				for {
					n, err := f.read(buf)
					if err != nil {
						return
					}
					buf[0]++ // the response differs from the request
					if err := f.write(buf[:n]); err != nil {
						return
					}
				}
			})
			c := dialT(b, tr, l.Addr().String())
			f := newFramer(c, messages)
			req := randomBytes(b, size)
			want := append([]byte(nil), req...)
			want[0]++
			// A slot is taken per request sent and given back per
			// response received; failed is closed if the receiver stops.
			slots := make(chan struct{}, depth)
			failed := make(chan struct{})
			var rerr error
			go func() {
				defer close(failed)
				resp := make([]byte, size)
				for {
					n, err := f.read(resp)
					if err != nil {
						rerr = err
						return
					}
					if !bytes.Equal(resp[:n], want) {
						rerr = fmt.Errorf("response %x, want %x", resp[:n], want)
						return
					}
					<-slots
				}
			}()
			b.Cleanup(func() {
				c.Close()
				<-failed
			})
			take := func() {
				select {
				case slots <- struct{}{}:
				case <-failed:
					b.Fatal(rerr)
				}
			}
			n := 0
			for b.Loop() {
				take()
				if err := f.write(req); err != nil {
					b.Fatal(err)
				}
				n++
			}
			// Every slot taken: every response is in.
			for range depth {
				take()
			}
			reportRate(b, n, "req/s")
		})
	}
}

// --- TLS ---

// tlsConfigs returns a server and a client TLS configuration around a
// self-signed certificate for the test bed's address.
func tlsConfigs(tb testing.TB) (server, client *tls.Config) {
	server, client = quicTLS(tb)
	server.NextProtos, client.NextProtos = nil, nil
	return server, client
}

// BenchmarkTLS moves 1 MiB each way through a TLS connection (crypto/tls
// over the conn) to a server that echoes it: an op writes 1 MiB and reads
// its echo while it writes.
func BenchmarkTLS(b *testing.B) {
	const size = 1 << 20
	eachTransport(b, false, func(b *testing.B, tr transport) {
		serverCfg, clientCfg := tlsConfigs(b)
		l := tr.listen(b)
		server(b, l, func(c net.Conn) { echo(tls.Server(c, serverCfg)) })
		tc := tls.Client(dialT(b, tr, l.Addr().String()), clientCfg)
		require.NoError(b, tc.Handshake())
		out := randomBytes(b, size)
		in := make([]byte, size)
		b.SetBytes(2 * size)
		for b.Loop() {
			wrote := make(chan error, 1)
			go func() {
				_, err := tc.Write(out)
				wrote <- err
			}()
			if _, err := io.ReadFull(tc, in); err != nil {
				b.Fatal(err)
			}
			if err := <-wrote; err != nil {
				b.Fatal(err)
			}
		}
		require.Equal(b, out, in)
	})
}

// --- A TCP-to-RDMA relay ---

// relay accepts TCP clients on the test bed's address and carries each to
// backend, dialed over tr, with io.Copy both ways; each direction's end is
// passed on as a half-close. It returns the relay's address.
func relay(b *testing.B, tr transport, backend string) string {
	l, err := net.Listen("tcp", net.JoinHostPort(testAddr, "0"))
	require.NoError(b, err)
	server(b, l, func(c net.Conn) {
		bc, err := tr.dial(context.Background(), backend)
		if err != nil {
			return
		}
		defer bc.Close()
		var wg sync.WaitGroup
		wg.Go(func() {
			io.Copy(bc, c)
			bc.(interface{ CloseWrite() error }).CloseWrite()
		})
		io.Copy(c, bc)
		c.(*net.TCPConn).CloseWrite()
		wg.Wait()
	})
	return l.Addr().String()
}

// BenchmarkRelay runs 16 TCP clients at once through a relay to an echo
// backend over tr (RDMA, or TCP for comparison): each client connects,
// writes 1 MiB, half-closes, reads the echo to its end and closes. An op
// is the 16 clients' work, connections included.
func BenchmarkRelay(b *testing.B) {
	const (
		clients = 16
		size    = 1 << 20
	)
	eachTransport(b, false, func(b *testing.B, tr transport) {
		backend := tr.listen(b)
		server(b, backend, echo)
		addr := relay(b, tr, backend.Addr().String())
		out := randomBytes(b, size)
		var d net.Dialer
		client := func(in []byte) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute))
			wrote := make(chan error, 1)
			go func() {
				_, err := c.Write(out)
				if err == nil {
					err = c.(*net.TCPConn).CloseWrite()
				}
				wrote <- err
			}()
			n, err := io.ReadFull(c, in)
			if err == nil {
				// The echo ends where the request did.
				if _, err = c.Read(make([]byte, 1)); err == io.EOF {
					err = nil
				} else if err == nil {
					err = errors.New("echo longer than the request")
				}
			}
			if werr := <-wrote; err == nil {
				err = werr
			}
			if err == nil && !bytes.Equal(in[:n], out) {
				err = errors.New("echo differs from the request")
			}
			return err
		}
		ins := make([][]byte, clients)
		for i := range ins {
			ins[i] = make([]byte, size)
		}
		b.SetBytes(2 * clients * size)
		for b.Loop() {
			errs := make([]error, clients)
			var wg sync.WaitGroup
			for i := range clients {
				wg.Go(func() { errs[i] = client(ins[i]) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
		}
	})
}
