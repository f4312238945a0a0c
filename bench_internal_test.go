package rdma

// The library's own Go cost per message, over a fake QP whose posts cost
// nothing: what carries over to a real NIC, where a post is no system call
// and the NIC does the rest. Each benchmark plays the peer (its credits,
// its messages, its NIC's completions) as the device would, and nothing
// in them waits: ns/op is the CPU of one side's Go work per message.

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// benchQP stands in for the QP and for what the peer learns from our
// posts: the headers' credits and acknowledgements, the last signaled
// send. One-sided operations complete as they are posted.
type benchQP struct {
	c         *Conn
	posts     int
	dataOut   int    // our data messages the peer has not given credits back for
	ctrlOut   int    // our credit messages the peer has not acknowledged
	grant     int    // data messages the peer may send us (our receives it knows of)
	peerCtrl  int    // credit messages the peer may send us
	lastSig   uint64 // the last signaled send's id
	oneSided  bool   // complete one-sided operations at once
	recvPosts int
}

func (q *benchQP) PostSends(wrs []ibv.SendWR) error {
	q.posts++
	for i := range wrs {
		wr := &wrs[i]
		if wr.ID&wrSend == 0 {
			if q.oneSided {
				q.c.complete(ibv.WC{WRID: wr.ID})
			}
			continue
		}
		h := wire.HeaderOf(wr.Imm)
		q.grant += int(h.Credits)
		q.peerCtrl += int(h.CtrlAck)
		switch h.Type {
		case wire.MsgData, wire.MsgDataMore:
			q.dataOut++
		case wire.MsgCredit:
			q.ctrlOut++
		}
		if wr.Flags&ibv.SendSignaled != 0 {
			q.lastSig = wr.ID
		}
	}
	return nil
}

func (q *benchQP) PostRecvs(wrs []ibv.RecvWR) error {
	q.recvPosts += len(wrs)
	return nil
}

// benchConn is an established Conn over a benchQP, with the default
// Options but for the poll mode (nothing waits here).
func benchConn(b testing.TB) (*Conn, *benchQP) {
	opts, err := Options{Poll: PollEvent}.normalized()
	if err != nil {
		b.Fatal(err)
	}
	lay := newLayout(opts)
	c := newConn(phaseEstablished)
	q := &benchQP{c: c}
	c.mu.Lock()
	if err := c.initDataPath(q, make([]byte, lay.size()), lay, testBase+uint64(lay.sendOff()), testLKey, 0, opts, nopSpinner{}); err != nil {
		b.Fatal(err)
	}
	c.open(wire.Hello{RecvDepth: uint16(opts.RecvDepth), CtrlDepth: wire.CtrlDepth, BufSize: uint32(opts.BufferSize),
		RingSize: uint32(lay.ring), RingAddr: testRAddr, RKey: testRKey}, lay)
	c.mu.Unlock()
	q.grant = lay.recvSlots - wire.CtrlDepth - wire.FinSlots
	q.peerCtrl = wire.CtrlDepth
	return c, q
}

// complete hands a completion to the Conn as the poller does.
func (q *benchQP) complete(wc ibv.WC) {
	if q.c.complete(wc) {
		q.c.lockAndFlush()
	}
}

// peerSends delivers a message of the peer's, carrying every credit and
// acknowledgement it owes us, and its NIC's completion of our sends.
func (q *benchQP) peerSends(typ uint8, n int) {
	h := wire.Header{Type: typ, Credits: uint16(q.dataOut), CtrlAck: uint8(q.ctrlOut)}
	q.dataOut, q.ctrlOut = 0, 0
	op := uint32(ibv.WCOpRecv)
	if typ == wire.MsgData {
		op = ibv.WCOpRecvWriteImm
		q.grant--
	} else {
		q.peerCtrl--
	}
	if q.lastSig != 0 {
		q.complete(ibv.WC{WRID: q.lastSig})
		q.lastSig = 0
	}
	q.complete(ibv.WC{WRID: recvWRID, Opcode: op, ByteLen: uint32(n), Imm: h.Imm(), Flags: ibv.WCWithImm})
}

// BenchmarkGoWrite64 is a 64 B Write posted at once (SetNoDelay), the
// peer's credit message coming back every 8 Writes, as its Reads keep up.
func BenchmarkGoWrite64(b *testing.B) { benchWrites(b, true, 8) }

