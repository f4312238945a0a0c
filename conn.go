package rdma

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// Compile-time checks that the types fit the interfaces code relies on.
var (
	_ net.Conn     = (*Conn)(nil)
	_ net.Listener = (*Listener)(nil)
	_ net.Addr     = (*Addr)(nil)
)

// How a Conn is built, for those who work on it: this file holds the Conn
// type, its Reads and Writes, addresses and deadlines, and the peer's
// hello (open); its other methods sit with their concerns (conn_close.go,
// keepalive.go, send.go, region.go, stats.go). Which collaborator keeps
// which concern, the goroutines that run a Conn's code, what mu guards
// and the lock order are in docs/architecture.md ("Concurrency", "Lock
// order"), the one copy of that prose.

// Conn is an RDMA connection; it implements net.Conn. Dial returns one, and
// so does a Listener's Accept. Its methods may be called from several
// goroutines at once; concurrent Writes do not interleave.
type Conn struct {
	connSys

	laddr, raddr *Addr
	msgRead      bool           // Options.Messages: a Read returns at most one of the peer's Writes
	msgWrite     bool           // the peer's Options.Messages: Writes are never merged
	qp           queuePair      // posts sends and receives
	rsp          recvSendPoster // qp, if it posts both in one call (repostWithSend)
	mem          []byte         // the arena: the small receive ring, then the small send ring (and any header slots)
	early        []ibv.WC       // messages that arrived before open

	w       waiter
	rdWait  time.Duration // moving average of Read waits, the Read turn's
	wrWait  time.Duration // moving average of Write waits, the Write turn's
	rxReady chan struct{} // capacity 1: a message or an error arrived
	// pl is the poller of the connection's CQ, through which a Read
	// spins with mu held (spinReadHeld); nil where the spinner is
	// another (tests' fakes).
	pl *poller
	// rxHeld: a Read spins with mu held (it lets go of it only at its
	// yields), so wakeReader records the wakeup in rxWoke instead of
	// signaling rxReady, which no one would take. Both under mu.
	rxHeld, rxWoke bool
	// rxParked: a Read waits without mu (waiter.wait or park): waking it
	// sets the poller's woke. rxCounted: it was woken and counts in
	// wokenReads until it runs. Under mu.
	rxParked, rxCounted bool
	txReady             chan struct{} // capacity 1: credits, ring room or send queue entries came back
	drained             chan struct{} // capacity 1: a completion arrived during teardown
	closing             chan struct{} // closed by Close

	rturn turn // one Read at a time: partial messages stay consistent (under mu)
	wturn turn // one Write at a time: Writes do not interleave (under mu)
	rdl   *deadline
	wdl   *deadline

	// regMu is held while a region is registered and while the release
	// frees the regions: no region is registered in the arena's PD after
	// the arena went to another connection.
	regMu sync.Mutex

	releaseOnce sync.Once // the verbs objects go once: by Close, or when the device goes
	// disc runs the connection's rdma_disconnect calls off the caller's
	// goroutine (see disconnect): pending calls, and idle, closed once
	// none is running.
	disc struct {
		mu      sync.Mutex
		pending int
		idle    chan struct{}
	}

	mu sync.Mutex
	// dialing is set while dial has not returned the connection: the
	// dialing goroutine still uses the id, so a device removal meanwhile
	// leaves the release to dial (removedDialing).
	dialing, removedDialing bool
	// releasedLater: a removal of the device started the release on a
	// goroutine of its own (releaseLater). Close then does not wait for
	// it: the release destroys the id last, and a kernel that keeps a
	// removed device's id from being destroyed (seen once in the test
	// bed, during the device's deletion) would otherwise hold Close
	// forever. Under mu.
	releasedLater bool
	st            ConnStats
	os            oneSided // regions and one-sided operations (region.go)
	life          lifecycle
	cr            ledger
	tx            sendRing
	rx            recvRing
	rs            resizer    // rings that follow the traffic (resize.go)
	heard         uint64     // successful completions: the peer or its NIC answered
	qpBroken      bool       // a failed completion disconnected the QP
	atomics       atomicCaps // what the device offers of remote atomics
	postHeld      bool       // small sends are posted with mu held: the device's post is no system call (device.kernelPosts, heldPostBytes)
	// qpDrained: the release saw every work request complete, so the QP
	// holds none and may serve another connection (see keepQP).
	qpDrained bool
	// readCut: an RDMA READ of the connection did not complete, its
	// response perhaps cut in the middle. Soft-RoCE keeps the QP's place
	// in a multi-packet READ response across a reset, and a QP kept from
	// such a connection took its next peer's first acknowledgement for
	// the rest of that response and failed (measured:
	// TestPooledQPAfterReadCut), so such a QP is not kept.
	readCut bool
	// cmUp: the connection manager connected the id; cmDown: it has since
	// completed the disconnect exchange (the DREQ answered by a DREP, in
	// either direction), after which the peer's connection manager no
	// longer holds the QP's number as a connection's (see keepQP).
	cmUp, cmDown bool
	// awaitFirst: an accepted connection on a transport whose connection
	// setup has the initiator send first (iWARP's MPA without its
	// ready-to-receive exchange) is established, but not handed to
	// Accept before the dialing side's first message has arrived (see
	// firstArrived). heardFirst: a receive completed (on the accepting
	// side, that may be before the connection manager's event is
	// processed). nudge repeats the dialing side's first message until
	// it hears from its peer (see nudgeFirst); nudges counts them.
	awaitFirst, heardFirst bool
	nudge                  *time.Timer
	nudges                 int
	ka                     keepalive
	kaTimer                *time.Timer // ticks the keepalive while it is on

	// obs gets the connection's events (Dialer.Tracer, Logger; for an
	// accepted connection, the ListenConfig's); nil for none. It is set
	// before the connection is handed out (observe, or at the request's
	// arrival) and not changed after. handed: Dial or Accept returned the
	// connection, so that its end is reported (ConnClosed); under mu.
	// born: when its dial started or its request arrived.
	obs    *observer
	handed bool
	born   time.Time
}

