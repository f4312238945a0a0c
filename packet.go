package rdma

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// PacketOptions configure a PacketConn. The zero value means the
// defaults.
type PacketOptions struct {
	// RecvDepth is how many receives the PacketConn posts, each of the
	// local port's active MTU plus 40 bytes (the GRH): 4 KiB at the test
	// bed's MTU. A datagram waits for ReadFrom in its receive; three
	// quarters of them may wait at once (384 of the default 512; under
	// 64, all but 16), the rest stay posted for what arrives meanwhile.
	// Datagrams that arrive while that many wait are dropped and counted
	// (PacketStats.DropsNoReceive), as a full UDP receive buffer drops
	// them. Default 512; at least 32.
	RecvDepth int
	// SendDepth is how many messages (a fragmented datagram is several)
	// may be in flight; a write waits for room. Default 256, and at least
	// what the largest datagram needs.
	SendDepth int
	// Peers is how many destinations keep their address handle (least
	// recently used out; one not heard from for 5 s is resolved again,
	// see PacketConn). Default 1024.
	Peers int
	// ResolveTimeout bounds the resolution of a new destination (address,
	// route, and the peer's QP number). Default 2 s.
	ResolveTimeout time.Duration
	// ReassemblyBytes bounds the bytes of fragmented datagrams held
	// while their fragments arrive; one source may hold a quarter.
	// Default 4 MiB; at least 256 KiB, so that a source's quarter holds
	// the largest datagram (whose buffer is 64 KiB).
	ReassemblyBytes int
}

// Defaults of PacketOptions.
const (
	defaultPacketRecvDepth = 512
	defaultPacketSendDepth = 256
	defaultPacketPeers     = 1024
	defaultResolveTimeout  = 2 * time.Second
	defaultReassembly      = 4 << 20
	minPacketRecvDepth     = 32
)

func (o PacketOptions) normalized() (PacketOptions, error) {
	if o.RecvDepth < 0 || o.SendDepth < 0 || o.Peers < 0 || o.ResolveTimeout < 0 || o.ReassemblyBytes < 0 {
		return o, errors.New("rdma: negative PacketOptions")
	}
	if o.RecvDepth == 0 {
		o.RecvDepth = defaultPacketRecvDepth
	}
	o.RecvDepth = max(o.RecvDepth, minPacketRecvDepth)
	if o.SendDepth == 0 {
		o.SendDepth = defaultPacketSendDepth
	}
	if o.Peers == 0 {
		o.Peers = defaultPacketPeers
	}
	if o.ResolveTimeout == 0 {
		o.ResolveTimeout = defaultResolveTimeout
	}
	if o.ReassemblyBytes == 0 {
		o.ReassemblyBytes = defaultReassembly
	}
	o.ReassemblyBytes = max(o.ReassemblyBytes, 4*maxReassemblyBuf)
	return o, nil
}

// Message is one datagram of ReadBatch or WriteBatch, in the shape of
// golang.org/x/net/ipv4.Message: its bytes are Buffers, one after the
// other; Addr is where it came from or goes to; N is how many bytes were
// read or written; Flags is MsgTrunc after a read whose Buffers were too
// small for the datagram (its tail was discarded).
type Message struct {
	Buffers [][]byte
	Addr    net.Addr
	N       int
	Flags   int
}

// MsgTrunc is Message.Flags' bit for a datagram that did not fit the
// buffers it was read into, as the MSG_TRUNC of recvmsg(2).
const MsgTrunc = 0x20

// PacketStats counts what a PacketConn did since it was opened.
type PacketStats struct {
	DatagramsSent, DatagramsReceived uint64
	BytesSent, BytesReceived         uint64
	// Drops by reason: no receive free (the reader fell behind),
	// truncated (the reader's buffer was smaller), reassembly (a fragment
	// lost, a datagram incomplete when it timed out, or one refused for
	// the reassembly bounds), malformed (not this library's datagram, or
	// a header that breaks its rules).
	DropsNoReceive, DropsTruncated, DropsReassembly, DropsMalformed uint64
	// DropsStaleFragments counts fragments dropped because they could
	// complete nothing: a duplicate of one held, or one of a datagram
	// completed or given up less than the reassembly timeout (1 s) ago
	// and among the last 16 finished (its datagram, if given
	// up, is counted in DropsReassembly once).
	DropsStaleFragments uint64
	// PeerHits and PeerMisses count the writes that found their
	// destination's address handle cached, and those that resolved it;
	// PeerFailures the resolutions that failed.
	PeerHits, PeerMisses, PeerFailures uint64
	// SendErrors counts sends the device completed with an error.
	SendErrors uint64
	// DropsNoListener counts the datagrams written to a port where
	// nothing listens (its host answered so): the write succeeded and the
	// datagram was lost, as UDP's is. Such a destination is remembered
	// for a second (PeerFailures counts the resolution), and the writes
	// to it meanwhile are lost and counted too.
	DropsNoListener uint64
}

