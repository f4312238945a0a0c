//go:build linux && cgo

package rdma_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// Device tests of hostile and broken peers: a raw peer (rawpeer_test.go)
// connects to a real listener and breaks the protocol, or the NIC's rules,
// in one way each. Every test requires that the hostile peer's connection
// fails with a clear *net.OpError on the server (ErrProtocol for protocol
// violations; for NIC errors the work completion's status where the
// server's NIC reports one, a reset where its receives are only flushed),
// without a panic or a hang, and that the listener goes on serving: a connection
// established before goes on working, a new Dial to it echoes, and when
// everything is closed no registered memory is left (TestMain checks
// goroutines and verbs objects at the end).

// Completion statuses (enum ibv_wc_status) the tests expect.
const (
	wcLocLenErr    = 1  // IBV_WC_LOC_LEN_ERR: a message larger than the receive buffer
	wcLocQPOpErr   = 2  // IBV_WC_LOC_QP_OP_ERR: what rxe reports for one instead
	wcRemAccessErr = 10 // IBV_WC_REM_ACCESS_ERR: the responder refused an RDMA access
)

// hostileBed is a listener with default options, its accept loop, and a
// normal connection established before the hostile one, echoed by the
// server.
type hostileBed struct {
	addr     string
	accepted chan net.Conn
	good     net.Conn
	echoes   sync.WaitGroup
}

func newHostileBed(t *testing.T) *hostileBed {
	t.Helper()
	needDevice(t)
	baseConns, baseReg := deviceTotals()
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	b := &hostileBed{addr: ln.Addr().String(), accepted: make(chan net.Conn, 16)}
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-acceptDone
		close(b.accepted)
		for c := range b.accepted {
			c.Close()
		}
		b.echoes.Wait()
		waitDeviceTotals(t, baseConns, baseReg)
	})
	b.good, err = rdma.Dial("rdma", b.addr)
	require.NoError(t, err)
	t.Cleanup(func() { b.good.Close() })
	b.echo(b.next(t))
	roundTrip(t, b.good, "before the hostile peer")
	return b
}

// next returns the next connection the listener accepted.
func (b *hostileBed) next(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-b.accepted:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("the listener accepted nothing in 10s")
	}
	return nil
}

// echo echoes c back to itself until it ends, then closes it.
func (b *hostileBed) echo(c net.Conn) {
	b.echoes.Add(1)
	go func() {
		defer b.echoes.Done()
		defer c.Close()
		io.Copy(c, c)
	}()
}

// hostile connects a raw peer and returns it with its server side.
func (b *hostileBed) hostile(t *testing.T) (*rawPeer, net.Conn) {
	t.Helper()
	p := dialRaw(t, b.addr)
	sc := b.next(t)
	// The raw peer goes first: the server side then finds its peer gone
	// instead of waiting for its fin to be acknowledged.
	t.Cleanup(func() {
		p.close()
		sc.Close()
	})
	return p, sc
}

// checkServing requires that the listener still serves: the connection
// established before the hostile one echoes, and so does a new one.
func (b *hostileBed) checkServing(t *testing.T) {
	t.Helper()
	roundTrip(t, b.good, "still working after the hostile peer")
	c, err := (&rdma.Dialer{Timeout: 10 * time.Second}).Dial("rdma", b.addr)
	require.NoError(t, err, "a new Dial to the listener after the hostile peer")
	defer c.Close()
	b.echo(b.next(t))
	roundTrip(t, c, "a new connection after the hostile peer")
}

// readAll reads c until a Read fails, for at most 5 seconds, and returns
// what it read and the error that ended it.
func readAll(c net.Conn) ([]byte, error) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var got []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got, err
		}
	}
}

