package rdma

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The send path of a PacketConn: WriteTo and WriteBatch find each
// datagram's destination (dest, resolving a new one), place it in the
// send slots, in fragments if it is longer than a message (writeOne),
// queue its work requests (queueSend) and post them (postPending);
// sendDone frees the slots as the sends complete. What a write queues is
// writeState's, the slots' accounting sendSlots'.

// sigEvery is how often a send is signaled: its completion frees every
// slot up to it. Besides, every send is signaled that leaves more than
// half of the slots in flight, so a writer that waits for room always
// has a signaled send ahead to wake it (sendDepthFor makes the largest
// datagram need at most half), and a writer that sends now and then
// costs no completion per datagram.
const sigEvery = 16

// writeState is what the writer of the moment queues: the work requests
// of the sends queued since the last post (wrs), their datagrams, and the
// id of the last fragmented datagram. PacketConn.writeMu guards it.
type writeState struct {
	wrs []ibv.UDSendWR
	// The datagrams of the sends queued since the last post (c.wrs):
	// pendSent of them, of pendBytes, to be counted as sent once posted;
	// pendDone those and the ones lost as UDP loses them (no listener),
	// to be counted in callDone, the datagrams of the current write
	// call that are done, once every one queued before is posted.
	pendSent, pendDone, callDone int
	pendBytes                    uint64
	nextID                       uint32
}

// dropPending forgets the sends queued since the last post and their
// datagrams: posted and counted, or never to be.
func (w *writeState) dropPending() {
	w.wrs = w.wrs[:0]
	w.pendSent, w.pendDone, w.pendBytes = 0, 0, 0
}

// sendSlots are the send slots' accounting: the sends posted (sent) and
// completed (done), whose difference is the slots in use; by slot, the
// destination a datagram's last message holds until its send completes;
// and the failure that ended the send side. smu guards the rest.
type sendSlots struct {
	smu      sync.Mutex
	sent     uint64             // sends posted
	done     uint64             // sends completed (the ring's free slots follow)
	sendRefs []*peerRef[udDest] // by send slot: the destination a datagram's last message holds
	wfail    error              // the send side failed for good
}

// slotsFree returns how many of depth send slots are free, and the send
// side's failure, if any.
func (s *sendSlots) slotsFree(depth int) (int, error) {
	s.smu.Lock()
	defer s.smu.Unlock()
	return depth - int(s.sent-s.done), s.wfail
}

// sendFailure returns the failure that ended the send side, if any.
func (s *sendSlots) sendFailure() error {
	s.smu.Lock()
	defer s.smu.Unlock()
	return s.wfail
}

// failSends fails the send side with err, unless it failed before.
func (s *sendSlots) failSends(err error) {
	s.smu.Lock()
	if s.wfail == nil {
		s.wfail = err
	}
	s.smu.Unlock()
}

func (c *PacketConn) sendOff() int { return c.opts.RecvDepth * c.slotLen() }

// sendDepthFor is the send depth o asks for, raised to what the largest
// datagram needs in fragments of an MTU of mtu.
func sendDepthFor(o PacketOptions, mtu int) int {
	return max(o.SendDepth, 2*wire.DgramFragments(wire.MaxDatagram, mtu-wire.DgramFragHeaderLen)+sigEvery)
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
		return c.udp.writeTo(b, addr)
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
		return c.udp.writeBatch(ms)
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
// sent, and done for the write call (see writeState); writeMu is held. A
// failed post fails the send side for good: its slots would never come
// back. The datagrams of a post that failed were not sent, nor are they
// done.
func (c *PacketConn) postPending() error {
	if c.qpGone {
		c.dropPending()
		return c.goneErr()
	}
	if len(c.wrs) > 0 {
		if err := c.qp.PostUDSends(c.wrs); err != nil {
			c.dropPending()
			c.failSends(err)
			return err
		}
	}
	c.stats.sent.Add(uint64(c.pendSent))
	c.stats.bytesSent.Add(c.pendBytes)
	c.callDone += c.pendDone
	c.dropPending()
	return nil
}

// waitSlots waits until count send slots are free; writeMu is held.
// Sends queued but not posted count as taken (c.sent has them), and are
// posted before a wait: only their completions could free slots.
func (c *PacketConn) waitSlots(count int) error {
	for {
		free, fail := c.slotsFree(c.opts.SendDepth)
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
		d, ok := c.groupDest(ap.Addr())
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
			if fail := c.sendFailure(); fail != nil {
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