// PacketConn is a datagram end point over RDMA unreliable datagrams (UD):
// a net.PacketConn whose datagrams, of up to 65,507 bytes as UDP's, go to
// and come from other PacketConns by IP address and port. Datagrams may be
// lost, as UDP's may, but never arrive corrupted, duplicated or merged
// (but for the rare case of a sender restarted on the same port whose
// random fragment ids meet its last run's: see docs/datagrams.md).
// Its methods are safe for concurrent use.
//
// The sender's address that ReadFrom returns is the IP address the
// network delivered the datagram from and the port its header names: no
// more trustworthy than UDP's source address.
//
// A destination's address handle and QP number are kept (see
// PacketOptions.Peers) and resolved again when its PacketConn may have
// been replaced by another on the same address and port: at once, before
// the next write to it, when a datagram comes from that address but
// another QP; and, in the background, on the first write 5 s or more
// after its last resolution or datagram from its QP. A datagram never
// says by itself where writes go: the resolution asks the destination's
// rdma_cm (docs/datagrams.md).
type PacketConn struct {
	packetSys // the verbs side (packet_verbs.go)

	udp   *net.UDPConn // with ListenConfig.FallbackUDP, where RDMA could not serve
	laddr *Addr
	port  uint16
	opts  PacketOptions

	qp  udQP
	mtu int // the largest UD message
	// maxInline is the largest message the QP sends inline (copied at
	// the post).
	maxInline int
	mem       []byte // the receives' slots, then the sends'
	lkey      uint32
	base      uint64 // mem[0]'s address as the device sees it
	w         waiter

	closing   chan struct{}
	closeOnce sync.Once
	rdl, wdl  *deadline

	readMu   sync.Mutex // serializes readers
	ravg     time.Duration
	readable chan struct{}
	rmu      sync.Mutex // the receive state below
	queue    []rxItem   // a ring of the datagrams waiting for a reader
	qhead    int
	qlen     int
	held     int // receive slots the queue holds
	posted   int // receives posted
	reposts  []ibv.RecvWR
	reasm    *reassembler
	rfail    error // the receive side failed for good (a failed post)

	writeMu  sync.Mutex // serializes writers
	wavg     time.Duration
	writable chan struct{}
	smu      sync.Mutex         // the send state below
	sent     uint64             // sends posted
	done     uint64             // sends completed (the ring's free slots follow)
	sendRefs []*peerRef[udDest] // by send slot: the destination a datagram's last message holds
	wrs      []ibv.UDSendWR
	wfail    error // the send side failed for good
	// The datagrams of the sends queued since the last post (c.wrs):
	// pendSent of them, of pendBytes, to be counted as sent once posted;
	// pendDone those and the ones lost as UDP loses them (no listener),
	// to be counted in callDone, the datagrams of the current write
	// call that are done, once every one queued before is posted. Under
	// writeMu, as c.wrs.
	pendSent, pendDone, callDone int
	pendBytes                    uint64
	// qpGone: the QP is destroyed (Close); set with writeMu and rmu held,
	// so that no post, of sends (writeMu) or receives (rmu), reaches it.
	qpGone bool
	nextID uint32

	peers *peerCache[udDest]
	stats packetCounters

	gmu    sync.Mutex
	groups map[netip.Addr]udDest // the multicast groups joined: where datagrams to them go

	// setupMu guards settingUp and removedSetup. settingUp: the setup
	// (listenPacket, and the join of ListenMulticast) still runs on the
	// caller's goroutine and uses the verbs objects as it makes them, so
	// a removal of the device meanwhile does not release them
	// concurrently: it records removedSetup, and the setup fails with
	// ErrNoDevice and releases what it made once it is done (endSetup),
	// as a Conn's dial does (removedDialing).
	setupMu                 sync.Mutex
	settingUp, removedSetup bool
}

// packetCounters are PacketStats' counters.
type packetCounters struct {
	sent, recvd, bytesSent, bytesRecvd             atomic.Uint64
	noReceive, truncated, reassembly, malformed    atomic.Uint64
	staleFragments                                 atomic.Uint64
	peerHits, peerMisses, peerFailures, sendErrors atomic.Uint64
	noListener                                     atomic.Uint64
}

// udQP is the UD QP as the datagram path uses it: *ibv.QP, or a fake in
// tests.
type udQP interface {
	PostRecvs(wrs []ibv.RecvWR) error
	PostUDSends(wrs []ibv.UDSendWR) error
}

// udDest is a resolved destination: its address handle and QP.
type udDest struct {
	ah   uintptr
	qpn  uint32
	qkey uint32
	free func() // destroys the address handle
}

// rxItem is a datagram waiting for a reader: in a receive slot (slot >=
// 0, its bytes at mem[off:off+n]) or reassembled (buf).
type rxItem struct {
	slot int
	off  int
	n    int
	buf  []byte
	src  netip.AddrPort
}

// wrRecvFlag marks a receive's work request id (the slot is the rest);
// a send's is its sequence number.
const wrRecvFlag = 1 << 63

// sigEvery is how often a send is signaled: its completion frees every
// slot up to it. Besides, every send is signaled that leaves more than
// half of the slots in flight, so a writer that waits for room always
// has a signaled send ahead to wake it (sendDepthFor makes the largest
// datagram need at most half), and a writer that sends now and then
// costs no completion per datagram.
const sigEvery = 16

// repostBatch is how many consumed receives are posted again at once.
const repostBatch = 16

// slotLen is the size of a receive slot: the GRH, then a message of up
// to the MTU.
func (c *PacketConn) slotLen() int { return ibv.GRHLen + c.mtu }

func (c *PacketConn) sendOff() int { return c.opts.RecvDepth * c.slotLen() }

// minPosted is the receives kept posted however far the reader lags: a
// datagram that finds a reader's queue full is dropped (and counted) by
// the library, not silently by the device for want of a receive. A burst
// that outruns the poller's reposting may still find none posted: the
// device drops those, uncounted here, as a NIC's full ring drops UDP's.
func (c *PacketConn) minPosted() int { return max(16, c.opts.RecvDepth/4) }

// packetMemLen is the memory a PacketConn registers.
func packetMemLen(o PacketOptions, mtu int) int {
	return o.RecvDepth*(ibv.GRHLen+mtu) + o.SendDepth*mtu
}

// sendDepthFor is the send depth o asks for, raised to what the largest
// datagram needs in fragments of an MTU of mtu.
func sendDepthFor(o PacketOptions, mtu int) int {
	return max(o.SendDepth, 2*wire.DgramFragments(wire.MaxDatagram, mtu-wire.DgramFragHeaderLen)+sigEvery)
}

// initPath sets the datagram path up over qp and mem (registered under
// lkey at base): every receive posted. opts is normalized and its
// SendDepth already raised by sendDepthFor.
func (c *PacketConn) initPath(qp udQP, mem []byte, base uint64, lkey uint32, mtu int, sp spinner, mode PollMode) error {
	c.qp, c.mem, c.base, c.lkey, c.mtu = qp, mem, base, lkey, mtu
	c.w = waiter{mode: mode, spinTime: DefaultSpinTime, sp: sp}
	c.queue = make([]rxItem, c.opts.RecvDepth)
	c.sendRefs = make([]*peerRef[udDest], c.opts.SendDepth)
	c.wrs = make([]ibv.UDSendWR, 0, ibv.MaxUDSendBatch)
	c.reposts = make([]ibv.RecvWR, 0, repostBatch)
	c.reasm = newReassembler(reassemblyLimits{Total: c.opts.ReassemblyBytes, PerSource: c.opts.ReassemblyBytes / 4, Timeout: time.Second})
	c.reasm.sweepOnTimer(&c.rmu, &c.stats.reassembly)
	// Fragmented datagrams are numbered from a random start, so that a
	// sender restarted on the same port does not reuse the ids of the
	// datagrams its receivers may still hold or remember of the last.
	c.nextID = rand.Uint32()
	wrs := make([]ibv.RecvWR, 0, ibv.MaxRecvBatch)
	for i := 0; i < c.opts.RecvDepth; i++ {
		wrs = append(wrs, c.recvWR(i))
		if len(wrs) == cap(wrs) || i == c.opts.RecvDepth-1 {
			if err := qp.PostRecvs(wrs); err != nil {
				return err
			}
			c.posted += len(wrs)
			wrs = wrs[:0]
		}
	}
	return nil
}

