package rdma

import (
	"net"
	"syscall"
	"time"
)

// Keepalive: a connection that hears nothing from its peer for a while
// sends a probe that the peer's NIC must acknowledge, and fails with
// ETIMEDOUT if none is, as a TCP keepalive does. Without it a connection
// that only reads never learns that the peer's host vanished: RC has no
// traffic of its own while nothing is posted.
//
// The probe is a zero-length RDMA WRITE: the peer's NIC acknowledges it
// without touching memory (no rkey is checked for zero bytes) and without
// consuming a receive, so it needs no credit, the peer's CPU never sees
// it, and a peer whose application does not read still answers. While it
// is unacknowledged, the NIC retransmits it on its own (see the ACK timeout
// and retry count in internal/rdmacm); if the NIC gives up first, the probe
// completes with a retry error, which also reads as ETIMEDOUT.

// Defaults of the keepalive, chosen so that a peer that vanished is noticed
// within 30 s by a connection that only reads (TCP's 15 s idle time, and
// fewer, shorter probes than TCP's nine of 15 s each: an RC probe is
// retransmitted by the NIC itself, so one that goes unanswered for
// seconds is already a lost peer).
const (
	DefaultKeepAliveIdle     = 15 * time.Second
	DefaultKeepAliveInterval = 5 * time.Second
	DefaultKeepAliveCount    = 2
)

// kaSteps is how finely a quiet spell is measured: a connection looks at
// its traffic every Idle/kaSteps, so its first probe goes between Idle and
// Idle + Idle/kaSteps after the last thing it heard.
const kaSteps = 4

// kaAction is what a keepalive tick asks the connection to do.
type kaAction uint8

const (
	kaWait  kaAction = iota // nothing yet
	kaProbe                 // send a probe
	kaFail                  // the peer answered no probe: fail the connection
)

// keepalive decides, from a connection's count of completions (everything
// it heard from the peer or its NIC), when to probe and when to give up.
// It is plain arithmetic over the times it is given; Conn.mu guards it.
type keepalive struct {
	cfg    net.KeepAliveConfig // normalized: Enable, and every field positive
	heard  uint64              // the count at the last tick
	quiet  int                 // ticks in a row that heard nothing, before probing
	probes int                 // probes sent since the peer was last heard
}

// normalizeKeepAlive fills in the defaults: zero fields take them, and
// negative ones keep what cur has (net's rule for KeepAliveConfig).
func normalizeKeepAlive(cfg, cur net.KeepAliveConfig) net.KeepAliveConfig {
	pick := func(v, old, def time.Duration) time.Duration {
		switch {
		case v > 0:
			return v
		case v < 0 && old > 0:
			return old
		}
		return def
	}
	cfg.Idle = pick(cfg.Idle, cur.Idle, DefaultKeepAliveIdle)
	cfg.Interval = pick(cfg.Interval, cur.Interval, DefaultKeepAliveInterval)
	switch {
	case cfg.Count > 0:
	case cfg.Count < 0 && cur.Count > 0:
		cfg.Count = cur.Count
	default:
		cfg.Count = DefaultKeepAliveCount
	}
	return cfg
}

// keepAliveFrom is the keepalive a Dialer or ListenConfig asks for, with
// net.Dialer's rule: KeepAliveConfig if it is enabled, otherwise probes
// after KeepAlive of quiet unless KeepAlive is negative.
func keepAliveFrom(period time.Duration, cfg net.KeepAliveConfig) net.KeepAliveConfig {
	if !cfg.Enable && period >= 0 {
		cfg = net.KeepAliveConfig{Enable: true, Idle: period}
	}
	if !cfg.Enable {
		return net.KeepAliveConfig{}
	}
	return normalizeKeepAlive(cfg, net.KeepAliveConfig{})
}

// reset starts over, as if the peer had just been heard with count heard.
func (k *keepalive) reset(heard uint64) {
	k.heard, k.quiet, k.probes = heard, 0, 0
}

// tick looks at the connection's completion count and says what to do
// now and how long to wait until the next tick. While the peer is heard,
// ticks come every Idle/kaSteps; after kaSteps quiet ones (the peer
// quiet for at least Idle) a probe goes, then one every Interval while
// the peer stays silent; the tick after Count probes fails the
// connection. A probe still unanswered is not sent again (probeOut): the
// NIC is retransmitting it, and the send queue has room for one.
func (k *keepalive) tick(heard uint64, probeOut bool) (kaAction, time.Duration) {
	step := max(k.cfg.Idle/kaSteps, time.Millisecond)
	if heard != k.heard {
		k.reset(heard)
		return kaWait, step
	}
	if k.probes == 0 {
		k.quiet++
		if k.quiet < kaSteps {
			return kaWait, step
		}
	} else if k.probes >= k.cfg.Count {
		return kaFail, 0
	}
	k.probes++
	if probeOut {
		return kaWait, k.cfg.Interval
	}
	return kaProbe, k.cfg.Interval
}

