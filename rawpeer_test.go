//go:build linux && cgo

package rdma_test

import (
	"fmt"
	"net/netip"
	"os/exec"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// A raw peer: an rdma_cm client built directly on the internal packages,
// that dials a real rdma.Listener with this package's hello and then sends
// whatever a test tells it to, protocol or not (hostile_test.go). And a
// half-open flood: connect requests whose handshake is never completed.

// The raw peer's geometry: what its hello grants the server (its receive
// ring, which the server writes into), and the send area, large enough for
// a message bigger than the server's default BufferSize.
const (
	rawRecvDepth = 16
	rawBufSize   = 4096
	rawRing      = 16 << 10
	rawRecvSlots = rawRecvDepth + wire.CtrlDepth + wire.FinSlots
	rawSendArea  = 128 << 10
	rawSendWRID  = 1 << 63 // send work request ids; receives' are 0
	rawCQE       = 256
	rawSendWR    = 64
	rawHdrOff    = rawRing + rawSendArea // header slots, on a transport without immediate data
	rawMem       = rawHdrOff + 4096      // rawRecvSlots header slots of ibv.HeaderSlot bytes
)

// rawMsg is a message the raw peer received (or a failed receive).
type rawMsg struct {
	status  uint32
	typ     uint8
	ctrlAck uint8
	credits uint16
	data    []byte
}

// rawPeer is one raw connection: its own event channel (Run on a goroutine
// of its own), id, PD, polled CQ, registered memory and RC QP.
type rawPeer struct {
	t       testing.TB
	ch      *rdmacm.EventChannel
	runDone chan struct{}
	events  chan rdmacm.Event
	id      *rdmacm.ID
	pd      *ibv.PD
	cq      *ibv.CQ
	mem     []byte  // mmap'd: the receive ring, then the send area
	ringMR  *ibv.MR // the receive ring: remote write
	mr      *ibv.MR // the send area: local only
	qp      *ibv.QP
	ownQP   unsafe.Pointer // the QP, made by the raw peer (see dialRaw)
	server  wire.Hello     // the listener's hello
	span    int            // ring bytes both sides use
	maxMsg  int            // the largest message both sides agreed on
	txTail  uint64         // where our messages end in the server's ring
	rxTail  uint64         // where the server's end in ours

	established bool // the id took the QP
	// headers: the transport has no immediate data (iWARP): headers go
	// as SEND payloads, into a slot per receive (rxSlot is the next).
	headers bool
	rxSlot  int

	seq     uint64             // sends posted
	sendWCs map[uint64]ibv.WC  // completed sends, by id
	recvd   []rawMsg           // received messages, in order
	other   []rdmacm.EventType // events seen while waiting for others
}

// dialRaw connects a raw peer to the listener at addr and waits for the
// handshake to complete. Its teardown is registered with t.Cleanup; close
// may be called earlier.
func dialRaw(t testing.TB, addr string) *rawPeer {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatalf("raw peer: address %q: %v", addr, err)
	}
	p := &rawPeer{t: t, events: make(chan rdmacm.Event, 64), sendWCs: map[uint64]ibv.WC{}}
	t.Cleanup(p.close)
	fatal := func(what string, err error) {
		t.Helper()
		t.Fatalf("raw peer: %s: %v", what, err)
	}
	if p.ch, err = rdmacm.NewEventChannel(); err != nil {
		fatal("event channel", err)
	}
	p.runDone = make(chan struct{})
	go func() {
		defer close(p.runDone)
		p.ch.Run(func(ev rdmacm.Event) {
			select {
			case p.events <- ev:
			default: // a test that ignores its events loses the surplus
			}
		})
	}()
	if p.id, err = rdmacm.NewID(p.ch, 1); err != nil {
		fatal("id", err)
	}
	if err := p.id.ResolveAddr(netip.Addr{}, ap, 2000); err != nil {
		fatal("resolve address", err)
	}
	p.expectEvent(rdmacm.EventAddrResolved, 5*time.Second)
	if err := p.id.ResolveRoute(2000); err != nil {
		fatal("resolve route", err)
	}
	p.expectEvent(rdmacm.EventRouteResolved, 5*time.Second)

	ctx := ibv.ContextFrom(p.id.Verbs())
	p.headers = ctx.IWARP()
	if p.pd, err = ctx.AllocPD(); err != nil {
		fatal("PD", err)
	}
	if p.cq, err = ctx.CreatePolledCQ(rawCQE); err != nil {
		fatal("CQ", err)
	}
	if p.mem, err = unix.Mmap(-1, 0, rawMem, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		fatal("mmap", err)
	}
	if p.ringMR, err = p.pd.RegMRRemoteWrite(p.mem[:rawRing]); err != nil {
		fatal("ring MR", err)
	}
	if p.mr, err = p.pd.RegMR(p.mem[rawRing:]); err != nil {
		fatal("MR", err)
	}
	// A QP of its own making: the handshake would leave it no RDMA READ
	// or atomic outstanding (the listener grants no responder resources),
	// and hostile_test.go tries them on the listener anyway.
	if p.ownQP, err = p.id.CreateOwnQP(p.pd.Ptr(), p.cq.Ptr(), rawSendWR, rawRecvSlots); err != nil {
		fatal("QP", err)
	}
	p.qp = ibv.QPFrom(p.ownQP)
	for range rawRecvSlots {
		if err := p.repost(); err != nil {
			fatal("post receive", err)
		}
	}
	var flags uint8
	if p.headers {
		flags = wire.HelloHeaders
	}
	h := wire.Hello{Flags: flags, RecvDepth: rawRecvDepth, CtrlDepth: wire.CtrlDepth, BufSize: rawBufSize,
		RingSize: rawRing, RingAddr: p.addr(0), RKey: p.ringMR.RKey}.Marshal()
	if err := p.id.ConnectNoQP(h, p.qp.Num); err != nil {
		fatal("connect", err)
	}
	if p.headers {
		// iWARP: iw_cm moves the named QP through its states itself and
		// reports the connection established, with the listener's hello;
		// the QP stays ours.
		ev := p.expectEvent(rdmacm.EventEstablished, 10*time.Second)
		if p.server, err = wire.ParseHello(ev.PrivateData); err != nil {
			fatal("the listener's hello", err)
		}
	} else {
		ev := p.expectEvent(rdmacm.EventConnectResponse, 10*time.Second)
		if p.server, err = wire.ParseHello(ev.PrivateData); err != nil {
			fatal("the listener's hello", err)
		}
		if err := p.id.EstablishOwnQP(p.ownQP, 1); err != nil {
			fatal("establish", err)
		}
		p.established = true
	}
	p.span, p.maxMsg = wire.RingGeometry(rawRing, rawBufSize, int(p.server.RingSize), int(p.server.BufSize))
	if p.headers {
		// iWARP: the initiator's first message, without which the
		// listener does not hand the connection to Accept, repeated
		// until the listener's answer comes, which the tests do not see
		// (see Conn.initiatorFirst).
		for try := 0; len(p.recvd) == 0; try++ {
			if try == wire.CtrlDepth {
				t.Fatalf("raw peer: the listener did not answer %d first messages", try)
			}
			p.requireSent(p.sendSEND(wire.MsgCredit, 0, 0, nil))
			for deadline := time.Now().Add(time.Duration(50<<(2*try)) * time.Millisecond); len(p.recvd) == 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
				p.poll()
			}
		}
		p.recvd = p.recvd[:0]
	}
	return p
}