func newPacketConn(opts PacketOptions) *PacketConn {
	return &PacketConn{opts: opts, closing: make(chan struct{}), rdl: newDeadline(), wdl: newDeadline(),
		readable: make(chan struct{}, 1), writable: make(chan struct{}, 1)}
}

func (c *PacketConn) recvWR(slot int) ibv.RecvWR {
	off := slot * c.slotLen()
	return ibv.RecvWR{ID: wrRecvFlag | uint64(slot), Addr: c.base + uint64(off), Len: uint32(c.slotLen()), LKey: c.lkey}
}

// complete handles one completion of the PacketConn's QP, on the poller
// (see completer): a datagram received goes to the queue (or, a
// fragment, to reassembly), a send's completion frees the slots up to it.
// It reports whether receives wait to be posted again (lockAndFlush).
func (c *PacketConn) complete(wc ibv.WC) bool {
	if wc.WRID&wrRecvFlag == 0 {
		c.sendDone(wc)
		return false
	}
	slot := int(wc.WRID &^ wrRecvFlag)
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.posted--
	if slot >= c.opts.RecvDepth {
		return false
	}
	if wc.Status != ibv.WCSuccess {
		// Flushed (the QP is going) or failed: nothing arrived.
		if wc.Status != ibv.WCFlushErr {
			c.stats.malformed.Add(1)
			c.repostLocked(slot, false)
		}
		return len(c.reposts) > 0
	}
	off := slot * c.slotLen()
	n := int(wc.ByteLen)
	if n < ibv.GRHLen || n > c.slotLen() || wc.Flags&ibv.WCGRH == 0 {
		c.stats.malformed.Add(1)
		c.repostLocked(slot, false)
		return len(c.reposts) > 0
	}
	ip, ok := grhSource(c.mem[off : off+ibv.GRHLen])
	h, payload, err := wire.ParseDatagram(c.mem[off+ibv.GRHLen : off+n])
	if !ok || err != nil {
		c.stats.malformed.Add(1)
		c.repostLocked(slot, false)
		return len(c.reposts) > 0
	}
	src := netip.AddrPortFrom(ip, h.Port)
	now := time.Now()
	c.heardFrom(src, wc.SrcQP, now) // a peer that moved to another QP (peercache.go)
	if h.Fragment {
		d, dropped, stale := c.reasm.add(src, h, payload, now)
		c.stats.reassembly.Add(uint64(dropped))
		if stale {
			c.stats.staleFragments.Add(1)
		}
		c.repostLocked(slot, false)
		if d != nil {
			if c.held >= c.opts.RecvDepth-c.minPosted() || c.qlen == len(c.queue) {
				c.stats.noReceive.Add(1)
				c.reasm.release(d)
			} else {
				c.push(rxItem{slot: -1, buf: d, n: len(d), src: src})
			}
		}
		return len(c.reposts) > 0
	}
	if c.held >= c.opts.RecvDepth-c.minPosted() || c.qlen == len(c.queue) {
		// The reader is behind: drop this one, keep the receive posted.
		// Reassembled datagrams hold no receive, so they alone can fill
		// the queue.
		c.stats.noReceive.Add(1)
		c.repostLocked(slot, false)
		return len(c.reposts) > 0
	}
	c.held++
	c.push(rxItem{slot: slot, off: off + ibv.GRHLen + wire.DgramHeaderLen, n: len(payload), src: src})
	return len(c.reposts) > 0
}

// push queues a datagram for the readers; rmu is held.
func (c *PacketConn) push(it rxItem) {
	c.queue[(c.qhead+c.qlen)%len(c.queue)] = it
	c.qlen++
	signal(c.readable)
}

// repostLocked queues a receive slot to be posted again, and posts the
// queue when it is a batch, or (now) at once; rmu is held.
func (c *PacketConn) repostLocked(slot int, now bool) {
	// RoCE v2 over IPv4 writes only the last 20 bytes of the GRH room:
	// the first 20 must not keep an IPv6 header's bytes from an earlier
	// datagram (see grhSource).
	off := slot * c.slotLen()
	clear(c.mem[off : off+ibv.GRHLen/2])
	c.reposts = append(c.reposts, c.recvWR(slot))
	if now || len(c.reposts) == cap(c.reposts) {
		c.flushRepostsLocked()
	}
}

// flushRepostsLocked posts the queued receives; rmu is held. A failed
// post fails the receive side: nothing could arrive any more.
func (c *PacketConn) flushRepostsLocked() {
	if len(c.reposts) == 0 || c.rfail != nil || c.qpGone {
		c.reposts = c.reposts[:0]
		return
	}
	if err := c.qp.PostRecvs(c.reposts); err != nil {
		c.rfail = err
		signal(c.readable)
	} else {
		c.posted += len(c.reposts)
	}
	c.reposts = c.reposts[:0]
}

// lockAndFlush posts the receives complete queued (see completer).
func (c *PacketConn) lockAndFlush() {
	c.rmu.Lock()
	c.flushRepostsLocked()
	c.rmu.Unlock()
}

// failAsync fails the PacketConn for an asynchronous event of its device
// (see completer): reads and writes return err from then on.
func (c *PacketConn) failAsync(err error, removed bool) {
	if !removed && errors.Is(err, syscall.ENETDOWN) {
		// The port stayed down past portDownGrace. That fails a Conn
		// (its peer gave up on it meanwhile); the outage alone does
		// not break a UD QP, which serves again once the port is back.
		// A send made while it is down can: Soft-RoCE completes it
		// with an error, and sendDone fails the writes (see
		// docs/datagrams.md, Limits).
		return
	}
	if removed {
		err = &deviceError{syscall.ENODEV}
	}
	c.rmu.Lock()
	if c.rfail == nil {
		c.rfail = err
	}
	c.rmu.Unlock()
	signal(c.readable)
	c.smu.Lock()
	if c.wfail == nil {
		c.wfail = err
	}
	c.smu.Unlock()
	signal(c.writable)
	if removed && !c.removedWhileSetup() {
		// The kernel finishes a device's removal only once every
		// object of it is gone: they go now, not at Close.
		c.releaseAsync()
	}
}