// writeUntilFails writes a byte at a time to c until a Write fails, for at
// most 5 seconds (a failure the poller has not dispatched yet lets a Write
// or two through), and returns the error.
func writeUntilFails(c net.Conn) error {
	deadline := time.Now().Add(5 * time.Second)
	c.SetWriteDeadline(deadline)
	for {
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return os.ErrDeadlineExceeded
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// requireFailed requires err to be the *net.OpError of op that a broken
// connection returns: not a timeout (the failure must be noticed, not
// waited out), wrapping target, its text containing text.
func requireFailed(t *testing.T, err error, op string, target error, text string) {
	t.Helper()
	require.Error(t, err, "%s on the hostile peer's connection succeeded", op)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "%s on the hostile peer's connection did not fail within 5s: %v", op, err)
	requireOpError(t, err, op)
	require.ErrorIs(t, err, target)
	require.ErrorContains(t, err, text)
}

// requireDisconnected requires the raw peer to be disconnected by the
// server.
func (p *rawPeer) requireDisconnected(t *testing.T) {
	t.Helper()
	require.True(t, p.waitEvent(rdmacm.EventDisconnected, 5*time.Second),
		"the server did not disconnect the hostile peer in 5s (CM events seen: %v)", p.other)
}

// TestHostileUnknownType: a message of a type the protocol does not have.
func TestHostileUnknownType(t *testing.T) {
	b := newHostileBed(t)
	p, sc := b.hostile(t)
	p.violate(p.send(0x7f, 0, 0, nil))
	got, err := readAll(sc)
	require.Empty(t, got)
	requireFailed(t, err, "read", rdma.ErrProtocol, "unknown message type")
	requireFailed(t, writeUntilFails(sc), "write", rdma.ErrProtocol, "unknown message type")
	p.requireDisconnected(t)
	b.checkServing(t)
}

// TestHostileCreditsNeverOwed: a header that returns more data credits
// than the server ever spent. Returning what is owed is fine; one more is
// a violation.
func TestHostileCreditsNeverOwed(t *testing.T) {
	b := newHostileBed(t)
	p, sc := b.hostile(t)
	// The server spends one of the raw peer's credits...
	_, err := sc.Write([]byte("a"))
	require.NoError(t, err)
	m := p.waitRecv(1, 5*time.Second)[0]
	require.Equal(t, wire.MsgData, int(m.typ))
	require.Equal(t, "a", string(m.data))
	// ...gets it back, and goes on sending...
	p.requireSent(p.send(wire.MsgCredit, 0, 1, nil))
	_, err = sc.Write([]byte("b"))
	require.NoError(t, err)
	require.Equal(t, "b", string(p.waitRecv(2, 5*time.Second)[1].data))
	// ...but two credits back for the one spent is one never owed.
	p.requireSent(p.send(wire.MsgCredit, 0, 2, nil))
	got, err := readAll(sc)
	require.Empty(t, got)
	requireFailed(t, err, "read", rdma.ErrProtocol, "more credits")
	requireFailed(t, writeUntilFails(sc), "write", rdma.ErrProtocol, "more credits")
	p.requireDisconnected(t)
	b.checkServing(t)
}

// TestHostileSendWithPayload: a SEND with payload. Data travels as RDMA
// WRITE with immediate and every receive is zero-length, so the server's
// NIC completes the receive with an error (a length error, or on rxe a
// local QP operation error) and its QP goes to the error state; the raw
// peer's NIC sees the send refused. The server's Read names the status;
// its Writes fail on the broken QP.
func TestHostileSendWithPayload(t *testing.T) {
	b := newHostileBed(t)
	p, sc := b.hostile(t)
	wc := p.waitSend(p.sendSEND(wire.MsgData, 0, 0, []byte("a SEND with payload")), 5*time.Second)
	t.Logf("the raw peer's SEND with payload completed with %q", ibv.StatusString(wc.Status))
	requireRefused(t, wc, "a SEND with payload was acknowledged")
	got, err := readAll(sc)
	require.Empty(t, got)
	if siw() {
		// The 80-byte header slots take it: a protocol violation.
		requireFailed(t, err, "read", rdma.ErrProtocol, "")
		p.requireDisconnected(t)
		b.checkServing(t)
		return
	}
	requireFailed(t, err, "read", syscall.ECONNRESET, "")
	if !strings.Contains(err.Error(), ibv.StatusString(wcLocLenErr)) && !strings.Contains(err.Error(), ibv.StatusString(wcLocQPOpErr)) {
		t.Fatalf("the Read error names neither %q nor %q: %v", ibv.StatusString(wcLocLenErr), ibv.StatusString(wcLocQPOpErr), err)
	}
	werr := writeUntilFails(sc)
	t.Logf("read: %v; write: %v", err, werr)
	requireFailed(t, werr, "write", syscall.ECONNRESET, "")
	p.requireDisconnected(t)
	b.checkServing(t)
}

// TestHostileSendWithPayloadWakesWriter: a Write of the server's that
// waits for credit the raw peer never returns fails as soon as the peer's
// SEND with payload breaks the QP on the receive side, not when the CM
// gives up on a disconnect the peer never answers (about a minute), and
// Close does not linger for a fin that cannot go.
func TestHostileSendWithPayloadWakesWriter(t *testing.T) {
	b := newHostileBed(t)
	p, sc := b.hostile(t)
	wrote := make(chan error, 1)
	go func() {
		sc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, err := sc.Write(make([]byte, 4<<20)) // far more than the peer's credits and ring
		wrote <- err
	}()
	time.Sleep(200 * time.Millisecond)
	select {
	case err := <-wrote:
		t.Fatalf("the Write returned before the peer broke the QP: %v", err)
	default:
	}
	p.waitSend(p.sendSEND(wire.MsgData, 0, 0, []byte("a SEND with payload")), 5*time.Second)
	err := <-wrote
	if siw() {
		// The 80-byte header slots take it: a protocol violation.
		requireFailed(t, err, "write", rdma.ErrProtocol, "")
	} else {
		requireFailed(t, err, "write", syscall.ECONNRESET, "work request failed: ")
	}
	within(t, 10*time.Second, "Close after the failure", func() error { sc.Close(); return nil })
	p.requireDisconnected(t)
	b.checkServing(t)
}

// TestHostileOversizedMessage: an RDMA WRITE with immediate of one byte
// more than the largest message both sides agreed on (the smaller
// BufferSize). The ring takes it (it is inside the region), but a peer
// that honours the protocol never sends it: a violation.
func TestHostileOversizedMessage(t *testing.T) {
	b := newHostileBed(t)
	p, sc := b.hostile(t)
	require.EqualValues(t, rdma.DefaultBufferSize, p.server.BufSize)
	require.Equal(t, rawBufSize, p.maxMsg, "the smaller BufferSize: the raw peer's")
	p.violate(p.send(wire.MsgData, 0, 0, make([]byte, p.maxMsg+1)))
	got, err := readAll(sc)
	require.Empty(t, got)
	requireFailed(t, err, "read", rdma.ErrProtocol, "larger than the largest")
	requireFailed(t, writeUntilFails(sc), "write", rdma.ErrProtocol, "larger than the largest")
	p.requireDisconnected(t)
	b.checkServing(t)
}

// TestHostileRingOverrun: within its credits, the peer writes more bytes
// than the ring holds while the server does not read: the message that
// would land on unread bytes is a violation.
func TestHostileRingOverrun(t *testing.T) {
	b := newHostileBed(t)
	p, sc := b.hostile(t)
	fits := p.span / p.maxMsg
	require.Less(t, fits, int(p.server.RecvDepth), "the credits allow more than the ring holds")
	for i := range fits + 1 {
		p.requireSent(p.send(wire.MsgData, 0, 0, bytes.Repeat([]byte{byte('a' + i)}, p.maxMsg)))
	}
	require.Eventually(t, func() bool {
		_, err := sc.Write([]byte("x"))
		return err != nil
	}, 5*time.Second, 10*time.Millisecond, "the overrun did not fail the connection")
	got, err := readAll(sc)
	t.Logf("the server read %d bytes, then: %v", len(got), err)
	require.LessOrEqual(t, len(got), fits*p.maxMsg)
	requireFailed(t, err, "read", rdma.ErrProtocol, "overran the receive ring")
	p.requireDisconnected(t)
	b.checkServing(t)
}

// TestHostileDataAfterFin: the peer sends its fin, then more data. What
// came before the fin is read, then io.EOF; the data after it is a
// violation that fails the connection (its Writes).
func TestHostileDataAfterFin(t *testing.T) {
	b := newHostileBed(t)
	p, sc := b.hostile(t)
	p.requireSent(p.send(wire.MsgData, 0, 0, []byte("before the fin")))
	p.requireSent(p.send(wire.MsgFin, 0, 0, nil))
	p.violate(p.send(wire.MsgData, 0, 0, []byte("after the fin")))
	got, err := readAll(sc)
	require.Equal(t, "before the fin", string(got))
	require.Equal(t, io.EOF, err, "the fin ends the stream cleanly; what came after it is never read")
	requireFailed(t, writeUntilFails(sc), "write", rdma.ErrProtocol, "after the fin")
	p.requireDisconnected(t)
	b.checkServing(t)
}

// TestHostileRemoteAccess: one-sided operations on the server's memory
// beyond what the protocol grants (RDMA WRITE into its receive ring). It
// registers its receive ring for remote write only, and everything else
// for local access only, so its NIC refuses a READ or an atomic anywhere,
// and a WRITE outside the receive ring (its send ring, right after it,
// with the ring's key or a guessed one, or across the ring's end), and
// moves the server's QP to the error state, which flushes its receives.
func TestHostileRemoteAccess(t *testing.T) {
	b := newHostileBed(t)
	for _, tc := range []struct {
		name string
		op   rdmaOp
		at   func(p *rawPeer) (uint64, uint32)
		n    int
	}{
		{"read the receive ring", opRead, func(p *rawPeer) (uint64, uint32) { return p.server.RingAddr, p.server.RKey }, 64},
		{"atomic on the receive ring", opFetchAdd, func(p *rawPeer) (uint64, uint32) { return p.server.RingAddr, p.server.RKey }, 8},
		{"write the send ring with the ring's key", opWrite, func(p *rawPeer) (uint64, uint32) {
			return p.server.RingAddr + uint64(p.server.RingSize), p.server.RKey
		}, 64},
		{"write across the ring's end", opWrite, func(p *rawPeer) (uint64, uint32) {
			return p.server.RingAddr + uint64(p.server.RingSize) - 32, p.server.RKey
		}, 64},
		// The likeliest key of the send ring: the region registered
		// right after the receive ring (rxe numbers keys in order).
		{"write the send ring with a guessed key", opWrite, func(p *rawPeer) (uint64, uint32) {
			return p.server.RingAddr + uint64(p.server.RingSize), p.server.RKey + 0x100
		}, 64},
		{"read the send ring with a guessed key", opRead, func(p *rawPeer) (uint64, uint32) {
			return p.server.RingAddr + uint64(p.server.RingSize), p.server.RKey + 0x100
		}, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.op == opFetchAdd {
				needNotSiw(t, "siw has no atomics: its provider refuses the work request when it is posted")
			}
			if tc.op == opRead {
				needNotSiw(t, "iw_cm sets the raw peer's QP from its connect, which asks for no RDMA READs outstanding, so siw refuses the READ when it is posted")
			}
			p, sc := b.hostile(t)
			raddr, rkey := tc.at(p)
			wc := p.waitSend(p.rdma(tc.op, raddr, rkey, tc.n), 5*time.Second)
			t.Logf("the raw peer's %v of %#x (rkey %#x) completed with %q", tc.op, raddr, rkey, ibv.StatusString(wc.Status))
			requireRefused(t, wc, "the server's NIC must refuse access the protocol does not grant")
			if tc.op == opWrite && !siw() {
				require.Equal(t, uint32(wcRemAccessErr), wc.Status)
			}
			got, err := readAll(sc)
			require.Empty(t, got)
			werr := writeUntilFails(sc)
			t.Logf("read: %v; write: %v", err, werr)
			requireFailed(t, err, "read", syscall.ECONNRESET, "")
			requireFailed(t, werr, "write", syscall.ECONNRESET, "")
			p.requireDisconnected(t)
		})
	}
	b.checkServing(t)
}

