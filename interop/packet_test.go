package interop

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/quic-go/quic-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goverbs/rdma"
)

// Protocols written for net.PacketConn, run unchanged over rdma.PacketConn:
// quic-go (streams and RFC 9221 datagrams) and miekg/dns (a server, and
// clients through a small adapter). These are device tests.

var testAddr = os.Getenv("RDMA_TEST_ADDR")

func needDevice(t testing.TB) {
	t.Helper()
	if testAddr == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test does, in the VM)")
	}
}

// TestMain checks, once the devices the tests used are let go, that no
// goroutine is left: neither the library's nor quic-go's nor miekg/dns's.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		waitDevicesIdle()
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// waitDevicesIdle waits for the devices to be let go: a device stays set
// up, with its goroutines, a while after its last user closed.
func waitDevicesIdle() {
	for deadline := time.Now().Add(10 * time.Second); len(rdma.Devices()) > 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
}

// noLeaks checks, when the test ends (after the closes it registered
// later), that the test left no goroutine of its own.
func noLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		waitDevicesIdle()
		goleak.VerifyNone(t, opt)
	})
}

// listenPacket opens a PacketConn on the test bed's address, closed when
// the test ends.
func listenPacket(t *testing.T) *rdma.PacketConn {
	t.Helper()
	pc, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	t.Cleanup(func() { pc.Close() })
	return pc
}

// logStats logs what a PacketConn counted, drops especially.
func logStats(t *testing.T, name string, pc *rdma.PacketConn) {
	s := pc.Stats()
	t.Logf("%s: sent %d datagrams (%d B), received %d (%d B); drops: no receive %d, truncated %d, reassembly %d, malformed %d",
		name, s.DatagramsSent, s.BytesSent, s.DatagramsReceived, s.BytesReceived,
		s.DropsNoReceive, s.DropsTruncated, s.DropsReassembly, s.DropsMalformed)
}

// --- QUIC (quic-go) ---

const quicALPN = "goverbs-interop"

// quicTLS returns a server and a client TLS configuration around a
// self-signed certificate for the test bed's address.
func quicTLS(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "rdma interop"},
		DNSNames:              []string{"rdma.test"},
		IPAddresses:           []net.IP{net.ParseIP(testAddr)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	server = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}},
		NextProtos:   []string{quicALPN},
	}
	// quic-go infers ServerName from a *net.UDPAddr only: with an
	// *rdma.Addr it has to be given.
	client = &tls.Config{RootCAs: roots, ServerName: testAddr, NextProtos: []string{quicALPN}}
	return server, client
}

// quicPair is a quic-go server and a client connected to it, each over its
// own PacketConn.
type quicPair struct {
	client    *quic.Conn
	serverErr chan error // the server's connections' ends, one per connection
	wg        sync.WaitGroup

	ctr       *quic.Transport
	server    net.Addr
	clientTLS *tls.Config
	cfg       *quic.Config
	broken    int // connections quic-go itself broke (see brokenByQUIC)
}

// maxRedials bounds the connections a test may dial again after
// brokenByQUIC: the server's channel of ends has room for each.
const maxRedials = 10