// expectEvent waits for the next CM event and fails the test unless it is
// of type want.
func (p *rawPeer) expectEvent(want rdmacm.EventType, within time.Duration) rdmacm.Event {
	p.t.Helper()
	select {
	case ev := <-p.events:
		if ev.Type != want {
			p.t.Fatalf("raw peer: got CM event %v (status %d), want %v", ev.Type, ev.Status, want)
		}
		return ev
	case <-time.After(within):
		p.t.Fatalf("raw peer: no CM event in %v, want %v", within, want)
	}
	return rdmacm.Event{}
}

// waitEvent waits up to within for a CM event of type want, remembering
// the others it sees; it reports whether want came.
func (p *rawPeer) waitEvent(want rdmacm.EventType, within time.Duration) bool {
	timeout := time.After(within)
	for {
		select {
		case ev := <-p.events:
			if ev.Type == want {
				return true
			}
			p.other = append(p.other, ev.Type)
		case <-timeout:
			return false
		}
	}
}

// repost posts a receive again: zero-length, as the protocol's are.
func (p *rawPeer) repost() error {
	if !p.headers {
		return p.qp.PostRecvs([]ibv.RecvWR{{}})
	}
	s := p.rxSlot
	p.rxSlot = (p.rxSlot + 1) % rawRecvSlots
	return p.qp.PostRecvs([]ibv.RecvWR{{ID: uint64(s), Addr: p.addr(rawHdrOff + s*ibv.HeaderSlot), Len: ibv.HeaderSlot, LKey: p.mr.LKey}})
}