// TestHostileAtomics: a raw peer aiming remote atomics at a region the
// server registered for READ and WRITE only, or just past the end of an
// atomic region, is refused by the server's NIC and fails its own
// connection only; the region is unchanged. (A misaligned atomic does not
// get that far: the raw peer's own provider refuses to post it.)
func TestHostileAtomics(t *testing.T) {
	needNotSiw(t, "siw has no atomics: its provider refuses the work request when it is posted")
	b := newHostileBed(t)
	for _, tc := range []struct {
		name   string
		access rdma.Access
		off    uint64
	}{
		{"a region without the right", rdma.RemoteRead | rdma.RemoteWrite, 0},
		{"past the region's end", rdma.RemoteAtomic | rdma.RemoteRead, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, sc := b.hostile(t)
			r, err := sc.(*rdma.Conn).RegisterRegion(4096, tc.access)
			require.NoError(t, err)
			defer r.Close()
			copy(r.Bytes(), "untouched")
			k := r.Key()
			wc := p.waitSend(p.rdma(opFetchAdd, k.Addr+tc.off, k.RKey, 8), 5*time.Second)
			t.Logf("the raw peer's atomic on %#x completed with %q", k.Addr+tc.off, ibv.StatusString(wc.Status))
			requireRefused(t, wc, "the server's NIC must refuse the atomic")
			got, err := readAll(sc)
			require.Empty(t, got)
			requireFailed(t, err, "read", syscall.ECONNRESET, "")
			p.requireDisconnected(t)
			require.Equal(t, "untouched", string(r.Bytes()[:9]))
		})
	}
	b.checkServing(t)
}

