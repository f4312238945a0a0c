//go:build linux && cgo

package rdma

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
)

// packetSys is the verbs side of a PacketConn: a UDP port space id bound
// to the address and listening (it answers the service ID resolutions of
// peers that send to the port with the QP's number), one UD QP on the
// device's shared CQ, its memory, and the resolutions in progress.
type packetSys struct {
	cm       *cmLoop
	handle   uintptr
	id       udID
	dev      *device
	cqs      *cqShard
	vqp      *ibv.QP
	pd       *ibv.PD
	mr       *ibv.MR
	cqe      int
	src      netip.Addr // the bound address, unless unspecified: resolutions start from it
	wg       sync.WaitGroup
	stopRes  context.CancelFunc
	resCtx   context.Context
	mcEv     chan rdmacm.Event // a multicast join's outcome
	mcID     udID              // the id that joins groups (a listening id may not)
	mcHandle uintptr
	joined   []joinedGroup
	// released makes release run once: from Close, or at once when the
	// device is removed (the kernel finishes the removal only once every
	// object of the device is gone).
	released sync.Once
	// resMu guards resClosed: once the release has begun, no resolution
	// starts (its goroutine would use the CM channel and the PD the
	// release frees).
	resMu     sync.Mutex
	resClosed bool
	// resolveFake, if set, resolves destinations in place of rdma_cm:
	// tests over a fake fabric set it.
	resolveFake func(netip.AddrPort) (udDest, error)
}

// joinedGroup is a multicast group the QP is attached to.
type joinedGroup struct {
	group netip.Addr
	attr  [len(rdmacm.UDParam{}.AHAttr)]byte
}

// listenPacket sets a PacketConn up on ap and, with a valid group, joins
// that multicast group. A removal of the device while it does so fails
// it with ErrNoDevice (see PacketConn.settingUp).
func listenPacket(ap netip.AddrPort, opts PacketOptions, group netip.Addr, obs *observer) (*PacketConn, error) {
	cm, err := acquireCM()
	if err != nil {
		return nil, err
	}
	c := newPacketConn(opts)
	c.obs = obs // before any event of the id can come
	c.cm = cm
	c.settingUp = true // before any event of the id can come
	c.resCtx, c.stopRes = context.WithCancel(context.Background())
	c.handle = cm.register(c)
	err = c.setup(ap)
	if err == nil && group.IsValid() {
		err = c.join(group)
	}
	if c.endSetup() {
		if c.dev != nil {
			markRemoved(c.dev.ctx.Ptr())
		}
		err = &deviceError{syscall.ENODEV}
	}
	if err != nil {
		c.release()
		return nil, err
	}
	return c, nil
}

// setup makes the PacketConn's id, QP and memory on ap (listenPacket).
func (c *PacketConn) setup(ap netip.AddrPort) (err error) {
	if c.id, err = c.cm.ch.newUDPID(c.handle); err != nil {
		return err
	}
	if err := c.id.Bind(ap); err != nil {
		return noDevice(err)
	}
	verbs, port := c.id.Verbs(), c.id.PortNum()
	if verbs == nil {
		if !ap.Addr().IsUnspecified() {
			// Bound, but to an interface without RDMA.
			return &deviceError{syscall.ENODEV}
		}
		// A wildcard id has no device, and a UD QP serves one: that of
		// the host's only device.
		var n int
		if verbs, n = rdmacm.OnlyDevice(); verbs == nil {
			if n == 0 {
				return &deviceError{syscall.ENODEV}
			}
			return fmt.Errorf("rdma: the host has %d RDMA devices: ListenPacket needs the address of one", n)
		}
		port = 1
	} else {
		c.src = ap.Addr()
	}
	ctx := ibv.ContextFrom(verbs)
	if ctx.IWARP() {
		return errNoDatagrams
	}
	mtu := ctx.ActiveMTU(port)
	if mtu == 0 {
		return os.NewSyscallError("ibv_query_port", syscall.EIO)
	}
	c.opts.SendDepth = sendDepthFor(c.opts, mtu)
	c.cqe = c.opts.RecvDepth + c.opts.SendDepth
	if c.dev, c.cqs, err = acquireDeviceCQ(verbs, c.cqe); err != nil {
		return err
	}
	if c.pd, err = ctx.AllocPD(); err != nil {
		return err
	}
	size := packetMemLen(c.opts, mtu)
	mem, err := mapMemory(size)
	if err != nil {
		return err
	}
	c.mem = mem
	if c.mr, err = c.pd.RegMR(mem); err != nil {
		return registerError(err, size)
	}
	c.dev.addRegistered(size)
	if c.vqp, c.maxInline, err = c.pd.CreateUDQP(c.cqs.cq, c.opts.SendDepth, c.opts.RecvDepth, udInline, port, ibv.UDQKey); err != nil {
		return err
	}
	// The receive path refreshes the cache from the first datagram on.
	c.peers = newPeerCache[udDest](c.opts.Peers, peerFailTTL, func(d udDest) { d.free() })
	c.cqs.add(c.vqp.Num, c)
	if err := c.initPath(c.vqp, mem, addrOf(mem), c.mr.LKey, mtu, c.cqs.poller, PollAdaptive); err != nil {
		return err
	}
	local := c.id.LocalAddr()
	if !local.Addr().IsValid() {
		local = ap
	}
	c.laddr, c.port = addrFrom(local), local.Port()
	if err := c.id.Listen(128); err != nil {
		return err
	}
	return nil
}

