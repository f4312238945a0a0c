package rdma

import (
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The receive path of a PacketConn: the receives posted in their slots
// (initPath posts them all), what each arriving datagram does (recvDone:
// to the queue, to reassembly, or dropped and counted), how ReadFrom and
// ReadBatch take datagrams out of the queue (read, popLocked), and how
// consumed receives are posted again (repostLocked, flushRepostsLocked).
// The queue and the counts of the slots are recvState's.

// rxItem is a datagram waiting for a reader: in a receive slot (slot >=
// 0, its bytes at mem[off:off+n]) or reassembled (buf).
type rxItem struct {
	slot int
	off  int
	n    int
	buf  []byte
	src  netip.AddrPort
}

// recvState is a PacketConn's receive side: the datagrams waiting for a
// reader, the receive slots they hold and those posted, the consumed
// receives waiting to be posted again, the reassembly of fragmented
// datagrams, and the failure that ended the side. rmu guards the rest:
// complete takes it, and the methods that say rmu is held (their names
// mostly end in Locked) are called with it.
type recvState struct {
	rmu     sync.Mutex
	queue   []rxItem // a ring of the datagrams waiting for a reader
	qhead   int
	qlen    int
	held    int // receive slots the queue holds
	posted  int // receives posted
	reposts []ibv.RecvWR
	reasm   *reassembler
	rfail   error // the receive side failed for good (a failed post)
}

// enqueue puts a datagram at the end of the queue, which has room; rmu
// is held.
func (r *recvState) enqueue(it rxItem) {
	r.queue[(r.qhead+r.qlen)%len(r.queue)] = it
	r.qlen++
}

// dequeue takes the oldest datagram of the queue, which has one; rmu is
// held.
func (r *recvState) dequeue() rxItem {
	it := r.queue[r.qhead]
	r.queue[r.qhead] = rxItem{}
	r.qhead = (r.qhead + 1) % len(r.queue)
	r.qlen--
	return it
}

// failRecvs fails the receive side with err, unless it failed before.
func (r *recvState) failRecvs(err error) {
	r.rmu.Lock()
	if r.rfail == nil {
		r.rfail = err
	}
	r.rmu.Unlock()
}

// wrRecvFlag marks a receive's work request id (the slot is the rest);
// a send's is its sequence number.
const wrRecvFlag = 1 << 63

// repostBatch is how many consumed receives are posted again at once.
const repostBatch = 16

// slotLen is the size of a receive slot: the GRH, then a message of up
// to the MTU.
func (c *PacketConn) slotLen() int { return ibv.GRHLen + c.mtu }

// minPosted is the receives kept posted however far the reader lags: a
// datagram that finds a reader's queue full is dropped (and counted) by
// the library, not silently by the device for want of a receive. A burst
// that outruns the poller's reposting may still find none posted: the
// device drops those, uncounted here, as a NIC's full ring drops UDP's.
func (c *PacketConn) minPosted() int { return max(16, c.opts.RecvDepth/4) }

func (c *PacketConn) recvWR(slot int) ibv.RecvWR {
	off := slot * c.slotLen()
	return ibv.RecvWR{ID: wrRecvFlag | uint64(slot), Addr: c.base + uint64(off), Len: uint32(c.slotLen()), LKey: c.lkey}
}

// recvDone handles a receive's completion (see complete): a datagram
// received goes to the queue (or, a fragment, to reassembly). It reports
// whether receives wait to be posted again (lockAndFlush).
func (c *PacketConn) recvDone(wc ibv.WC) bool {
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
	c.enqueue(it)
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
	it := c.dequeue()
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
		return c.udp.readBatch(ms)
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