// TestHostileRingIsolation: a peer may write into its own connection's
// receive ring (the protocol grants it) but into no other: each
// connection's memory is in a protection domain of its own, so another
// connection's ring key, known or guessed, is worth nothing through this
// peer's QP, and that connection's unread data stays intact.
func TestHostileRingIsolation(t *testing.T) {
	b := newHostileBed(t)
	pa, sa := b.hostile(t)
	pb, sb := b.hostile(t)
	const msg = "for the second connection only"
	pb.requireSent(pb.send(wire.MsgData, 0, 0, []byte(msg))) // unread at offset 0 of its ring

	// Into its own ring: allowed, and only its own data could suffer.
	copy(pa.mem[rawRing:], bytes.Repeat([]byte("Z"), 64))
	wc := pa.waitSend(pa.write(pa.server.RingAddr, pa.server.RKey, 64), 5*time.Second)
	require.Equal(t, uint32(ibv.WCSuccess), wc.Status, "a write into its own receive ring")

	// Into the other connection's ring, with its real address and key.
	wc = pa.waitSend(pa.write(pb.server.RingAddr, pb.server.RKey, 64), 5*time.Second)
	t.Logf("a WRITE into another connection's ring completed with %q", ibv.StatusString(wc.Status))
	if !siw() {
		require.Equal(t, uint32(wcRemAccessErr), wc.Status, "another connection's ring must be out of reach")
	}
	_, err := readAll(sa)
	requireFailed(t, err, "read", syscall.ECONNRESET, "")
	pa.requireDisconnected(t)

	// The other connection never noticed.
	require.NoError(t, sb.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, 64)
	n, err := sb.Read(buf)
	require.NoError(t, err)
	require.Equal(t, msg, string(buf[:n]))
	_, err = sb.Write([]byte("still fine"))
	require.NoError(t, err)
	require.Equal(t, "still fine", string(pb.waitRecv(1, 5*time.Second)[0].data))
	b.checkServing(t)
}