// newQUICPair starts a quic-go server on a PacketConn, whose connections
// echo every stream and every datagram, and dials it from another. Its
// cleanup closes the client's connection with no error, checks that the
// server saw that (and saw the connections quic-go broke end that way),
// and closes the listener, the transports and the PacketConns in turn.
func newQUICPair(t *testing.T, datagrams bool) *quicPair {
	t.Helper()
	spc, cpc := listenPacket(t), listenPacket(t)
	serverTLS, clientTLS := quicTLS(t)
	cfg := &quic.Config{EnableDatagrams: datagrams, MaxIdleTimeout: 30 * time.Second, HandshakeIdleTimeout: 10 * time.Second}

	str := &quic.Transport{Conn: spc}
	ln, err := str.Listen(serverTLS, cfg)
	require.NoError(t, err)
	p := &quicPair{serverErr: make(chan error, 1+maxRedials), server: spc.LocalAddr(), clientTLS: clientTLS, cfg: cfg}
	p.wg.Go(func() {
		for {
			conn, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serverErr <- p.serve(conn, datagrams) })
		}
	})
	p.ctr = &quic.Transport{Conn: cpc}
	if err := p.dial(t); err != nil {
		ln.Close()
		str.Close()
		p.ctr.Close()
		p.wg.Wait()
		require.NoError(t, err)
	}

	t.Cleanup(func() {
		require.NoError(t, p.client.CloseWithError(0, "done"))
		closed := false
		for range 1 + p.broken {
			select {
			case err := <-p.serverErr:
				var appErr *quic.ApplicationError
				switch {
				case errors.As(err, &appErr):
					require.True(t, appErr.Remote)
					require.Equal(t, quic.ApplicationErrorCode(0), appErr.ErrorCode)
					closed = true
				case brokenByQUIC(err):
				default:
					t.Errorf("a server connection ended with %T %v, not the client's close", err, err)
				}
			case <-time.After(10 * time.Second):
				t.Error("the server did not see every client connection end")
			}
		}
		require.True(t, closed, "the server did not see the client's close")
		require.NoError(t, ln.Close())
		require.NoError(t, str.Close())
		require.NoError(t, p.ctr.Close())
		p.wg.Wait()
		logStats(t, "server PacketConn", spc)
		logStats(t, "client PacketConn", cpc)
		require.NoError(t, spc.Close())
		require.NoError(t, cpc.Close())
	})
	return p
}

// dial connects the client to the server, over the same PacketConns.
func (p *quicPair) dial(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	client, err := p.ctr.Dial(ctx, p.server, p.clientTLS, p.cfg)
	if err != nil {
		return err
	}
	t.Logf("QUIC handshake: %v (%s, %s -> %s)", time.Since(start).Round(time.Millisecond),
		client.ConnectionState().TLS.NegotiatedProtocol, client.LocalAddr(), client.RemoteAddr())
	require.Equal(t, p.cfg.EnableDatagrams, client.ConnectionState().SupportsDatagrams.Remote)
	p.client = client
	return nil
}

// brokenByQUIC reports whether a connection ended with FRAME_ENCODING_ERROR
// (mostly) or STREAM_STATE_ERROR, the two errors quic-go v0.65.0 ends a
// connection of DATAGRAM frames with now and then, in either direction: a
// frame type (or a stream id) read from a datagram's payload, after
// the packet was authenticated, so from what quic-go packed, not from what
// the network delivered. The same test over a net.PacketConn of Go's UDP on
// loopback, in the same VM, failed so 4 times in 30 runs (RDMA: 7 in 30).
func brokenByQUIC(err error) bool {
	var te *quic.TransportError
	return errors.As(err, &te) && (te.ErrorCode == quic.FrameEncodingError || te.ErrorCode == quic.StreamStateError)
}

// serve echoes conn's streams and datagrams until it ends, and returns
// why it ended.
func (p *quicPair) serve(conn *quic.Conn, datagrams bool) error {
	if datagrams {
		p.wg.Go(func() {
			for {
				b, err := conn.ReceiveDatagram(context.Background())
				if err != nil {
					return
				}
				_ = conn.SendDatagram(b)
			}
		})
	}
	for {
		s, err := conn.AcceptStream(context.Background())
		if err != nil {
			return err
		}
		p.wg.Go(func() {
			if _, err := io.Copy(s, s); err != nil {
				s.CancelWrite(1)
				return
			}
			s.Close()
		})
	}
}