// addr is the NIC's address of p.mem[off].
func (p *rawPeer) addr(off int) uint64 { return uint64(uintptr(unsafe.Pointer(&p.mem[off]))) }

// send posts a message whose immediate data is the header (typ, ctrlAck,
// credits), as the protocol sends it: a data message with payload as a
// signaled RDMA WRITE with immediate into the server's ring where the
// placement rule puts it, anything else as a SEND of data (none, for a
// message that follows the protocol). It returns the send's id.
func (p *rawPeer) send(typ, ctrlAck uint8, credits uint16, data []byte) uint64 {
	p.t.Helper()
	if (typ == wire.MsgData || typ == wire.MsgDataMore) && len(data) > 0 {
		start := wire.RingPlace(p.txTail, p.span, p.maxMsg)
		p.txTail = wire.RingEnd(start, len(data))
		return p.writeImm(p.server.RingAddr+start%uint64(p.span), p.server.RKey, typ, ctrlAck, credits, data)
	}
	return p.sendSEND(typ, ctrlAck, credits, data)
}

// stage copies data into the send area and returns its address.
func (p *rawPeer) stage(data []byte) uint64 {
	p.t.Helper()
	if len(data) > rawSendArea {
		p.t.Fatalf("raw peer: %d bytes do not fit the send area", len(data))
	}
	copy(p.mem[rawRing:], data)
	return p.addr(rawRing)
}

// sendSEND posts a signaled SEND with immediate data and payload data (on
// a transport without immediate data, a SEND of the header and its length
// 0, followed by data).
func (p *rawPeer) sendSEND(typ, ctrlAck uint8, credits uint16, data []byte) uint64 {
	p.t.Helper()
	p.seq++
	id := rawSendWRID | p.seq
	wr := ibv.SendWR{ID: id, Addr: p.stage(data), Len: uint32(len(data)), LKey: p.mr.LKey, Flags: ibv.SendSignaled,
		Imm: wire.Header{Type: typ, CtrlAck: ctrlAck, Credits: credits}.Imm()}
	if p.headers {
		wr = ibv.SendWR{ID: id, Flags: ibv.SendSignaled | ibv.SendHeader, Imm: wr.Imm}
		if len(data) > 0 {
			b := make([]byte, ibv.HeaderLen, ibv.HeaderLen+len(data))
			wire.PutHeaderSlot(b, wire.Header{Type: typ, CtrlAck: ctrlAck, Credits: credits}, 0)
			b = append(b, data...)
			wr = ibv.SendWR{ID: id, Addr: p.stage(b), Len: uint32(len(b)), LKey: p.mr.LKey, Flags: ibv.SendSignaled | ibv.SendPlain}
		}
	}
	if err := p.qp.PostSends([]ibv.SendWR{wr}); err != nil {
		p.t.Fatalf("raw peer: post send: %v", err)
	}
	return id
}