// observe sets the connection's observer (nil: the listener's stays) and
// marks it handed out.
func (c *Conn) observe(o *observer) {
	c.mu.Lock()
	if o != nil {
		c.obs = o
	}
	c.handed = true
	c.mu.Unlock()
}

// eventInfo names the connection in an event, with err.
func (c *Conn) eventInfo(err error) ConnEventInfo {
	return ConnEventInfo{Local: addrOrNil(c.laddr), Remote: addrOrNil(c.raddr), Err: err}
}

// addrOrNil keeps a nil *Addr from becoming a non-nil net.Addr.
func addrOrNil(a *Addr) net.Addr {
	if a == nil {
		return nil
	}
	return a
}

// queuePair posts work requests: the connection's *ibv.QP, or a fake.
type queuePair interface {
	sendPoster
	recvPoster
}

func newConn(ph phase) *Conn {
	c := &Conn{
		life:    lifecycle{phase: ph},
		rxReady: make(chan struct{}, 1),
		txReady: make(chan struct{}, 1),
		drained: make(chan struct{}, 1),
		closing: make(chan struct{}),
		rturn:   newTurn(),
		wturn:   newTurn(),
		rdl:     newDeadline(),
		wdl:     newDeadline(),
	}
	// A Read or Write parks on its ready channel alone (waiter.alone):
	// the deadlines, as Close (closeWakes), signal it.
	c.rdl.wake = func() { signal(c.rxReady) }
	c.wdl.wake = func() { signal(c.txReady) }
	return c
}

// closeWakes closes closing and wakes a parked Read and Write, which wait
// on their ready channels alone (see waiter.alone); mu is held.
func (c *Conn) closeWakes() {
	close(c.closing)
	signal(c.rxReady)
	signal(c.txReady)
}

// initDataPath sets up the rings, the ledger and the waiting policy over
// registered memory laid out by lay, whose send ring is at NIC address
// sendBase under sendLKey, and posts every receive; mu is held. The
// peer's grant and ring come later, with open.
func (c *Conn) initDataPath(qp queuePair, mem []byte, lay layout, sendBase uint64, sendLKey uint32, maxInline int, opts Options, sp spinner) error {
	c.qp, c.mem = qp, mem
	c.rsp, _ = qp.(recvSendPoster)
	c.msgRead = opts.Messages
	c.w = waiter{mode: opts.Poll, spinTime: opts.SpinTime, sp: sp, alone: true}
	c.pl, _ = sp.(*poller)
	c.cr = newLedger(opts.RecvDepth)
	c.rx = newRecvRing(lay.recvSlots, mem[lay.recvOff():lay.recvOff()+lay.ring])
	if lay.headers() {
		// The header slots follow the send ring, under its key.
		c.rx.useHeaders(lay.hdrs, lay.hdrOff(), sendBase+uint64(lay.hdrOff()-lay.sendOff()), sendLKey)
	}
	sendRing := mem[lay.sendOff() : lay.sendOff()+lay.ring]
	c.tx = newSendRing(lay.sendSlots, lay.ctrlSlots, sendRing, sendBase, sendLKey, maxInline, lay.headers())
	// The receive ring's key comes with the registration (setup).
	c.rs.init(ringMem{buf: c.rx.buf[0], base: sendBase - uint64(lay.sendOff()-lay.recvOff())},
		ringMem{buf: sendRing, base: sendBase, lkey: sendLKey}, lay)
	c.early = make([]ibv.WC, 0, lay.recvSlots)
	c.rx.reposts = lay.recvSlots
	c.postReposts()
	if c.life.rerr != nil {
		return c.life.rerr
	}
	// The initial receives are granted by the handshake, not by reports.
	c.cr.unreported = 0
	return nil
}