// join joins the multicast group and attaches the QP to it.
func (c *PacketConn) join(group netip.Addr) error {
	c.gmu.Lock()
	if c.mcEv == nil {
		c.mcEv = make(chan rdmacm.Event, 1)
	}
	c.gmu.Unlock()
	if c.mcID == nil {
		// rdma_cm joins groups on a bound id, not a listening one.
		c.mcHandle = c.cm.register(c)
		id, err := c.cm.ch.newUDPID(c.mcHandle)
		if err != nil {
			return err
		}
		c.mcID = id
		if err := id.Bind(netip.AddrPortFrom(c.laddr.AddrPort().Addr(), 0)); err != nil {
			return err
		}
	}
	if err := c.mcID.JoinMulticast(group); err != nil {
		return err
	}
	var ev rdmacm.Event
	select {
	case ev = <-c.mcEv:
	case <-time.After(c.opts.ResolveTimeout):
		return os.NewSyscallError("rdma_join_multicast", syscall.ETIMEDOUT)
	}
	if ev.Type != rdmacm.EventMulticastJoin || ev.UD == nil {
		return os.NewSyscallError("rdma_join_multicast", eventErrno(ev, syscall.EHOSTUNREACH))
	}
	if err := c.vqp.AttachMcast(ev.UD.AHAttr[:], false); err != nil {
		return err
	}
	c.joined = append(c.joined, joinedGroup{group: group, attr: ev.UD.AHAttr})
	ah, err := c.pd.CreateAH(ev.UD.AHAttr[:])
	if err != nil {
		return err
	}
	c.gmu.Lock()
	if c.groups == nil {
		c.groups = map[netip.Addr]udDest{}
	}
	c.groups[group] = udDest{ah: ah.Handle(), qpn: ev.UD.QPNum, qkey: ev.UD.QKey, free: func() { retryDestroy(ah.Destroy) }}
	c.gmu.Unlock()
	return nil
}

// multicastLocal finds the address a multicast member binds to: the
// interface's (or, for nil, the only RDMA device's) address of the
// group's family, as its device's GID table has it.
func multicastLocal(ifi *net.Interface, v6 bool) (netip.Addr, error) {
	devs, err := ibv.Devices()
	if err != nil {
		return netip.Addr{}, hostDeviceError(err)
	}
	var found []netip.Addr
	for _, d := range devs {
		for _, p := range d.Ports {
			for _, g := range p.GIDs {
				if g.Type != ibv.GIDTypeRoCEv2 || ifi != nil && g.Netdev != ifi.Name {
					continue
				}
				a := netip.AddrFrom16(g.GID)
				if a.Is4In6() != !v6 || a.IsLinkLocalUnicast() {
					continue
				}
				found = append(found, a.Unmap())
			}
		}
	}
	if len(found) == 0 {
		return netip.Addr{}, &deviceError{syscall.ENODEV}
	}
	if ifi == nil && len(found) > 1 {
		return netip.Addr{}, fmt.Errorf("rdma: the host's RDMA devices have %d addresses: ListenMulticast needs an interface", len(found))
	}
	return found[0], nil
}

// udInline is the inline size a PacketConn's QP asks for: small
// datagrams (a request, a reply) are copied at the post.
const udInline = 256

// peerFailTTL is how long a failed resolution is remembered: writes to
// that destination fail at once meanwhile.
const peerFailTTL = time.Second

// cmEvent answers the service ID resolutions of peers that send to the
// port, on the CM goroutine.
func (c *PacketConn) cmEvent(ev rdmacm.Event) {
	switch ev.Type {
	case rdmacm.EventConnectRequest:
		id := c.cm.ch.requestID(ev)
		if c.vqp != nil {
			id.AcceptUD(c.vqp.Num)
		} else {
			id.Reject(nil)
		}
		// The request's id has no further use, but must not be
		// destroyed on this goroutine (see cmHandler).
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			retryDestroy(id.Destroy)
		}()
	case rdmacm.EventMulticastJoin, rdmacm.EventMulticastError:
		select {
		case c.mcEv <- ev:
		default:
		}
	case rdmacm.EventDeviceRemoval:
		c.setupMu.Lock()
		if c.settingUp {
			// While the setup runs, c.dev is its to write: it marks
			// the removal itself when it ends, and releases. Decided
			// here, under the same lock as the check: a setup that ends
			// right after it must see the removal.
			c.removedSetup = true
		} else if c.dev != nil {
			markRemoved(c.dev.ctx.Ptr())
		}
		c.setupMu.Unlock()
		c.failAsync(nil, true) // and releases, or leaves that to the setup
	}
}