// TestHostileOverrun: more data messages than the data credits granted,
// while the server does not read: the message beyond the grant lands in a
// receive kept for control messages or the fin, and is a violation.
func TestHostileOverrun(t *testing.T) {
	b := newHostileBed(t)
	p, sc := b.hostile(t)
	granted := int(p.server.RecvDepth)
	var want strings.Builder
	for i := range granted + 1 {
		msg := fmt.Sprintf("message %02d;", i)
		if i < granted {
			want.WriteString(msg)
		}
		p.requireSent(p.send(wire.MsgData, 0, 0, []byte(msg)))
	}
	// The server must not read (and so return credits) before it has
	// handled all of them: a credit returned before the 17th arrives would
	// make it legitimate, as far as the server can tell. The NIC completed
	// each receive before acknowledging it, so the 17th follows the 16th
	// in the server's completion queue.
	require.Eventually(t, func() bool {
		return sc.(*rdma.Conn).Stats().MessagesReceived == uint64(granted)
	}, 5*time.Second, time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	got, err := readAll(sc)
	t.Logf("the server read %q, then: %v", got, err)
	if !strings.HasPrefix(want.String(), string(got)) || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the server accepted %d data messages on %d data credits as if they were granted (the excess one "+
			"landed in a receive kept for credit messages or the fin), and its Read then ended with: %v",
			strings.Count(string(got), ";"), granted, err)
	}
	requireFailed(t, err, "read", rdma.ErrProtocol, "overran")
	requireFailed(t, writeUntilFails(sc), "write", rdma.ErrProtocol, "overran")
	p.requireDisconnected(t)
	b.checkServing(t)
}