// writeImm posts a signaled RDMA WRITE with immediate data of data to
// raddr in the server's region of rkey.
func (p *rawPeer) writeImm(raddr uint64, rkey uint32, typ, ctrlAck uint8, credits uint16, data []byte) uint64 {
	p.t.Helper()
	p.seq++
	id := rawSendWRID | p.seq
	wr := ibv.SendWR{ID: id, Addr: p.stage(data), Len: uint32(len(data)), LKey: p.mr.LKey, Flags: ibv.SendSignaled | ibv.SendWriteImm,
		Imm: wire.Header{Type: typ, CtrlAck: ctrlAck, Credits: credits}.Imm(), RemoteAddr: raddr, RKey: rkey}
	wrs := []ibv.SendWR{wr}
	if p.headers {
		// The payload by RDMA WRITE, then the header (and length) by SEND.
		write := wr
		write.Flags, write.Imm = ibv.SendWrite, 0
		wrs = []ibv.SendWR{write, {ID: id, Len: uint32(len(data)), Flags: ibv.SendSignaled | ibv.SendHeader, Imm: wr.Imm}}
	}
	if err := p.qp.PostSends(wrs); err != nil {
		p.t.Fatalf("raw peer: post write with immediate: %v", err)
	}
	return id
}

// rdmaOp is a one-sided operation a hostile peer may try on the server's
// memory.
type rdmaOp int

const (
	opWrite rdmaOp = iota
	opRead
	opFetchAdd
)

func (o rdmaOp) String() string {
	return [...]string{"RDMA WRITE", "RDMA READ", "atomic fetch-and-add"}[o]
}

// write posts a signaled RDMA WRITE of n bytes to raddr in the peer's
// region of rkey, and returns its id.
func (p *rawPeer) write(raddr uint64, rkey uint32, n int) uint64 {
	return p.rdma(opWrite, raddr, rkey, n)
}

// rdma posts a signaled one-sided operation on n bytes (8 for the atomic)
// at raddr in the peer's region of rkey, and returns its id.
func (p *rawPeer) rdma(op rdmaOp, raddr uint64, rkey uint32, n int) uint64 {
	p.t.Helper()
	p.seq++
	id := rawSendWRID | p.seq
	wr := ibv.WriteWR{ID: id, Addr: p.addr(rawRing), Len: uint32(n), LKey: p.mr.LKey, RemoteAddr: raddr, RKey: rkey, Flags: ibv.SendSignaled}
	var err error
	switch op {
	case opWrite:
		err = p.qp.PostWrite(wr)
	case opRead:
		err = p.qp.PostRead(wr)
	case opFetchAdd:
		wr.Len = 8
		err = p.qp.PostFetchAdd(wr, 1)
	}
	if err != nil {
		p.t.Fatalf("raw peer: post %v: %v", op, err)
	}
	return id
}