// benchWrites times 64 B Writes (SetNoDelay(noDelay)), the peer's credit
// message coming back, with every credit and the ring, every catchUp
// Writes.
func benchWrites(b *testing.B, noDelay bool, catchUp int) {
	c, q := benchConn(b)
	c.SetNoDelay(noDelay)
	msg := make([]byte, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if i++; i%catchUp == 0 {
			q.peerSends(wire.MsgCredit, 0)
		}
	}
	b.ReportMetric(float64(q.posts)/float64(i), "posts/op")
}

// BenchmarkWriteGather is a 64 B Write that gathers: the peer is behind
// (the default hold, no SetNoDelay), and catches up every 64 Writes (4
// KiB: a quarter of the small ring a connection starts with, which this
// one never grows; with 8 KiB between catch-ups the gathered message
// outgrows the room this peer gives back, and the Write waits forever),
// returning every credit and its ring. It used to wait forever
// once b.N passed about 2,000: its peer never gave the ring back.
func BenchmarkWriteGather(b *testing.B) { benchWrites(b, false, 64) }

// BenchmarkGoRead64 is a 64 B message of the peer's arriving and a Read
// taking it; credits go back in batches, as they do.
func BenchmarkGoRead64(b *testing.B) {
	c, q := benchConn(b)
	buf := make([]byte, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		q.peerSends(wire.MsgData, 64)
		if n, err := c.Read(buf); n != 64 || err != nil {
			b.Fatal(n, err)
		}
		i++
	}
	b.ReportMetric(float64(q.posts)/float64(i), "posts/op")
}

// BenchmarkGoRoundTrip64 is one side's Go work in a request-response round
// trip of 64 B: a Write, the peer's answer (carrying the credit back)
// arriving, and a Read of it.
func BenchmarkGoRoundTrip64(b *testing.B) {
	c, q := benchConn(b)
	buf := make([]byte, 64)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		q.peerSends(wire.MsgData, 64)
		if n, err := c.Read(buf); n != 64 || err != nil {
			b.Fatal(n, err)
		}
		i++
	}
	b.ReportMetric(float64(q.posts)/float64(i), "posts/op")
}

// BenchmarkGoOneSided64 is a 64 B RDMA READ into a registered region,
// posted and completed.
func BenchmarkGoOneSided64(b *testing.B) {
	c, q := benchConn(b)
	q.oneSided = true
	local := fakeRegion(c, 4096)
	remote := c.Remote(RemoteKey{Addr: 0x900000, Size: 1 << 20, RKey: 5, Access: RemoteRead | RemoteWrite})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := remote.ReadAtContext(ctx, local, 0, 64, 128); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGoWriteTo is a message of the peer's arriving and WriteTo
// handing it to a Writer (which stops the call once it has it, so each
// op is one WriteTo call, as one io.Copy(w, conn) makes): its per-byte
// cost, and what a call allocates (the Writer's error, wrapped, is one
// allocation). 8192 is the largest message of the small ring a
// connection starts with.
func BenchmarkGoWriteTo(b *testing.B) {
	for _, size := range []int{64, 4096, 8192} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			c, q := benchConn(b)
			w := writerFunc(func(p []byte) (int, error) { return len(p), errBenchStop })
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				q.peerSends(wire.MsgData, size)
				if n, err := c.WriteTo(w); n != int64(size) || !errors.Is(err, errBenchStop) {
					b.Fatal(n, err)
				}
			}
		})
	}
}

var errBenchStop = errors.New("enough")

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(b []byte) (int, error) { return f(b) }

// BenchmarkGoReadFrom is ReadFrom taking one Read of its Reader (which
// stops the call there) and sending it as a message, the peer's credit
// message coming back after each (a ReadFrom waits for room for a whole
// message before it reads, and the small ring holds two of 8 KiB).
func BenchmarkGoReadFrom(b *testing.B) {
	for _, size := range []int{64, 4096, 8192} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			c, q := benchConn(b)
			r := readerFunc(func(p []byte) (int, error) { return size, errBenchStop })
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				if n, err := c.ReadFrom(r); n != int64(size) || !errors.Is(err, errBenchStop) {
					b.Fatal(n, err)
				}
				q.peerSends(wire.MsgCredit, 0)
			}
		})
	}
}