// open takes the peer's hello once the handshake is done (mu is held):
// its grant, its Reads' mode, and its receive ring, whose geometry both
// sides derive alike (wire.RingGeometry). Messages that arrived before (a
// listener may write as soon as it is established, before the dialer has
// read the reply) are handled now, in order.
func (c *Conn) open(peer wire.Hello, lay layout) {
	span, maxMsg := wire.RingGeometry(lay.ring, lay.bufSize, int(peer.RingSize), int(peer.BufSize))
	c.rs.open(span, peer)
	c.msgWrite = peer.Flags&wire.HelloMessages != 0
	c.cr.open(int(peer.RecvDepth), int(peer.CtrlDepth))
	c.cr.noMerge = c.msgWrite
	c.tx.open(peer.RingAddr, peer.RKey, span, maxMsg, int(peer.RecvDepth), peer.Flags&wire.HelloHeaders != 0)
	c.rx.open(span, maxMsg)
	for _, wc := range c.early {
		c.recvMsg(wc)
	}
	c.early = c.early[:0]
}

// hasQP reports whether the connection got as far as a QP (its data path
// is set up): then the teardown lingers for the fin and drains the QP.
func (c *Conn) hasQP() bool { return c.qp != nil }

// ok reports whether c is a connection (not nil, not a zero Conn).
func (c *Conn) ok() bool { return c != nil && c.closing != nil }

func (c *Conn) opErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	return &net.OpError{Op: op, Net: "rdma", Source: c.laddr, Addr: c.raddr, Err: err}
}

// errInvalid is the error of a call on a nil or zero Conn: syscall.EINVAL,
// as net's for a zero TCPConn, but wrapped in a *net.OpError (net returns
// it bare) so that every error of this package is one.
func errInvalid(op string) error { return &net.OpError{Op: op, Net: "rdma", Err: syscall.EINVAL} }

// Read reads data into b. On a stream connection (the default) it returns
// whatever has arrived, up to len(b), copied from as many of the peer's
// messages as fit (Write boundaries are not kept), or, when nothing has
// arrived, waits for data. With Options.Messages it returns bytes of one
// of the peer's Writes at most: all of the Write when b is large enough
// (waiting for the rest of a large one), otherwise as much as fits, the
// rest coming with the next Reads. If a deadline passes or the connection
// fails midway, it returns what it has with the error. It returns io.EOF
// once the peer has closed its side and everything it sent has been read.
func (c *Conn) Read(b []byte) (int, error) {
	if !c.ok() {
		return 0, errInvalid("read")
	}
	n, err := c.readTurn(b)
	return n, c.opErr("read", err)
}

// Write writes b and returns once all of it is in the connection's
// registered send ring; b may be reused at once. The data goes out in
// order, cut into messages of at most the smaller BufferSize, as the peer
// has receives free and room in its receive ring: at once when it has,
// and otherwise Writes gather in a pending message that goes out when the
// peer returns credit (so a fast writer of small messages is not held to
// one message per peer receive). While the peer is behind, a small Write
// may also gather with the next ones (see SetNoDelay). Write blocks while
// SendDepth messages are in the send queue, while the peer's ring has no
// room for the next message (the peer has not read what is there), or
// while the peer has no receive free and the pending message is full.
// Close delivers what Write accepted, unless the peer leaves no receive
// free for the few seconds Close waits; then Close reports the loss. If the peer's Reads
// are message-oriented (its Options.Messages), a Write is never merged
// with another: it travels as messages of its own, the last marked, and a
// Write waits while an earlier one's last bytes are still pending; a Write
// that its deadline cuts short after part of it went fails the Writes (and
// ReadFrom) of the connection from then on, since the next bytes would
// continue that message at the reader. Reads, one-sided operations and
// regions go on; Close then sends no fin, so the peer sees the connection
// reset rather than the cut message followed by io.EOF as if it were
// whole. A zero-length Write sends nothing.
func (c *Conn) Write(b []byte) (int, error) {
	if !c.ok() {
		return 0, errInvalid("write")
	}
	n, err := c.writeTurn(b)
	return n, c.opErr("write", err)
}