// poll takes what the CQ has: completed sends by id, received messages in
// order (each buffer posted again at once, so the server never meets a
// receiver that is not ready; credits are never returned).
func (p *rawPeer) poll() {
	var wcs [ibv.MaxPollBatch]ibv.WC
	for {
		n, err := p.cq.Poll(wcs[:])
		if err != nil {
			p.t.Fatalf("raw peer: poll: %v", err)
		}
		for _, wc := range wcs[:n] {
			if wc.WRID&rawSendWRID != 0 {
				p.sendWCs[wc.WRID] = wc
				continue
			}
			m := rawMsg{status: wc.Status}
			if wc.Status != ibv.WCSuccess && wc.Status != ibv.WCFlushErr {
				p.t.Logf("raw peer: a receive completed with %q", ibv.StatusString(wc.Status))
			}
			if wc.Status == ibv.WCSuccess {
				h, n, write := wire.HeaderOf(wc.Imm), wc.ByteLen, wc.Opcode == ibv.WCOpRecvWriteImm
				var inline []byte
				if p.headers {
					slot := p.mem[rawHdrOff+int(wc.WRID)*ibv.HeaderSlot:]
					h, n = wire.ParseHeaderSlot(slot)
					write = n > 0
					if wc.ByteLen > ibv.HeaderLen { // a small message's data came in the SEND
						inline = slot[ibv.HeaderLen:wc.ByteLen]
					}
				}
				wc.ByteLen = n
				m.typ, m.ctrlAck, m.credits = h.Type, h.CtrlAck, h.Credits
				if write {
					if inline != nil {
						start := wire.RingPlace(p.rxTail, p.span, p.maxMsg)
						off := int(start % uint64(p.span))
						copy(p.mem[off:off+len(inline)], inline)
					}
					// The server placed it in our ring as the rule
					// says (we never read so slowly that it wraps
					// over unread bytes: the tests send little).
					start := wire.RingPlace(p.rxTail, p.span, p.maxMsg)
					p.rxTail = wire.RingEnd(start, int(wc.ByteLen))
					off := int(start % uint64(p.span))
					m.data = append([]byte(nil), p.mem[off:off+int(wc.ByteLen)]...)
				}
				if err := p.repost(); err != nil {
					p.t.Fatalf("raw peer: post receive: %v", err)
				}
			}
			p.recvd = append(p.recvd, m)
		}
		if n < len(wcs) {
			return
		}
	}
}

// waitSend polls until the send id completes and returns its completion.
func (p *rawPeer) waitSend(id uint64, within time.Duration) ibv.WC {
	p.t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(time.Millisecond) {
		p.poll()
		if wc, ok := p.sendWCs[id]; ok {
			return wc
		}
		if time.Now().After(deadline) {
			// The device's counters say why the NIC did not acknowledge
			// (retries, RNR NAKs, packets dropped).
			stats, _ := exec.Command("rdma", "statistic", "show").CombinedOutput()
			p.t.Fatalf("raw peer: send %#x did not complete in %v; the device's counters: %s", id, within, stats)
		}
	}
}

// violate is for a send that breaks the protocol: the server fails the
// connection on it, and may move its QP to the error state before its NIC
// has acknowledged the send (rxe completes the receive, then acknowledges
// it), so the send may complete with success, with an error, or only
// after retries; what the tests check is the server's reaction.
func (p *rawPeer) violate(id uint64) { _ = id }

// requireSent waits for the send id and fails the test unless the peer's
// NIC acknowledged it.
func (p *rawPeer) requireSent(id uint64) {
	p.t.Helper()
	if wc := p.waitSend(id, 5*time.Second); wc.Status != ibv.WCSuccess {
		p.t.Fatalf("raw peer: send %#x failed: %s", id, ibv.StatusString(wc.Status))
	}
}

// waitRecv polls until n messages have arrived in all and returns them.
func (p *rawPeer) waitRecv(n int, within time.Duration) []rawMsg {
	p.t.Helper()
	for deadline := time.Now().Add(within); len(p.recvd) < n; time.Sleep(time.Millisecond) {
		p.poll()
		if time.Now().After(deadline) {
			p.t.Fatalf("raw peer: %d messages arrived in %v, want %d", len(p.recvd), within, n)
		}
	}
	return p.recvd
}

// close disconnects and releases everything, in the order the verbs
// require; it is idempotent and copes with a half-built peer.
func (p *rawPeer) close() {
	if p.id != nil && p.qp != nil {
		p.id.Disconnect()
		if p.established {
			p.id.DestroyQP()
		} else {
			rdmacm.DestroyOwnQP(p.ownQP)
		}
		p.qp = nil
	}
	if p.cq != nil {
		p.cq.Destroy()
		p.cq = nil
	}
	if p.mr != nil {
		p.mr.Dereg()
		p.mr = nil
	}
	if p.ringMR != nil {
		p.ringMR.Dereg()
		p.ringMR = nil
	}
	if p.mem != nil {
		unix.Munmap(p.mem)
		p.mem = nil
	}
	if p.pd != nil {
		p.pd.Dealloc()
		p.pd = nil
	}
	if p.id != nil {
		p.id.Destroy()
		p.id = nil
	}
	if p.ch != nil {
		p.ch.Interrupt()
		<-p.runDone
		p.ch.Destroy()
		p.ch = nil
	}
}