// keepaliveError fails a connection whose peer answered no probe: what a
// TCP keepalive failure gives, ETIMEDOUT.
type keepaliveError struct{ after time.Duration }

func (e *keepaliveError) Error() string {
	return "keepalive: the peer did not answer for " + e.after.String()
}
func (e *keepaliveError) Unwrap() error { return syscall.ETIMEDOUT }

// SetKeepAlive turns keepalive probes on (with the current or default
// settings) or off. A connection with keepalive off that only reads never
// notices a peer host that vanished.
func (c *Conn) SetKeepAlive(keepalive bool) error {
	cfg := net.KeepAliveConfig{Enable: keepalive, Idle: -1, Interval: -1, Count: -1}
	return c.SetKeepAliveConfig(cfg)
}

// SetKeepAlivePeriod sets how long the connection must be quiet before
// the first probe, and turns probes on.
func (c *Conn) SetKeepAlivePeriod(d time.Duration) error {
	return c.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: d, Interval: -1, Count: -1})
}

// SetKeepAliveConfig configures keepalive probes as net.TCPConn's method
// of that name does: Enable turns them on or off; Idle is how long the
// connection must be quiet (nothing received, nothing acknowledged)
// before the first probe, Interval the time between probes, and Count how
// many may go unanswered before the connection fails; zero fields take
// the defaults (DefaultKeepAliveIdle, DefaultKeepAliveInterval,
// DefaultKeepAliveCount) and negative ones keep their current value. A
// peer that stays silent fails the connection after Idle plus
// Count × Interval (the NIC may give up on a probe earlier; at most
// Idle/4 later); its Reads and Writes then return an error wrapping
// syscall.ETIMEDOUT.
func (c *Conn) SetKeepAliveConfig(cfg net.KeepAliveConfig) error {
	if !c.ok() {
		return errInvalid("set")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life.has(shutClosed) {
		return c.opErr("set", net.ErrClosed)
	}
	if cfg.Enable {
		cfg = normalizeKeepAlive(cfg, c.ka.cfg)
	} else {
		cfg = net.KeepAliveConfig{Idle: c.ka.cfg.Idle, Interval: c.ka.cfg.Interval, Count: c.ka.cfg.Count}
	}
	c.setKeepAlive(cfg)
	return nil
}

// setKeepAlive applies cfg and (re)starts or stops the timer; mu is held.
func (c *Conn) setKeepAlive(cfg net.KeepAliveConfig) {
	c.ka.cfg = cfg
	c.ka.reset(c.heard)
	if c.kaTimer != nil {
		c.kaTimer.Stop()
	}
	if !cfg.Enable || c.life.phase == phaseDead {
		return
	}
	step := max(cfg.Idle/kaSteps, time.Millisecond)
	if c.kaTimer == nil {
		c.kaTimer = time.AfterFunc(step, c.keepAliveTick)
	} else {
		c.kaTimer.Reset(step)
	}
}

// stopKeepAlive stops the probes for good (the teardown); mu is held.
func (c *Conn) stopKeepAlive() {
	c.ka.cfg.Enable = false
	if c.kaTimer != nil {
		c.kaTimer.Stop()
	}
	if c.nudge != nil {
		// The first message's repeats too (see nudgeFirst).
		c.nudge.Stop()
	}
}

// keepAliveTick runs on the timer's goroutine.
func (c *Conn) keepAliveTick() {
	c.mu.Lock()
	if failed := c.keepAliveStep(); failed != nil {
		o := c.obs
		c.mu.Unlock()
		o.keepAliveFailed(c.eventInfo(failed))
		return
	}
	c.mu.Unlock()
}

// keepAliveStep is keepAliveTick's work with mu held; it returns the
// error the connection failed with if its peer answered no probe.
func (c *Conn) keepAliveStep() error {
	if !c.ka.cfg.Enable || c.life.phase != phaseEstablished || c.life.rerr != nil || c.life.has(shutPeerGone) {
		// Off, torn down, or failed already: nothing left to find out.
		return nil
	}
	act, next := c.ka.tick(c.heard, c.tx.probeOut())
	switch act {
	case kaProbe:
		if c.tx.draining || c.life.werr != nil {
			// Nothing can be posted (the send side failed): no probe
			// goes, so none can go unanswered either.
			c.ka.reset(c.heard)
			break
		}
		c.tx.queueProbe()
		c.st.KeepAliveProbes++
		c.flushDroppingLock()
	case kaFail:
		return c.keepAliveFailed()
	}
	if c.ka.cfg.Enable {
		c.kaTimer.Reset(next)
	}
	return nil
}

// keepAliveFailed fails the connection whose peer answered no probe, and
// disconnects it (the QP's outstanding work is flushed).
func (c *Conn) keepAliveFailed() error {
	cfg := c.ka.cfg
	err := &keepaliveError{cfg.Idle + time.Duration(cfg.Count)*cfg.Interval}
	c.fail(err)
	return err
}