// TestQUICStreams echoes 1 MiB on each of four streams at once (1 MiB
// each way, each), then thousands of small messages on one stream, and
// round trips one at a time.
func TestQUICStreams(t *testing.T) {
	needDevice(t)
	noLeaks(t)
	p := newQUICPair(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("bulk", func(t *testing.T) {
		const streams, size = 4, 1 << 20
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, streams)
		for i := range streams {
			wg.Go(func() { errs <- echoBulk(ctx, p.client, int64(i), size) })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		d := time.Since(start)
		t.Logf("%d streams x %d B echoed in %v: %.1f MB/s each way", streams, size, d.Round(time.Millisecond),
			float64(streams*size)/d.Seconds()/1e6)
	})

	t.Run("small", func(t *testing.T) {
		const count = 5000
		s, err := p.client.OpenStreamSync(ctx)
		require.NoError(t, err)
		rnd := mrand.New(mrand.NewSource(7))
		msgs := make([][]byte, count)
		for i := range msgs {
			msgs[i] = make([]byte, 2+rnd.Intn(200))
			binary.BigEndian.PutUint16(msgs[i], uint16(len(msgs[i])-2))
			rnd.Read(msgs[i][2:])
		}
		start := time.Now()
		werr := make(chan error, 1)
		go func() {
			for _, m := range msgs {
				if _, err := s.Write(m); err != nil {
					werr <- err
					return
				}
			}
			werr <- s.Close()
		}()
		hdr := make([]byte, 2)
		for i, m := range msgs {
			_, err := io.ReadFull(s, hdr)
			require.NoError(t, err, "message %d", i)
			body := make([]byte, binary.BigEndian.Uint16(hdr))
			_, err = io.ReadFull(s, body)
			require.NoError(t, err, "message %d", i)
			require.Equal(t, m[2:], body, "message %d", i)
		}
		_, err = s.Read(hdr)
		require.ErrorIs(t, err, io.EOF)
		require.NoError(t, <-werr)
		t.Logf("%d small messages echoed in %v", count, time.Since(start).Round(time.Millisecond))
	})

	t.Run("roundtrips", func(t *testing.T) {
		const count = 300
		s, err := p.client.OpenStreamSync(ctx)
		require.NoError(t, err)
		buf := make([]byte, 64)
		start := time.Now()
		for i := range count {
			msg := []byte(fmt.Sprintf("ping %d", i))
			_, err := s.Write(msg)
			require.NoError(t, err)
			_, err = io.ReadFull(s, buf[:len(msg)])
			require.NoError(t, err)
			require.Equal(t, msg, buf[:len(msg)])
		}
		require.NoError(t, s.Close())
		_, err = s.Read(buf)
		require.ErrorIs(t, err, io.EOF)
		t.Logf("%d round trips on one stream: %v each", count, (time.Since(start) / count).Round(time.Microsecond))
	})
}

// echoBulk sends size random bytes on a new stream of conn, closes its
// side, and checks that the echo is the same bytes.
func echoBulk(ctx context.Context, conn *quic.Conn, seed, size int64) error {
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	data := make([]byte, size)
	mrand.New(mrand.NewSource(seed)).Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := s.Write(data)
		if err == nil {
			err = s.Close()
		}
		werr <- err
	}()
	got, rerr := io.ReadAll(s)
	if err := <-werr; err != nil {
		return fmt.Errorf("stream %d: write: %w", s.StreamID(), err)
	}
	if rerr != nil {
		return fmt.Errorf("stream %d: read: %w", s.StreamID(), rerr)
	}
	if !bytes.Equal(data, got) {
		return fmt.Errorf("stream %d: %d bytes echoed of %d, or different", s.StreamID(), len(got), len(data))
	}
	return nil
}

