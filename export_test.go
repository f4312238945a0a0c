package rdma

import (
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