// TestHalfOpenFlood: a flood of connect requests that never complete the
// handshake (no RTU) must neither pin unbounded memory nor lock out
// legitimate clients: while it is held, a Dial connects within a second,
// and the devices hold at most 32 connections' worth of registered memory
// beyond the legitimate pair's.
//
// "Held" means the flood is stale: the listener has answered every request
// and the requests are older than any handshake in progress (two seconds),
// so a listener may keep a recent half-open request a little while in
// case its RTU is on the way. What a Dial right after the flood gets is
// logged, not required.
func TestHalfOpenFlood(t *testing.T) {
	needDevice(t)
	needNotSiw(t, "iWARP's connect must name a QP of the dialer's own (iw_cm looks it up), so this flood of QP-less requests cannot be sent")
	n := 500
	if testing.Short() {
		n = 100
	}
	baseConns, baseReg := deviceTotals()
	per, err := rdma.Options{}.RegisteredMemory()
	require.NoError(t, err)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	addr := ln.Addr().String()
	wg := serveEcho(ln)
	defer func() {
		ln.Close()
		wg.Wait()
		waitDeviceTotals(t, baseConns, baseReg)
	}()
	d := rdma.Dialer{Timeout: 10 * time.Second}
	dial := func() (net.Conn, time.Duration, error) {
		start := time.Now()
		c, err := d.Dial("rdma", addr)
		return c, time.Since(start), err
	}

	start := time.Now()
	flood := floodHalfOpen(t, addr, n)
	defer flood.close()
	sent := time.Since(start)
	c, took, err := dial()
	if err == nil {
		c.Close()
	}
	t.Logf("%v sent in %v; a Dial right after them: %v in %v", flood, sent.Round(time.Millisecond), err, took.Round(time.Millisecond))

	// Until the listener has answered the flood (its connections and
	// registered memory stop changing) and the flood is stale.
	conns, reg := deviceTotals()
	peak := reg
	for stable, deadline := 0, time.Now().Add(30*time.Second); (stable < 10 || time.Since(start) < 2*time.Second) && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		c, r := deviceTotals()
		peak = max(peak, r)
		if c == conns && r == reg {
			stable++
		} else {
			stable, conns, reg = 0, c, r
		}
	}
	t.Logf("the listener holds %d connections and %d MiB registered %v after the flood began (peak %d MiB)",
		conns-baseConns, (reg-baseReg)>>20, time.Since(start).Round(time.Millisecond), (peak-baseReg)>>20)

	// The listener keeps 32 MiB of half-open connections (128 of the
	// default 256 KiB), or 32 of them if that is more.
	limit := max(32*per, 32<<20)
	c, took, err = dial()
	if err != nil {
		t.Errorf("a legitimate Dial while the flood is held failed after %v: %v", took.Round(time.Millisecond), err)
	} else {
		defer c.Close()
		t.Logf("a legitimate Dial while the flood is held connected in %v", took.Round(time.Millisecond))
		if took > time.Second {
			t.Errorf("a legitimate Dial while the flood is held took %v, want at most 1s", took.Round(time.Millisecond))
		}
		roundTrip(t, c, "legitimate")
		limit += 2 * per // the legitimate connection's two ends
	}
	_, reg = deviceTotals()
	if reg-baseReg > limit {
		t.Errorf("while %v are held the devices have %d MiB registered (%d connections' worth), want at most %d MiB: "+
			"32 MiB of half-open connections of %d KiB each, plus the legitimate pair if it connected",
			flood, (reg-baseReg)>>20, (reg-baseReg)/per, limit>>20, per>>10)
	}
}