// TestQUICDatagrams sends RFC 9221 datagrams, the largest the connection
// takes among them, and checks their echoes: one at a time, sent again if
// the echo is late (datagrams may be lost).
func TestQUICDatagrams(t *testing.T) {
	needDevice(t)
	noLeaks(t)
	p := newQUICPair(t, true)

	var tooLarge *quic.DatagramTooLargeError
	require.ErrorAs(t, p.client.SendDatagram(make([]byte, 1<<16)), &tooLarge)
	largest := int(tooLarge.MaxDatagramPayloadSize)
	t.Logf("largest QUIC datagram payload: %d B", largest)

	const count = 500
	rnd := mrand.New(mrand.NewSource(3))
	resent := 0
	start := time.Now()
	for i := range count {
		n := 1 + rnd.Intn(largest)
		if i%50 == 0 {
			n = largest
		}
		msg := make([]byte, n)
		binary.BigEndian.PutUint32(msg, uint32(i))
		rnd.Read(msg[min(n, 4):])
		for try := 0; ; try++ {
			require.Less(t, try, 5, "datagram %d: no echo", i)
			err := p.client.SendDatagram(msg)
			if err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				var got []byte
				got, err = p.client.ReceiveDatagram(ctx)
				for err == nil && !bytes.Equal(got, msg) {
					// An echo of an earlier datagram sent again.
					got, err = p.client.ReceiveDatagram(ctx)
				}
				cancel()
			}
			if err == nil {
				break
			}
			if brokenByQUIC(err) && p.broken < maxRedials {
				t.Logf("datagram %d (%d B): quic-go broke the connection (%v): dialing again", i, n, err)
				p.broken++
				require.NoError(t, p.dial(t))
				continue
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("datagram %d (%d B): %T %v", i, n, err, err)
			}
			resent++
		}
	}
	t.Logf("%d datagrams echoed in %v, %d sent again, %d connections dialed again", count, time.Since(start).Round(time.Millisecond), resent, p.broken)
}

// --- DNS (miekg/dns) ---

// dnsConn is the net.Conn a dns.Conn needs to query a server over a
// PacketConn: the PacketConn, and the server to write to and hear from.
// It stays a net.PacketConn too, as miekg/dns tells datagrams from streams
// that way: on a net.Conn that is not one it frames messages as on TCP.
type dnsConn struct {
	*rdma.PacketConn
	server net.Addr
}

func (c dnsConn) Read(b []byte) (int, error) {
	for {
		n, from, err := c.ReadFrom(b)
		if err != nil || from.String() == c.server.String() {
			return n, err
		}
	}
}

func (c dnsConn) Write(b []byte) (int, error) { return c.WriteTo(b, c.server) }

func (c dnsConn) RemoteAddr() net.Addr { return c.server }

// bigName is the name whose answer, 2,000 A records, needs a datagram of
// about 54 KB: fragmented, on any MTU.
const bigName = "big.example."

const bigAnswers = 2000

// hostIP is the A record of hostN.example.
func hostIP(n int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)})
}

// dnsServer starts a miekg/dns server on a PacketConn that answers A
// queries of hostN.example. with hostIP(N), and of bigName with
// bigAnswers records (beyond 512 bytes when the query's EDNS0 allows it).
// Its cleanup shuts it down, which closes the PacketConn.
func dnsServer(t *testing.T) (net.Addr, *atomic.Int64) {
	t.Helper()
	pc := listenPacket(t)
	queries := new(atomic.Int64)
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		queries.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		var n int
		switch {
		case q.Qtype != dns.TypeA:
			m.Rcode = dns.RcodeNotImplemented
		case q.Name == bigName:
			for i := range bigAnswers {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: hostIP(i).AsSlice()})
			}
		case fmtSscan(q.Name, "host%d.example.", &n):
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: hostIP(n).AsSlice()})
		default:
			m.Rcode = dns.RcodeNameError
		}
		size := dns.MinMsgSize
		if o := r.IsEdns0(); o != nil {
			size = int(o.UDPSize())
			m.SetEdns0(o.UDPSize(), false)
		}
		m.Truncate(size)
		w.WriteMsg(m)
	})
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: handler, NotifyStartedFunc: func() { close(started) }}
	done := make(chan error, 1)
	go func() { done <- srv.ActivateAndServe() }()
	<-started
	t.Cleanup(func() {
		logStats(t, "server PacketConn", pc)
		require.NoError(t, srv.Shutdown())
		require.NoError(t, <-done)
	})
	return pc.LocalAddr(), queries
}

func fmtSscan(s, format string, n *int) bool {
	_, err := fmt.Sscanf(s, format, n)
	return err == nil
}