// halfOpen is a flood of connect requests that are never completed: ids
// that resolved address and route and sent rdma_connect with this
// package's hello but have no QP (the request names a made-up QP number),
// and whose CM events are never read again, so no RTU ever goes to the
// listener. The listener accepts them and waits for the RTU until its CM
// gives up (a minute or more) or the request is withdrawn (close destroys
// the ids, which rejects them).
type halfOpen struct {
	ch  *rdmacm.EventChannel
	ids []*rdmacm.ID
}

// floodHalfOpen sends n half-open connect requests to addr. Its teardown is
// registered with t.Cleanup; close may be called earlier.
func floodHalfOpen(t testing.TB, addr string, n int) *halfOpen {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatalf("half-open: address %q: %v", addr, err)
	}
	f := &halfOpen{}
	t.Cleanup(f.close)
	if f.ch, err = rdmacm.NewEventChannel(); err != nil {
		t.Fatalf("half-open: event channel: %v", err)
	}
	// Read events only until every route is resolved.
	events := make(chan rdmacm.Event, 2*n+16)
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		f.ch.Run(func(ev rdmacm.Event) {
			select {
			case events <- ev:
			default:
			}
		})
	}()
	stopped := false
	stopRun := func() {
		if !stopped {
			stopped = true
			f.ch.Interrupt()
			<-runDone
		}
	}
	defer stopRun()
	await := func(want rdmacm.EventType) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for got := 0; got < n; got++ {
			select {
			case ev := <-events:
				if ev.Type != want {
					t.Fatalf("half-open: CM event %v (status %d) while waiting for %v", ev.Type, ev.Status, want)
				}
			case <-timeout:
				t.Fatalf("half-open: %d of %d ids got %v in 30s", got, n, want)
			}
		}
	}
	for i := range n {
		id, err := rdmacm.NewID(f.ch, uintptr(i+1))
		if err != nil {
			t.Fatalf("half-open: id %d: %v", i, err)
		}
		f.ids = append(f.ids, id)
		if err := id.ResolveAddr(netip.Addr{}, ap, 5000); err != nil {
			t.Fatalf("half-open: resolve address %d: %v", i, err)
		}
	}
	await(rdmacm.EventAddrResolved)
	for i, id := range f.ids {
		if err := id.ResolveRoute(5000); err != nil {
			t.Fatalf("half-open: resolve route %d: %v", i, err)
		}
	}
	await(rdmacm.EventRouteResolved)
	stopRun()
	// A valid hello whose ring no one will ever write: there is no QP.
	h := wire.Hello{RecvDepth: rawRecvDepth, CtrlDepth: wire.CtrlDepth, BufSize: rawBufSize,
		RingSize: rawRing, RingAddr: 0x10000, RKey: 1}.Marshal()
	for i, id := range f.ids {
		if err := id.ConnectNoQP(h, uint32(0x10000+i)); err != nil {
			t.Fatalf("half-open: connect %d: %v", i, err)
		}
	}
	return f
}

// close withdraws every request (destroying an id whose request was
// answered rejects the answer) and destroys the channel.
func (f *halfOpen) close() {
	for _, id := range f.ids {
		id.Destroy()
	}
	f.ids = nil
	if f.ch != nil {
		f.ch.Destroy()
		f.ch = nil
	}
}

// String says how many requests the flood holds.
func (f *halfOpen) String() string { return fmt.Sprintf("%d half-open requests", len(f.ids)) }