// requireRefused checks that the raw peer's send completed with an error:
// the server's NIC refused it. On iWARP a SEND or RDMA WRITE completes once
// it is on the wire, and the responder refuses it by terminating the
// connection instead, which the tests check next.
func requireRefused(t *testing.T, wc ibv.WC, msg string) {
	t.Helper()
	if !siw() {
		require.NotEqual(t, uint32(ibv.WCSuccess), wc.Status, msg)
	}
}

// TestHostileMisplacedDataAfterEarlierClients: the receiver places a
// message in its ring where the length its peer announces puts it, not
// where the bytes went; the ring a server's connection gets may be a
// closed connection's (the device's pool). Earlier clients stream a marker
// through a server that keeps another client connected (so the device and
// its pool stay), then a raw peer announces data and writes it elsewhere
// in the ring: what the echo returns must not hold a byte of the earlier
// clients'. With the pool's arenas scrubbed, it is zeros.
func TestHostileMisplacedDataAfterEarlierClients(t *testing.T) {
	b := newHostileBed(t)
	marker := bytes.Repeat([]byte("MARKER-"), 1024/7+1)[:1024]
	before, _ := deviceStat()
	for i := range 4 {
		c, err := rdma.Dial("rdma", b.addr)
		require.NoError(t, err)
		b.echo(b.next(t))
		got := make([]byte, len(marker))
		// Round trips of 1 KiB: the server's ring fills with the
		// marker, wrapping, without the traffic growing the rings.
		for range 64 {
			_, err := c.Write(marker)
			require.NoError(t, err)
			_, err = io.ReadFull(c, got)
			require.NoError(t, err)
			require.Equal(t, marker, got, "client %d", i)
		}
		require.NoError(t, c.Close())
	}
	// Both ends of the earlier clients are closed: their arenas are kept.
	waitDevice(t, "the earlier clients' arenas kept", func(d rdma.DeviceStats, listed bool) bool {
		return listed && d.Connections == before.Connections && d.PooledBytes > 0
	})

	p, sc := b.hostile(t)
	b.echo(sc)
	const n = 1024
	start := wire.RingPlace(p.txTail, p.span, p.maxMsg)
	p.txTail = wire.RingEnd(start, n)
	elsewhere := (start + uint64(p.span)/2) % uint64(p.span)
	p.waitSend(p.writeImm(p.server.RingAddr+elsewhere, p.server.RKey, wire.MsgData, 0, 0, bytes.Repeat([]byte{'x'}, n)), 5*time.Second)
	var echo []byte
	for deadline := time.Now().Add(5 * time.Second); len(echo) < n; {
		p.poll()
		echo = echo[:0]
		for _, m := range p.recvd {
			echo = append(echo, m.data...)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the echo brought %d bytes in 5s, want %d", len(echo), n)
		}
		time.Sleep(time.Millisecond)
	}
	require.False(t, bytes.Contains(echo, []byte("MARKER")), "the echo holds an earlier client's bytes: %q", echo[:64])
	require.Equal(t, make([]byte, n), echo, "a pooled ring is cleared before it serves again")
	b.checkServing(t)
}

// TestHostilePooledRingRekeyed: an accepted connection's arena goes to the
// device's pool without its QP; when the next accepted connection gets the
// same ring, the key the past peer knew no longer works on it (rekeyed),
// even though the next QP in its PD may be given the past QP's number.
func TestHostilePooledRingRekeyed(t *testing.T) {
	b := newHostileBed(t)
	before, _ := deviceStat()
	p, sc := b.hostile(t)
	addr, key := p.server.RingAddr, p.server.RKey
	p.close()
	sc.Close()
	waitDevice(t, "the raw peer's server arena kept", func(d rdma.DeviceStats, listed bool) bool {
		return listed && d.Connections == before.Connections && d.PooledBytes > 0
	})
	q, _ := b.hostile(t)
	require.Equal(t, addr, q.server.RingAddr, "the next accepted connection has the pooled ring")
	require.NotEqual(t, key, q.server.RKey, "a pooled ring keeps the key its past peer knew")
	b.checkServing(t)
}