// removedWhileSetup records a removal of the device that came while the
// setup runs, and reports whether one did (now, or as the connection
// manager's event recorded it): the setup releases then (endSetup).
func (c *PacketConn) removedWhileSetup() bool {
	c.setupMu.Lock()
	defer c.setupMu.Unlock()
	if c.settingUp {
		c.removedSetup = true
	}
	return c.removedSetup
}

// endSetup ends the setup and reports whether the device was removed
// while it ran: the setup's outcome is then ErrNoDevice, and the caller
// releases.
func (c *PacketConn) endSetup() bool {
	c.setupMu.Lock()
	defer c.setupMu.Unlock()
	c.settingUp = false
	return c.removedSetup
}

// sendDone handles a send's completion: every send up to it is done.
func (c *PacketConn) sendDone(wc ibv.WC) {
	c.smu.Lock()
	if wc.Status != ibv.WCSuccess && wc.Status != ibv.WCFlushErr {
		// A failed send leaves the QP's send queue in its error state:
		// every later send would be flushed unseen. The writes fail
		// instead.
		c.stats.sendErrors.Add(1)
		if c.wfail == nil {
			c.wfail = &sendFailedError{wcStatusString(wc.Status)}
		}
	}
	var refs [sigEvery * 2]*peerRef[udDest]
	n := 0
	for c.done <= wc.WRID && c.done < c.sent {
		i := int(c.done % uint64(len(c.sendRefs)))
		if r := c.sendRefs[i]; r != nil {
			c.sendRefs[i] = nil
			if n == len(refs) {
				c.smu.Unlock()
				c.releaseRefs(refs[:n])
				c.smu.Lock()
				n = 0
			}
			refs[n] = r
			n++
		}
		c.done++
	}
	c.smu.Unlock()
	c.releaseRefs(refs[:n])
	signal(c.writable)
}

func (c *PacketConn) releaseRefs(refs []*peerRef[udDest]) {
	for _, r := range refs {
		c.peers.release(r)
	}
}

// grhSource returns the source IP address of a datagram's GRH: an IPv6
// header (RoCE v2 over IPv6, or InfiniBand's GRH, whose source GID is an
// IPv4-mapped or IPv6 address under rdma_cm), or, in its last 20 bytes,
// an IPv4 header (RoCE v2 over IPv4).
func grhSource(grh []byte) (netip.Addr, bool) {
	if len(grh) < ibv.GRHLen {
		return netip.Addr{}, false
	}
	if grh[0]>>4 == 6 {
		a := netip.AddrFrom16([16]byte(grh[8:24])).Unmap()
		return a, !a.IsUnspecified()
	}
	if v4 := grh[20:40]; v4[0]>>4 == 4 {
		a := netip.AddrFrom4([4]byte(v4[12:16]))
		return a, !a.IsUnspecified()
	}
	return netip.Addr{}, false
}

