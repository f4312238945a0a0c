package rdma

import (
	"fmt"
	"net"
	"time"
)

// SetPortDownGrace shortens how long a port may stay down before its
// connections fail, for a test, and returns what restores it.
func SetPortDownGrace(d time.Duration) (restore func()) {
	old := portDownGrace
	portDownGrace = d
	return func() { portDownGrace = old }
}

// SetDefaultDialTimeout shortens the bound of a dial without a deadline for
// a test, and returns what restores it.
func SetDefaultDialTimeout(d time.Duration) (restore func()) {
	old := defaultDialTimeout
	defaultDialTimeout = d
	return func() { defaultDialTimeout = old }
}

// ParseReject reads the reason out of a reject's private data.
func ParseReject(b []byte) RefuseReason { return parseReject(b) }

// ReleaseIdleDevices gives back at once what devices without connections
// keep for a while (their CQ, poller goroutine and pooled memory), so that
// a test can check that nothing else is left.
func ReleaseIdleDevices() { releaseIdleDevices() }

// SetDeviceLinger changes how long a device without connections stays set
// up, for a test, and returns what restores it.
func SetDeviceLinger(d time.Duration) (restore func()) {
	devMu.Lock()
	defer devMu.Unlock()
	old := deviceLinger
	deviceLinger = d
	return func() {
		devMu.Lock()
		defer devMu.Unlock()
		deviceLinger = old
	}
}

// WaitReleases waits until the releases of closed connections' verbs
// objects, which Close leaves running, are done: for a test that counts
// what the devices hold.
func WaitReleases() { releasing.Wait() }

// HoldLock takes the connection's lock, as a Read or Write stuck while
// holding it would, and returns what releases it: for a test that nothing
// else of the process waits on one connection's lock.
func HoldLock(c *Conn) (release func()) {
	c.mu.Lock()
	return c.mu.Unlock
}

// SetShrinkIdle changes how long a grown connection stays idle before it
// gives its big rings back, for a test, and returns what restores it.
func SetShrinkIdle(d time.Duration) (restore func()) {
	old := shrinkIdle
	shrinkIdle = d
	return func() { shrinkIdle = old }
}

// TickRingIdle runs a connection's idle tick now (see shrinkIdle): with
// data since the last tick it arms the next one, shrinkIdle from now.
func TickRingIdle(c *Conn) { c.ringIdle() }

// QPCooling is how long a kept QP rests before it serves again.
const QPCooling = qpCooling

// WritePacketRaw sends b to addr as one UD message with no datagram
// header of this package's: the bytes a foreign or broken peer would
// send. b must fit the MTU.
func WritePacketRaw(c *PacketConn, b []byte, addr net.Addr) error {
	ap, err := destOf(addr)
	if err != nil {
		return err
	}
	d, ref, err := c.dest(ap, false)
	if err != nil {
		return err
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.waitSlots(1); err != nil {
		c.peers.release(ref)
		return err
	}
	c.smu.Lock()
	seq := c.sent
	c.smu.Unlock()
	off := c.sendOff() + int(seq%uint64(c.opts.SendDepth))*c.mtu
	n := copy(c.mem[off:off+c.mtu], b)
	c.queueSend(seq, off, n, d, ref)
	return c.postPending()
}

// PacketMTU is the largest UD message of c.
func PacketMTU(c *PacketConn) int { return c.mtu }

// UnconnectedRecvsLeft is how many releases of dials whose QP never got
// connected ended their drain with receives still posted.
func UnconnectedRecvsLeft() int64 { return unconnectedRecvsLeft.Load() }

// SetPostHeld makes connections set up from now on post their sends with
// the lock held, as on a NIC, whatever the device (see forcePostHeld).
func SetPostHeld(on bool) { forcePostHeld = on }

// DebugState renders what a stuck call waits on: the connection's credits,
// send ring and queue, receive ring and lifecycle. It waits at most a
// second for the lock (a call stuck holding it is news too).
func DebugState(c *Conn) string {
	for deadline := time.Now().Add(time.Second); !c.mu.TryLock(); {
		if time.Now().After(deadline) {
			return "mu held for more than a second"
		}
		time.Sleep(time.Millisecond)
	}
	defer c.mu.Unlock()
	return fmt.Sprintf("life{phase %v shut %#x rerr %v werr %v cut %v} cr{credits %d ctrl %d unreported %d ctrlOwed %d want %v batch %d peerCredits %d peerCtrl %d window %d holdAt %d noDelay %v noMerge %v streaming %v short %v told %v peerWants %v} "+
		"tx{span %d maxMsg %d tail %d acked %d n %d oldOut %d depth %d dataSeq %d dataDone %d ctrlSeq %d ctrlDone %d lastSig %d postedSig %d pendLen %d pendMore %v filling %v finQueued %v queued %d posting %v draining %v} "+
		"rx{span %d tail %d read %d reported %d n %d off %d reposts %d posted %d oldLeft %d} txReady %d rxReady %d qpBroken %v heard %d postHeld %v",
		c.life.phase, c.life.shut, c.life.rerr, c.life.werr, c.life.cut,
		c.cr.credits, c.cr.ctrlCredits, c.cr.unreported, c.cr.ctrlOwed, c.cr.wantCredit, c.cr.batch, c.cr.peerCredits, c.cr.peerCtrl, c.cr.peerWindow, c.cr.holdAt, c.cr.noDelay, c.cr.noMerge, c.cr.streaming, c.cr.short, c.cr.told, c.cr.peerWants,
		c.tx.ring.span, c.tx.ring.maxMsg, c.tx.ring.tail, c.tx.ring.acked, c.tx.ring.n, c.tx.ring.oldOut, c.tx.depth, c.tx.dataSeq, c.tx.dataDone, c.tx.ctrlSeq, c.tx.ctrlDone, c.tx.lastSig, c.tx.postedSig, c.tx.pendLen, c.tx.pendMore, c.tx.filling, c.tx.finQueued, len(c.tx.sends), c.tx.posting, c.tx.draining,
		c.rx.span, c.rx.tail, c.rx.read, c.rx.reported, c.rx.n, c.rx.off, c.rx.reposts, c.rx.posted, c.rx.oldLeft,
		len(c.txReady), len(c.rxReady), c.qpBroken, c.heard, c.postHeld)
}