// dnsClient opens a PacketConn for queries to server, closed when the test
// ends.
func dnsClient(t *testing.T, server net.Addr) *dns.Conn {
	t.Helper()
	return &dns.Conn{Conn: dnsConn{PacketConn: listenPacket(t), server: server}}
}

// query asks conn's server for name's A records.
func query(c *dns.Client, conn *dns.Conn, name string) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	r, _, err := c.ExchangeWithConn(m, conn)
	return r, err
}

// checkHost checks the answer for hostN.example.
func checkHost(r *dns.Msg, n int) error {
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		return fmt.Errorf("host%d: rcode %s, %d answers", n, dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	a, ok := r.Answer[0].(*dns.A)
	if !ok || a.Hdr.Name != fmt.Sprintf("host%d.example.", n) || !a.A.Equal(hostIP(n).AsSlice()) {
		return fmt.Errorf("host%d: answer %v", n, r.Answer[0])
	}
	return nil
}

// TestDNS queries a miekg/dns server on a PacketConn from miekg/dns
// clients on others: many queries in turn, then from many clients at once,
// one whose answer is a large datagram (EDNS0), after the server has been
// idle beyond its read timeout.
func TestDNS(t *testing.T) {
	needDevice(t)
	noLeaks(t)
	server, queries := dnsServer(t)
	c := &dns.Client{Timeout: 5 * time.Second}

	t.Run("sequential", func(t *testing.T) {
		const count = 1000
		conn := dnsClient(t, server)
		start := time.Now()
		for i := range count {
			r, err := query(c, conn, fmt.Sprintf("host%d.example.", i))
			require.NoError(t, err, "query %d", i)
			require.NoError(t, checkHost(r, i))
		}
		r, err := query(c, conn, "nowhere.example.")
		require.NoError(t, err)
		require.Equal(t, dns.RcodeNameError, r.Rcode)
		t.Logf("%d queries in turn: %v each", count, (time.Since(start) / count).Round(time.Microsecond))
		logStats(t, "client PacketConn", conn.Conn.(dnsConn).PacketConn)
	})

	t.Run("concurrent", func(t *testing.T) {
		const clients, each = 16, 200
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, clients)
		for k := range clients {
			conn := dnsClient(t, server)
			wg.Go(func() {
				for i := range each {
					n := k*each + i
					r, err := query(c, conn, fmt.Sprintf("host%d.example.", n))
					if err == nil {
						err = checkHost(r, n)
					}
					if err != nil {
						errs <- fmt.Errorf("client %d, query %d: %w", k, i, err)
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		d := time.Since(start)
		t.Logf("%d clients x %d queries at once in %v: %.0f queries/s", clients, each, d.Round(time.Millisecond),
			clients*each/d.Seconds())
	})

	t.Run("idle then large", func(t *testing.T) {
		// The server reads with a 2 s deadline and carries on after a
		// timeout only if the error says it is temporary.
		time.Sleep(2500 * time.Millisecond)
		conn := dnsClient(t, server)
		r, err := query(c, conn, "host7.example.")
		require.NoError(t, err)
		require.NoError(t, checkHost(r, 7))

		m := new(dns.Msg)
		m.SetQuestion(bigName, dns.TypeA)
		m.SetEdns0(dns.MaxMsgSize, false)
		r, _, err = c.ExchangeWithConn(m, conn)
		require.NoError(t, err)
		require.False(t, r.Truncated)
		require.Len(t, r.Answer, bigAnswers)
		for i, rr := range r.Answer {
			require.True(t, rr.(*dns.A).A.Equal(hostIP(i).AsSlice()), "record %d", i)
		}
		t.Logf("large answer: %d records, %d B", len(r.Answer), r.Len())

		// Without EDNS0 the same answer is truncated to 512 bytes.
		r, err = query(c, conn, bigName)
		require.NoError(t, err)
		require.True(t, r.Truncated)
	})
	require.EqualValues(t, 1000+1+16*200+3, queries.Load())
}