// LocalAddr returns the local address, an *Addr.
func (c *Conn) LocalAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	return c.laddr
}

// RemoteAddr returns the peer's address, an *Addr.
func (c *Conn) RemoteAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	return c.raddr
}

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline for Reads, including one in progress.
// A zero t clears it.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if !c.ok() {
		return errInvalid("set")
	}
	// A Close between the check and set stops the deadline: set then
	// does nothing and says so.
	if c.isClosed() || !c.rdl.set(t) {
		return c.opErr("set", net.ErrClosed)
	}
	return nil
}

// SetWriteDeadline sets the deadline for Writes, including one in progress.
// A zero t clears it.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if !c.ok() {
		return errInvalid("set")
	}
	// A Close between the check and set stops the deadline: set then
	// does nothing and says so.
	if c.isClosed() || !c.wdl.set(t) {
		return c.opErr("set", net.ErrClosed)
	}
	return nil
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.life.has(shutClosed)
}

// The paths io.Copy takes: ReadFrom sends what each Read of a Reader
// returns as a message of its own, WriteTo hands each received message to
// a Writer. Both move the bytes through a buffer of the call's own (one
// copy more than Read and Write make): the rings are registered memory,
// which the peer may rewrite (the receive ring) and a device's removal
// takes away while the application's Reader or Writer still runs. Both go
// through the same credits, rings, deadlines and errors as Write and Read.

var (
	_ io.ReaderFrom = (*Conn)(nil)
	_ io.WriterTo   = (*Conn)(nil)
)

// errInvalidWrite is WriteTo's error for a Writer that reports an
// impossible count, as io.Copy's.
var errInvalidWrite = errors.New("invalid write result")

// ReadFrom implements io.ReaderFrom: it reads from r until io.EOF or an
// error, and sends each Read's bytes as a message (one Read of r fills at
// most one message) as soon as the peer has a receive free. Unlike small
// Writes, Reads of r never gather: r.Read may block (a socket waiting for
// the next request) and what it returned must not wait behind it. To a
// message-oriented peer each Read of r is one message. r.Read is called
// once the peer has room for what it returns, and never into registered
// memory. While r.Read runs, a Close of the connection waits for it to
// return (so that the fin follows what it returns); a device's removal
// does not. The error of r, if any, is returned wrapped like the
// connection's own. The copy allocates nothing per message; the error
// that ends the call (other than r's io.EOF) is a *net.OpError, one
// allocation of 80 bytes, as net's connections return it.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if !c.ok() {
		return 0, errInvalid("readfrom")
	}
	c.takeTurn(&c.wturn)
	defer c.giveTurn(&c.wturn)
	n, err := c.readFrom(r)
	return n, c.opErr("readfrom", err)
}

// WriteTo implements io.WriterTo: it writes what arrives to w until the
// peer closes (then it returns a nil error, as io.Copy expects) or an error,
// calling w.Write with each message, copied out of the receive ring into a
// buffer of the call's own (the peer may rewrite its ring at any moment),
// and giving the message's ring bytes back to the peer once w.Write has
// taken all of it; what w does not take stays for the next Read or
// WriteTo. w must not keep the slice. While w.Write runs, a Close of the
// connection waits for it to return; a device's removal does not. An
// error of w is returned wrapped like the connection's own. As with
// ReadFrom, the copy allocates nothing per message, and the error that
// ends the call is one allocation of 80 bytes.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	if !c.ok() {
		return 0, errInvalid("writeto")
	}
	c.takeTurn(&c.rturn)
	defer c.giveTurn(&c.rturn)
	n, err := c.writeTo(w)
	return n, c.opErr("writeto", err)
}

// wcError is a failed work completion: the connection is broken.
type wcError struct{ status uint32 }

func (e *wcError) Error() string { return "work request failed: " + wcStatusString(e.status) }

// Unwrap says what the failure means to a caller: a connection whose
// peer's NIC stopped acknowledging (the retries ran out: the peer host
// vanished, or the network between is down) timed out, as a TCP
// connection whose retransmissions go unanswered; any other failure broke
// it.
func (e *wcError) Unwrap() error {
	if e.status == ibv.WCRetryExcErr {
		return syscall.ETIMEDOUT
	}
	return syscall.ECONNRESET
}