// ReadFrom reads a datagram into b and returns its length and sender. A
// datagram longer than b fills b and the rest is discarded, as UDP's
// (ReadBatch reports that with MsgTrunc; PacketStats counts it).
func (c *PacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	if c.invalid() {
		return 0, nil, c.opErr("read", nil, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udp.ReadFrom(b)
	}
	var one [1][]byte
	one[0] = b
	n, src, _, err := c.read(one[:])
	if err != nil {
		return n, nil, c.opErr("read", nil, err)
	}
	return n, addrFrom(src), nil
}

// ReadFromAddrPort is ReadFrom with the sender's address as a
// netip.AddrPort, as net.UDPConn's: it allocates nothing.
func (c *PacketConn) ReadFromAddrPort(b []byte) (int, netip.AddrPort, error) {
	if c.invalid() {
		return 0, netip.AddrPort{}, c.opErr("read", nil, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udp.ReadFromUDPAddrPort(b)
	}
	one := [1][]byte{b}
	n, src, _, err := c.read(one[:])
	if err != nil {
		return n, src, c.opErr("read", nil, err)
	}
	return n, src, nil
}

// read waits for a datagram and copies it into bufs, one after the other.
func (c *PacketConn) read(bufs [][]byte) (n int, src netip.AddrPort, flags int, err error) {
	if c.qp == nil {
		return 0, src, 0, syscall.EINVAL
	}
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		if isClosed(c.closing) {
			return 0, src, 0, net.ErrClosed
		}
		if c.rdl.expired() {
			return 0, src, 0, errTimeout
		}
		c.rmu.Lock()
		if c.qlen > 0 {
			n, src, flags = c.popLocked(bufs)
			c.rmu.Unlock()
			return n, src, flags, nil
		}
		fail := c.rfail
		c.rmu.Unlock()
		if fail != nil {
			return 0, src, 0, fail
		}
		c.w.wait(c.readable, c.closing, c.rdl, &c.ravg)
	}
}

// popLocked takes the oldest datagram of the queue into bufs; rmu is
// held.
func (c *PacketConn) popLocked(bufs [][]byte) (n int, src netip.AddrPort, flags int) {
	it := c.queue[c.qhead]
	c.queue[c.qhead] = rxItem{}
	c.qhead = (c.qhead + 1) % len(c.queue)
	c.qlen--
	data := it.buf
	if it.slot >= 0 {
		data = c.mem[it.off : it.off+it.n]
	}
	for _, b := range bufs {
		n += copy(b, data[n:])
		if n == len(data) {
			break
		}
	}
	if n < len(data) {
		flags = MsgTrunc
		c.stats.truncated.Add(1)
	}
	c.stats.recvd.Add(1)
	c.stats.bytesRecvd.Add(uint64(len(data)))
	if it.slot >= 0 {
		c.held--
		c.repostLocked(it.slot, c.posted < c.minPosted())
	} else {
		c.reasm.release(it.buf)
	}
	if c.qlen > 0 {
		signal(c.readable)
	}
	return n, it.src, flags
}

// ReadBatch reads up to len(ms) datagrams: it waits for the first, then
// takes those already there. It returns how many it read; each Message
// has its N, Addr and Flags set. flags must be 0.
func (c *PacketConn) ReadBatch(ms []Message, flags int) (int, error) {
	if c.invalid() {
		return 0, c.opErr("read", nil, syscall.EINVAL)
	}
	if flags != 0 {
		return 0, c.opErr("read", nil, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udpReadBatch(ms)
	}
	if len(ms) == 0 {
		return 0, nil
	}
	n, src, fl, err := c.read(ms[0].Buffers)
	if err != nil {
		return 0, c.opErr("read", nil, err)
	}
	ms[0].N, ms[0].Addr, ms[0].Flags = n, addrFrom(src), fl
	i := 1
	c.readMu.Lock()
	c.rmu.Lock()
	for ; i < len(ms) && c.qlen > 0; i++ {
		n, src, fl = c.popLocked(ms[i].Buffers)
		ms[i].N, ms[i].Addr, ms[i].Flags = n, addrFrom(src), fl
	}
	c.rmu.Unlock()
	c.readMu.Unlock()
	return i, nil
}

// WriteTo sends b as one datagram to addr: an *Addr (what ReadFrom
// returns) or a *net.UDPAddr. Up to 65,507 bytes, as UDP's; one longer
// fails and sends nothing. The first datagram to a new destination waits
// for its resolution (ResolveTimeout at most); a destination that cannot
// be resolved fails that write (and the next ones for a second). One
// whose host answers that nothing listens on its port does not: as
// UDP's, the write succeeds and the datagram is lost, counted in
// PacketStats.DropsNoListener (and so are the writes to it for a
// second).
func (c *PacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	if c.invalid() {
		return 0, c.opErr("write", addr, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udpWriteTo(b, addr)
	}
	dst, err := destOf(addr)
	if err != nil {
		return 0, c.opErr("write", addr, err)
	}
	if err := c.writeSingle(b, dst); err != nil {
		return 0, c.opErr("write", addr, err)
	}
	return len(b), nil
}

// WriteToAddrPort is WriteTo to an address given as a netip.AddrPort, as
// net.UDPConn's: it allocates nothing.
func (c *PacketConn) WriteToAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	if c.invalid() {
		return 0, c.opErr("write", addrFrom(addr), syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udp.WriteToUDPAddrPort(b, addr)
	}
	dst, err := destOf(net.UDPAddrFromAddrPort(addr))
	if err == nil {
		err = c.writeSingle(b, dst)
	}
	if err != nil {
		return 0, c.opErr("write", addrFrom(addr), err)
	}
	return len(b), nil
}

// writeSingle sends one datagram.
func (c *PacketConn) writeSingle(b []byte, dst netip.AddrPort) error {
	if c.qp == nil {
		return syscall.EINVAL
	}
	bufs := [1][]byte{b}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if _, err := c.writeOne(bufs[:], dst); err != nil {
		c.postPending()
		return err
	}
	return c.postPending()
}

// WriteBatch sends each message as one datagram, posting them together:
// it returns how many it sent, as x/net's WriteBatch does (those posted
// to the device, and those lost to a port where nothing listens, before
// the first that was not sent), and the error that stopped it. flags
// must be 0.
func (c *PacketConn) WriteBatch(ms []Message, flags int) (int, error) {
	if c.invalid() {
		return 0, c.opErr("write", nil, syscall.EINVAL)
	}
	if flags != 0 {
		return 0, c.opErr("write", nil, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udpWriteBatch(ms)
	}
	return c.write(ms)
}

// write sends ms; it returns how many it sent.
func (c *PacketConn) write(ms []Message) (int, error) {
	if c.qp == nil {
		return 0, c.opErr("write", nil, syscall.EINVAL)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.callDone = 0
	for i := range ms {
		m := &ms[i]
		m.N = 0
		dst, err := destOf(m.Addr)
		if err == nil {
			m.N, err = c.writeOne(m.Buffers, dst)
		}
		if err != nil {
			m.N = 0
			if perr := c.postPending(); perr != nil {
				err = perr
			}
			return c.writeDone(ms, i, err)
		}
	}
	if err := c.postPending(); err != nil {
		return c.writeDone(ms, len(ms), err)
	}
	return len(ms), nil
}

// writeDone ends a write call that err stopped once the first queued
// of ms were queued: the datagrams posted (or lost as UDP loses them)
// before the first that was not are the call's count, as x/net's
// WriteBatch's, and the error names the first one not sent; writeMu is
// held.
func (c *PacketConn) writeDone(ms []Message, queued int, err error) (int, error) {
	n := min(c.callDone, queued)
	for i := n; i < queued; i++ {
		ms[i].N = 0 // queued, but not posted: never sent
	}
	var addr net.Addr
	if n < len(ms) {
		addr = ms[n].Addr
	}
	return n, c.opErr("write", addr, err)
}

// writeOne places one datagram in the send slots (waiting for room) and
// queues its work requests; writeMu is held.
func (c *PacketConn) writeOne(bufs [][]byte, dst netip.AddrPort) (int, error) {
	if isClosed(c.closing) {
		return 0, net.ErrClosed
	}
	if c.wdl.expired() {
		return 0, errTimeout
	}
	size := 0
	for _, b := range bufs {
		size += len(b)
	}
	if size > wire.MaxDatagram {
		return 0, &messageTooLongError{size}
	}
	d, ref, err := c.dest(dst, true)
	if errors.Is(err, errNoListener) {
		// Lost, as UDP's to a port where nothing listens; done for the
		// write call once what is queued before it goes.
		c.stats.noListener.Add(1)
		c.pendDone++
		return size, nil
	}
	if err != nil {
		return 0, err
	}
	release := func() {
		if ref != nil {
			c.peers.release(ref)
		}
	}
	whole := size+wire.DgramHeaderLen <= c.mtu
	frag := c.mtu - wire.DgramFragHeaderLen
	count := 1
	if !whole {
		count = wire.DgramFragments(size, frag)
	}
	if err := c.waitSlots(count); err != nil {
		release()
		return 0, err
	}
	if c.qpGone {
		// Closed, or the device removed, while the write waited: the
		// memory goes too.
		release()
		return 0, c.goneErr()
	}
	c.nextID++
	id := c.nextID
	r := msgReader{bufs: bufs}
	for k := 0; k < count; k++ {
		c.smu.Lock()
		seq := c.sent
		slot := int(seq % uint64(c.opts.SendDepth))
		c.smu.Unlock()
		off := c.sendOff() + slot*c.mtu
		h := wire.DgramHeader{Port: c.port}
		n := size
		if !whole {
			n = min(frag, size-k*frag)
			h = wire.DgramHeader{Port: c.port, Fragment: true, ID: id, Total: size, Offset: k * frag, FragSize: frag}
		}
		hl := wire.PutDgramHeader(c.mem[off:], h)
		r.read(c.mem[off+hl : off+hl+n])
		var last *peerRef[udDest]
		if k == count-1 {
			last = ref
		}
		c.queueSend(seq, off, hl+n, d, last)
		if k == count-1 {
			// Sent once this message is posted.
			c.pendSent++
			c.pendDone++
			c.pendBytes += uint64(size)
		}
		if len(c.wrs) == cap(c.wrs) {
			if err := c.postPending(); err != nil {
				if k < count-1 {
					// The fragments posted before may still be in
					// flight: this one's slot, never to complete now,
					// holds the destination until release.
					c.smu.Lock()
					c.sendRefs[slot] = ref
					c.smu.Unlock()
				}
				return 0, err
			}
		}
	}
	return size, nil
}

// queueSend queues the send of the n bytes at mem[off:] to d as send
// seq, whose slot holds ref (the destination of a datagram's last
// message), if any, until it completes; writeMu is held.
func (c *PacketConn) queueSend(seq uint64, off, n int, d udDest, ref *peerRef[udDest]) {
	wr := ibv.UDSendWR{ID: seq, Addr: c.base + uint64(off), Len: uint32(n), LKey: c.lkey,
		AH: d.ah, QPN: d.qpn, QKey: d.qkey}
	if n <= c.maxInline {
		// The device copies it at the post: no DMA read of the slot
		// later.
		wr.Flags = ibv.SendInline
	}
	c.smu.Lock()
	if seq%sigEvery == sigEvery-1 || int(seq+1-c.done) > c.opts.SendDepth/2 {
		wr.Flags |= ibv.SendSignaled
	}
	c.sendRefs[int(seq%uint64(c.opts.SendDepth))] = ref
	c.sent++
	c.smu.Unlock()
	c.wrs = append(c.wrs, wr)
}

// postPending posts the queued sends and counts their datagrams as
// sent, and done for the write call (see pendSent); writeMu is held. A
// failed post fails the send side for good: its slots would never come
// back. The datagrams of a post that failed were not sent, nor are they
// done.
func (c *PacketConn) postPending() error {
	if c.qpGone {
		c.wrs = c.wrs[:0]
		c.pendSent, c.pendDone, c.pendBytes = 0, 0, 0
		return c.goneErr()
	}
	if len(c.wrs) > 0 {
		err := c.qp.PostUDSends(c.wrs)
		c.wrs = c.wrs[:0]
		if err != nil {
			c.pendSent, c.pendDone, c.pendBytes = 0, 0, 0
			c.smu.Lock()
			if c.wfail == nil {
				c.wfail = err
			}
			c.smu.Unlock()
			return err
		}
	}
	c.stats.sent.Add(uint64(c.pendSent))
	c.stats.bytesSent.Add(c.pendBytes)
	c.callDone += c.pendDone
	c.pendSent, c.pendDone, c.pendBytes = 0, 0, 0
	return nil
}

// goneErr is the error of a call that finds the QP destroyed: Close's,
// or the removal of the device's (then ErrNoDevice, as reads and writes
// that look at the failures first get).
func (c *PacketConn) goneErr() error {
	if isClosed(c.closing) {
		return net.ErrClosed
	}
	c.smu.Lock()
	fail := c.wfail
	c.smu.Unlock()
	if errors.Is(fail, ErrNoDevice) {
		return fail
	}
	return net.ErrClosed
}

// waitSlots waits until count send slots are free; writeMu is held.
// Sends queued but not posted count as taken (c.sent has them), and are
// posted before a wait: only their completions could free slots.
func (c *PacketConn) waitSlots(count int) error {
	for {
		c.smu.Lock()
		free := c.opts.SendDepth - int(c.sent-c.done)
		fail := c.wfail
		c.smu.Unlock()
		if fail != nil {
			return fail
		}
		if free >= count {
			return nil
		}
		if err := c.postPending(); err != nil {
			return err
		}
		c.w.wait(c.writable, c.closing, c.wdl, &c.wavg)
		if isClosed(c.closing) {
			return net.ErrClosed
		}
		if c.wdl.expired() {
			return errTimeout
		}
	}
}

// msgReader copies a message's buffers out in pieces.
type msgReader struct {
	bufs [][]byte
	i, j int
}

func (r *msgReader) read(p []byte) {
	for len(p) > 0 {
		b := r.bufs[r.i][r.j:]
		n := copy(p, b)
		p = p[n:]
		if r.j += n; r.j == len(r.bufs[r.i]) {
			r.i, r.j = r.i+1, 0
		}
	}
}

// dest returns the resolved destination of ap, held until its send
// completes, resolving it first if needed. With locked, the caller holds
// writeMu: dest posts what is queued and lets writeMu go while it waits
// for a resolution, so that a new destination holds up no write to
// another.
func (c *PacketConn) dest(ap netip.AddrPort, locked bool) (udDest, *peerRef[udDest], error) {
	if ap.Addr().IsMulticast() {
		// A group's address handle lives as long as the membership.
		c.gmu.Lock()
		d, ok := c.groups[ap.Addr()]
		c.gmu.Unlock()
		if !ok {
			return d, nil, errNotMember
		}
		return d, nil, nil
	}
	for {
		if isClosed(c.closing) {
			return udDest{}, nil, net.ErrClosed
		}
		l := c.peers.acquire(ap, time.Now())
		var wait <-chan struct{}
		switch {
		case errors.Is(l.err, errCacheClosed):
			// Closed, or released for a device's removal (then the
			// writes' error says so).
			c.smu.Lock()
			fail := c.wfail
			c.smu.Unlock()
			if fail != nil {
				return udDest{}, nil, fail
			}
			return udDest{}, nil, net.ErrClosed
		case l.err != nil:
			return udDest{}, nil, l.err
		case l.resolve:
			c.stats.peerMisses.Add(1)
			wait = l.ref.wait
			c.startResolve(ap, l.ref, false)
		case l.ref != nil:
			c.stats.peerHits.Add(1)
			if l.refresh != nil {
				// Old enough to resolve again: meanwhile, writes go on.
				c.startResolve(ap, l.refresh, true)
			}
			return l.v, l.ref, nil
		default:
			wait = l.wait
		}
		done := 0
		if locked {
			if err := c.postPending(); err != nil {
				return udDest{}, nil, err
			}
			// Nothing is queued now: writes of others may come and go
			// meanwhile, and this call's count is kept for it.
			done = c.callDone
			c.writeMu.Unlock()
		}
		var err error
		select {
		case <-wait:
		case <-c.closing:
			err = net.ErrClosed
		case <-c.wdl.wait():
			err = errTimeout
		}
		if locked {
			c.writeMu.Lock()
			c.callDone = done
		}
		if err != nil {
			return udDest{}, nil, err
		}
	}
}

// resolveDone records the outcome of the resolution of ref's peer.
func (c *PacketConn) resolveDone(ref *peerRef[udDest], d udDest, err error) {
	if err != nil {
		c.stats.peerFailures.Add(1)
	}
	if r, _ := c.peers.resolved(ref, d, err, time.Now()); r != nil {
		// The writer that asked for it acquires it again.
		c.peers.release(r)
	}
}

// destOf turns a write's address into the destination's IP and port.
func destOf(a net.Addr) (netip.AddrPort, error) {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *Addr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	case nil:
		return ap, errMissingAddress
	default:
		return ap, &net.AddrError{Err: "not an rdma or udp address", Addr: a.String()}
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if !ap.Addr().IsValid() || ap.Addr().IsUnspecified() || ap.Port() == 0 && !ap.Addr().IsMulticast() {
		return ap, &net.AddrError{Err: "invalid destination", Addr: a.String()}
	}
	return ap, nil
}

var errMissingAddress = errors.New("missing address")

// errNoListener is a resolution's outcome when the destination's host
// answered that nothing listens on its port: a write to it succeeds and
// the datagram is lost (PacketStats.DropsNoListener), as UDP's, whose
// send succeeds where the ICMP port unreachable comes later, if ever.
var errNoListener = errors.New("rdma: nothing listens on the destination's port")

// sidrUnsupported is the status of an InfiniBand SIDR reply (the service
// ID resolution's answer) that says no id listens on the service ID
// (rdma_cm's port). One that rejects (status 2) says that a listener is
// there but did not take the request (as in the fault sweep, where the
// listener's calls fail): the resolution failed, and the error says so.
const sidrUnsupported = 1

// sidrNoListener reports whether the CM event that ended a service ID
// resolution says that nothing listens on the port: rdma_cm reports a
// SIDR reply that is not a success as an unreachable event whose status
// is the reply's (a positive number, where its own failures are negative
// errnos: a timeout is -ETIMEDOUT).
func sidrNoListener(unreachable bool, status int) bool {
	return unreachable && status == sidrUnsupported
}

// errNotMember is a write's to a multicast group the PacketConn has not
// joined: rdma_cm gives the address handle of a group to its members.
var errNotMember = errors.New("rdma: datagrams to a multicast group need a PacketConn of ListenMulticast that joined it")

// sendFailedError is the writes' error once the device completed a send
// with an error.
type sendFailedError struct{ status string }

func (e *sendFailedError) Error() string { return "rdma: a datagram's send failed: " + e.status }
func (e *sendFailedError) Unwrap() error { return syscall.EIO }

// messageTooLongError is a write's of a datagram over wire.MaxDatagram.
type messageTooLongError struct{ size int }

func (e *messageTooLongError) Error() string {
	return "datagram of " + strconv.Itoa(e.size) + " bytes is longer than 65507"
}
func (e *messageTooLongError) Unwrap() error { return syscall.EMSGSIZE }

// invalid reports whether c is nil or a zero PacketConn: its methods
// fail with EINVAL then, as a zero net.UDPConn's do.
func (c *PacketConn) invalid() bool { return c == nil || c.udp == nil && c.qp == nil }

func (c *PacketConn) opErr(op string, addr net.Addr, err error) error {
	var src net.Addr
	if c != nil && c.laddr != nil {
		src = c.laddr
	}
	return &net.OpError{Op: op, Net: "rdma", Source: src, Addr: addr, Err: err}
}

// LocalAddr returns the local address: an *Addr, or with FallbackUDP
// the UDP socket's *net.UDPAddr.
func (c *PacketConn) LocalAddr() net.Addr {
	if c.invalid() {
		return nil
	}
	if c.udp != nil {
		return c.udp.LocalAddr()
	}
	return c.laddr
}

// SetDeadline sets the read and write deadlines, as net.PacketConn's.
func (c *PacketConn) SetDeadline(t time.Time) error {
	if c.invalid() {
		return c.opErr("set", nil, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udp.SetDeadline(t)
	}
	if !c.rdl.set(t) || !c.wdl.set(t) {
		return c.opErr("set", nil, net.ErrClosed)
	}
	return nil
}

// SetReadDeadline sets the deadline of ReadFrom and ReadBatch.
func (c *PacketConn) SetReadDeadline(t time.Time) error {
	if c.invalid() {
		return c.opErr("set", nil, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udp.SetReadDeadline(t)
	}
	if !c.rdl.set(t) {
		return c.opErr("set", nil, net.ErrClosed)
	}
	return nil
}

// SetWriteDeadline sets the deadline of WriteTo and WriteBatch (a write
// waits for room to send, and for a new destination's resolution).
func (c *PacketConn) SetWriteDeadline(t time.Time) error {
	if c.invalid() {
		return c.opErr("set", nil, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udp.SetWriteDeadline(t)
	}
	if !c.wdl.set(t) {
		return c.opErr("set", nil, net.ErrClosed)
	}
	return nil
}

// Stats returns the PacketConn's counters.
func (c *PacketConn) Stats() PacketStats {
	if c == nil {
		return PacketStats{}
	}
	s := &c.stats
	return PacketStats{
		DatagramsSent: s.sent.Load(), DatagramsReceived: s.recvd.Load(),
		BytesSent: s.bytesSent.Load(), BytesReceived: s.bytesRecvd.Load(),
		DropsNoReceive: s.noReceive.Load(), DropsTruncated: s.truncated.Load(),
		DropsReassembly: s.reassembly.Load(), DropsMalformed: s.malformed.Load(), DropsStaleFragments: s.staleFragments.Load(),
		PeerHits: s.peerHits.Load(), PeerMisses: s.peerMisses.Load(), PeerFailures: s.peerFailures.Load(),
		SendErrors: s.sendErrors.Load(), DropsNoListener: s.noListener.Load(),
	}
}

// Close closes the PacketConn: blocked reads and writes return an error
// wrapping net.ErrClosed, and its QP, memory and address handles go.
func (c *PacketConn) Close() error {
	if c.invalid() {
		return c.opErr("close", nil, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udp.Close()
	}
	first := false
	c.closeOnce.Do(func() {
		first = true
		close(c.closing)
		c.rdl.stop()
		c.wdl.stop()
	})
	if !first {
		return c.opErr("close", nil, net.ErrClosed)
	}
	c.release()
	return nil
}

// ListenPacket announces on the local address for datagrams: "host:port"
// with an address of an RDMA interface (an empty host or unspecified
// address needs the host to have one RDMA device). Port 0 picks a free
// port; LocalAddr reports it. Networks are "rdma", "rdma4" and "rdma6".
//
// A PacketConn opened on the address and port of one closed before is
// reached by that one's peers once it writes to them, or at most 5 s
// (and a resolution) after they last heard from or resolved its
// predecessor; see PacketConn.
func ListenPacket(network, address string) (*PacketConn, error) {
	var lc ListenConfig
	return lc.listenPacket(context.Background(), network, address)
}

// ListenPacket announces on the local address for datagrams; see the
// package-level ListenPacket. With FallbackUDP it opens a kernel UDP
// socket on the same address where RDMA cannot serve it.
func (lc *ListenConfig) ListenPacket(ctx context.Context, network, address string) (net.PacketConn, error) {
	c, err := lc.listenPacket(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (lc *ListenConfig) listenPacket(ctx context.Context, network, address string) (*PacketConn, error) {
	opErr := func(addr net.Addr, err error) error {
		return &net.OpError{Op: "listen", Net: "rdma", Addr: addr, Err: err}
	}
	opts, err := lc.Packet.normalized()
	if err != nil {
		return nil, opErr(nil, err)
	}
	ap, err := resolve(ctx, network, address)
	if err != nil {
		return nil, opErr(nil, err)
	}
	c, err := listenPacket(ap, opts, netip.Addr{})
	if err != nil && lc.FallbackUDP && fallsBackToUDP(err) {
		return listenUDP(ctx, network, ap)
	}
	if err != nil {
		return nil, opErr(addrFrom(ap), err)
	}
	return c, nil
}

// ListenMulticast joins the multicast group gaddr on the RDMA device of
// the interface ifi (nil: the host's only RDMA device), as
// net.ListenMulticastUDP does: the PacketConn reads the datagrams sent to
// the group, and datagrams written to gaddr reach every member. Unlike
// UDP's, the group's port does not select what is read: every datagram
// to the group reaches every member, whatever port it was sent to; and
// only a member may send to the group. The PacketConn is also an
// ordinary one on a port of its own (LocalAddr), from which its datagrams
// come. Networks are "rdma", "rdma4" and "rdma6".
func ListenMulticast(network string, ifi *net.Interface, gaddr *Addr) (*PacketConn, error) {
	opErr := func(err error) (*PacketConn, error) {
		var a net.Addr
		if gaddr != nil {
			a = gaddr
		}
		return nil, &net.OpError{Op: "listen", Net: "rdma", Addr: a, Err: err}
	}
	switch network {
	case "rdma", "rdma4", "rdma6":
	default:
		return opErr(net.UnknownNetworkError(network))
	}
	group := gaddr.AddrPort().Addr()
	if gaddr == nil || !group.IsMulticast() || network == "rdma4" && !group.Is4() || network == "rdma6" && !group.Is6() {
		return opErr(&net.AddrError{Err: "not a multicast address", Addr: gaddr.String()})
	}
	local, err := multicastLocal(ifi, group.Is6())
	if err != nil {
		return opErr(err)
	}
	opts, _ := PacketOptions{}.normalized()
	c, err := listenPacket(netip.AddrPortFrom(local, 0), opts, group)
	if err != nil {
		return opErr(err)
	}
	return c, nil
}

// fallsBackToUDP reports whether a ListenPacket that failed with err may
// use a UDP socket instead (FallbackUDP): no RDMA device serves the
// address, its transport has no datagrams, or the build has no RDMA.
func fallsBackToUDP(err error) bool {
	return errors.Is(err, ErrNoDevice) || errors.Is(err, ErrUnsupported) || errors.Is(err, errNoDatagrams)
}

// errNoDatagrams is ListenPacket's error on a device whose transport has
// no unreliable datagrams.
var errNoDatagrams = errors.New("rdma: the device's transport (iWARP) has no unreliable datagrams")

func listenUDP(ctx context.Context, network string, ap netip.AddrPort) (*PacketConn, error) {
	udpNet := "udp"
	switch network {
	case "rdma4":
		udpNet = "udp4"
	case "rdma6":
		udpNet = "udp6"
	}
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, udpNet, ap.String())
	if err != nil {
		return nil, err
	}
	c := newPacketConn(PacketOptions{})
	c.udp = pc.(*net.UDPConn)
	return c, nil
}

// IsUDP reports whether the PacketConn is the kernel UDP socket that
// ListenConfig.FallbackUDP opened.
func (c *PacketConn) IsUDP() bool { return c != nil && c.udp != nil }

func (c *PacketConn) udpWriteTo(b []byte, addr net.Addr) (int, error) {
	if a, ok := addr.(*Addr); ok {
		addr = net.UDPAddrFromAddrPort(a.AddrPort())
	}
	return c.udp.WriteTo(b, addr)
}

func (c *PacketConn) udpReadBatch(ms []Message) (int, error) {
	if len(ms) == 0 {
		return 0, nil
	}
	var buf []byte
	if len(ms[0].Buffers) == 1 {
		buf = ms[0].Buffers[0]
	} else {
		buf = make([]byte, wire.MaxDatagram)
	}
	n, _, flags, addr, err := c.udp.ReadMsgUDP(buf, nil)
	if err != nil {
		return 0, err
	}
	flags &= MsgTrunc
	if len(ms[0].Buffers) != 1 {
		// Read whole into buf (no datagram is longer), then spread over
		// the buffers: what they do not hold is the truncated tail.
		data := buf[:n]
		n = 0
		for _, b := range ms[0].Buffers {
			n += copy(b, data[n:])
		}
		if n < len(data) {
			flags = MsgTrunc
		}
	}
	ms[0].N, ms[0].Addr, ms[0].Flags = n, addr, flags
	return 1, nil
}

func (c *PacketConn) udpWriteBatch(ms []Message) (int, error) {
	for i := range ms {
		var b []byte
		for _, p := range ms[i].Buffers {
			b = append(b, p...)
		}
		n, err := c.udpWriteTo(b, ms[i].Addr)
		if err != nil {
			return i, err
		}
		ms[i].N = n
	}
	return len(ms), nil
}
