package rdma

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
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

// How a PacketConn is built, for those who work on it.
//
// This file holds the type, its setup over a QP (initPath), the
// completer's entries but the receive path's lockAndFlush (complete, and
// failAsync for the device's events) and the public methods that are
// neither reads nor writes. packet_recv.go has the receive path,
// packet_send.go the send path and the destinations it resolves,
// packet_udp.go the UDP fallback, and packet_verbs.go the platform's
// part (packetSys: the UDP port space id, the UD QP and its memory, the
// resolutions, the multicast joins, the release). The cache of resolved
// destinations is peercache.go's, the reassembly of fragmented datagrams
// reassembly.go's.
//
// Its state is in groups, each a type with the lock that guards it:
// recvState (rmu), writeState (writeMu, which serializes the writers as
// readMu does the readers), sendSlots (smu), mcastGroups (gmu) and
// packetSetup (setupMu). They are embedded: their fields read as the
// PacketConn's, their methods are called as its own. readMu is taken before rmu, and writeMu before
// smu, rmu (the release, to set qpGone) and gmu.

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

	udp   *udpFallback // with ListenConfig.FallbackUDP, where RDMA could not serve (packet_udp.go)
	obs   *observer    // ListenConfig.Tracer and Logger; nil for none
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

	readMu    sync.Mutex // serializes readers
	ravg      time.Duration
	readable  chan struct{}
	recvState // the receive side's state, under its rmu (packet_recv.go)

	writeMu    sync.Mutex // serializes writers; guards writeState
	wavg       time.Duration
	writable   chan struct{}
	writeState // what the writer queues, under writeMu (packet_send.go)
	sendSlots  // the send slots, under their smu (packet_send.go)
	// qpGone: the QP is destroyed (Close); set with writeMu and rmu held,
	// so that no post, of sends (writeMu) or receives (rmu), reaches it.
	qpGone bool

	peers *peerCache[udDest]
	stats packetCounters

	mcastGroups // the multicast groups joined, under their gmu
	packetSetup // whether the setup still runs, under its setupMu
}

// mcastGroups are the multicast groups a PacketConn joined (join,
// packet_verbs.go), by address: where the datagrams written to each go.
// gmu guards groups (and join's making of packetSys.mcEv).
type mcastGroups struct {
	gmu    sync.Mutex
	groups map[netip.Addr]udDest
}

// groupDest returns where datagrams to the group go, if it was joined.
func (g *mcastGroups) groupDest(group netip.Addr) (udDest, bool) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	d, ok := g.groups[group]
	return d, ok
}

// packetSetup tells a removal of the device whether the setup still
// runs. settingUp: the setup (listenPacket, and the join of
// ListenMulticast) still runs on the caller's goroutine and uses the
// verbs objects as it makes them, so a removal of the device meanwhile
// does not release them concurrently: it records removedSetup, and the
// setup fails with ErrNoDevice and releases what it made once it is done
// (endSetup), as a Conn's dial does (removedDialing). setupMu guards
// settingUp and removedSetup.
type packetSetup struct {
	setupMu                 sync.Mutex
	settingUp, removedSetup bool
}

// removedWhileSetup records a removal of the device that came while the
// setup runs, and reports whether one did (now, or as the connection
// manager's event recorded it): the setup releases then (endSetup).
func (s *packetSetup) removedWhileSetup() bool {
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	if s.settingUp {
		s.removedSetup = true
	}
	return s.removedSetup
}

// endSetup ends the setup and reports whether the device was removed
// while it ran: the setup's outcome is then ErrNoDevice, and the caller
// releases.
func (s *packetSetup) endSetup() bool {
	s.setupMu.Lock()
	defer s.setupMu.Unlock()
	s.settingUp = false
	return s.removedSetup
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

// packetMemLen is the memory a PacketConn registers.
func packetMemLen(o PacketOptions, mtu int) int {
	return o.RecvDepth*(ibv.GRHLen+mtu) + o.SendDepth*mtu
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

// complete handles one completion of the PacketConn's QP, on the poller
// (see completer): a datagram received goes to the queue (or, a
// fragment, to reassembly: recvDone), a send's completion frees the
// slots up to it (sendDone). It reports whether receives wait to be
// posted again (lockAndFlush).
func (c *PacketConn) complete(wc ibv.WC) bool {
	if wc.WRID&wrRecvFlag == 0 {
		c.sendDone(wc)
		return false
	}
	return c.recvDone(wc)
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
	c.failRecvs(err)
	signal(c.readable)
	c.failSends(err)
	signal(c.writable)
	if removed && !c.removedWhileSetup() {
		c.obs.deviceRemoved(DeviceRemovedInfo{Local: addrOrNil(c.laddr), Err: err})
		// The kernel finishes a device's removal only once every
		// object of it is gone: they go now, not at Close.
		c.releaseAsync()
	}
}

// goneErr is the error of a call that finds the QP destroyed: Close's,
// or the removal of the device's (then ErrNoDevice, as reads and writes
// that look at the failures first get).
func (c *PacketConn) goneErr() error {
	if isClosed(c.closing) {
		return net.ErrClosed
	}
	if fail := c.sendFailure(); errors.Is(fail, ErrNoDevice) {
		return fail
	}
	return net.ErrClosed
}

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

// IsUDP reports whether the PacketConn is the kernel UDP socket that
// ListenConfig.FallbackUDP opened.
func (c *PacketConn) IsUDP() bool { return c != nil && c.udp != nil }

// SetDeadline sets the read and write deadlines, as net.PacketConn's.
func (c *PacketConn) SetDeadline(t time.Time) error { return c.setDeadline(t, true, true) }

// SetReadDeadline sets the deadline of ReadFrom and ReadBatch.
func (c *PacketConn) SetReadDeadline(t time.Time) error { return c.setDeadline(t, true, false) }

// SetWriteDeadline sets the deadline of WriteTo and WriteBatch (a write
// waits for room to send, and for a new destination's resolution).
func (c *PacketConn) SetWriteDeadline(t time.Time) error { return c.setDeadline(t, false, true) }

// setDeadline sets the read deadline, the write deadline or both.
func (c *PacketConn) setDeadline(t time.Time, read, write bool) error {
	if c.invalid() {
		return c.opErr("set", nil, syscall.EINVAL)
	}
	if c.udp != nil {
		return c.udp.setDeadline(t, read, write)
	}
	if read && !c.rdl.set(t) || write && !c.wdl.set(t) {
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
	obs := newObserver(lc.Tracer, lc.Logger)
	c, err := listenPacket(ap, opts, netip.Addr{}, obs)
	if err != nil && lc.FallbackUDP && fallsBackToUDP(err) {
		u, uerr := listenUDP(ctx, network, ap)
		if uerr == nil {
			u.obs = obs
			obs.fallback(FallbackInfo{Op: "listenpacket", Network: "udp", Address: u.LocalAddr().String(), Reason: err})
		}
		return u, uerr
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
	c, err := listenPacket(netip.AddrPortFrom(local, 0), opts, group, nil)
	if err != nil {
		return opErr(err)
	}
	return c, nil
}