// cmLost fails the PacketConn: it could neither answer peers that resolve
// it nor resolve new destinations.
func (c *PacketConn) cmLost(err error) { c.failAsync(err, false) }

// startResolve resolves ap on a goroutine of its own and records the
// outcome in the peer cache (resolutionDone): a new destination's, or
// with refresh, that of one resolved before.
func (c *PacketConn) startResolve(ap netip.AddrPort, ref *peerRef[udDest], refresh bool) {
	c.resMu.Lock()
	defer c.resMu.Unlock()
	if c.resClosed {
		c.resolutionDone(ref, refresh, udDest{}, c.goneErr())
		return
	}
	resolve := c.resolveDest
	if c.resolveFake != nil {
		resolve = c.resolveFake
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		d, err := resolve(ap)
		c.resolutionDone(ref, refresh, d, err)
	}()
}

// resolveDest finds the address handle, QP number and Q_Key of the
// PacketConn at ap (resolveUD), and makes the address handle.
func (c *PacketConn) resolveDest(ap netip.AddrPort) (udDest, error) {
	ud, err := resolveUD(c.resCtx, c.cm, c.src, ap, c.opts.ResolveTimeout, c.dev.ctx.Ptr(), c.goneErr)
	if err != nil {
		return udDest{}, err
	}
	ah, err := c.pd.CreateAH(ud.AHAttr[:])
	if err != nil {
		return udDest{}, err
	}
	return udDest{ah: ah.Handle(), qpn: ud.QPNum, qkey: ud.QKey, free: func() { retryDestroy(ah.Destroy) }}, nil
}

// release tears down whatever the PacketConn has set up, in the reverse
// order: the listening id (no more resolutions answered), the
// resolutions, the QP, the address handles, the memory, the device.
func (c *PacketConn) release() { c.released.Do(c.releaseVerbs) }

// releaseAsync releases off the caller's goroutine (the CM goroutine or
// the device's events reader, where ids may not be destroyed).
func (c *PacketConn) releaseAsync() {
	releasing.Add(1)
	go func() {
		defer releasing.Done()
		c.release()
	}()
}

func (c *PacketConn) releaseVerbs() {
	c.resMu.Lock()
	c.resClosed = true
	c.resMu.Unlock()
	if c.stopRes != nil {
		c.stopRes()
	}
	if c.cm != nil {
		// Both handles before either id goes: an event of one must
		// not find the other destroyed.
		c.cm.unregister(c.handle)
		if c.mcHandle != 0 {
			c.cm.unregister(c.mcHandle)
		}
	}
	if c.id != nil {
		retryDestroy(c.id.Destroy)
	}
	if c.mcID != nil {
		retryDestroy(c.mcID.Destroy) // leaves the groups
	}
	c.wg.Wait()
	for _, g := range c.joined {
		c.vqp.AttachMcast(g.attr[:], true)
	}
	c.gmu.Lock()
	groups := c.groups
	c.groups = nil
	c.gmu.Unlock()
	if c.vqp != nil {
		c.cqs.retire(c.vqp.Num)
		// A writer or reader may be about to post: it sees qpGone once
		// it holds its lock. (Close has closed closing: a writer waiting
		// for room gives writeMu up.)
		c.writeMu.Lock()
		c.rmu.Lock()
		c.qpGone = true
		c.rmu.Unlock()
		c.writeMu.Unlock()
		retryDestroy(c.vqp.DestroyUD)
		c.cqs.forget(c.vqp.Num)
	}
	c.smu.Lock()
	var refs []*peerRef[udDest]
	for i, r := range c.sendRefs {
		if r != nil {
			refs = append(refs, r)
			c.sendRefs[i] = nil
		}
	}
	c.smu.Unlock()
	if c.peers != nil {
		c.releaseRefs(refs)
		c.peers.close()
	}
	for _, d := range groups {
		d.free()
	}
	c.rmu.Lock()
	if c.reasm != nil {
		c.reasm.reset()
	}
	c.qlen = 0
	c.rmu.Unlock()
	stuck := false
	if c.mr != nil {
		if retryDestroy(c.mr.Dereg) != nil {
			stuck = true
		} else if c.dev != nil {
			c.dev.addRegistered(-len(c.mem))
		}
	}
	if c.mem != nil && !stuck {
		unix.Munmap(c.mem)
	}
	if c.pd != nil && !stuck {
		retryDestroy(c.pd.Dealloc)
	}
	if c.dev != nil {
		c.dev.release(c.cqs, c.cqe)
	}
	if c.cm != nil {
		c.cm.release()
	}
}
