package rdma

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"
)

// Tracer is a set of callbacks for the events of connections' lives that
// counters cannot tell: when something happened, how long it took and why.
// Set it on a Dialer, or on a ListenConfig for the listener's connections
// and for a PacketConn. Every field is optional; a nil Tracer, or a nil
// field, costs nothing, and no callback is ever called per message.
//
// Callbacks run on the goroutine of the call that caused the event (Dial,
// Listen) or on one of the package's own goroutines, never with a lock of
// the connection held, so they may call the connection's methods; they
// may be called from several goroutines at once and must be safe for
// that. A callback that blocks holds up what caused its event (a dial, a
// connection's release, its device's removal): log, count, and return.
type Tracer struct {
	// DialStart is called when Dialer.DialContext (or Dial) begins.
	DialStart func(DialStartInfo)
	// DialDone is called once when the dial returns, with its outcome:
	// over RDMA, or over TCP when it fell back.
	DialDone func(DialDoneInfo)
	// Fallback is called when a dial or a listener goes over TCP, or a
	// PacketConn over UDP, because RDMA cannot serve it.
	Fallback func(FallbackInfo)
	// Refused is called for every connection request a listener refuses,
	// with the same arguments as ListenConfig.Refused and on the same
	// goroutines.
	Refused func(RefusedInfo)
	// KeepAliveFailed is called when a connection's peer answered none of
	// its keepalive probes: the connection has failed with an error
	// wrapping syscall.ETIMEDOUT.
	KeepAliveFailed func(ConnEventInfo)
	// RingResized is called when the peer has moved to a connection's new
	// receive ring: a larger one while it streams, or back to the small
	// one after it went idle.
	RingResized func(RingResizedInfo)
	// DeviceRemoved is called when the RDMA device under a connection, a
	// listener or a PacketConn is removed: it has failed with an error
	// wrapping ErrNoDevice, and its verbs objects are being given back.
	DeviceRemoved func(DeviceRemovedInfo)
	// ConnClosed is called once for every connection that Dial or Accept
	// returned, when its verbs objects and memory have been given back
	// (after Close returned, or after a failure or the device's removal
	// released it).
	ConnClosed func(ConnClosedInfo)
}

// DialStartInfo is what Tracer.DialStart gets.
type DialStartInfo struct {
	Network, Address string // as given to the dial
}

// DialDoneInfo is what Tracer.DialDone gets.
type DialDoneInfo struct {
	Network string // "rdma", or "tcp" when the dial fell back to TCP
	Address string // as given to the dial
	// Local and Remote are the connection's addresses (nil if it failed).
	Local, Remote net.Addr
	// Duration is the whole dial's, fallback included.
	Duration time.Duration
	// The RDMA dial's phases, each as long as it took (zero if it was
	// not reached): the address's resolution to a device
	// (rdma_resolve_addr), the route's (rdma_resolve_route), the data
	// path's setup (memory, QP, receives, overlapping the route's; with
	// any wait for a setup slot), and the connection's request until the
	// peer's answer (rdma_connect and the handshake). A dial that tried
	// again (the listener was busy) reports its last try's.
	Resolve, Route, Setup, Connect time.Duration
	// Err is the dial's error, nil if it succeeded.
	Err error
}

// FallbackInfo is what Tracer.Fallback gets.
type FallbackInfo struct {
	Op      string // "dial", "listen" (a Listener) or "listenpacket"
	Network string // what it went over instead: "tcp" or "udp"
	Address string
	// Reason is why RDMA could not serve it (ErrNoDevice, say).
	Reason error
}

// RefusedInfo is what Tracer.Refused gets.
type RefusedInfo struct {
	Remote net.Addr
	// Err is a *net.OpError (Op "accept") whose chain holds the
	// *RefusedError the dialer was told, as ListenConfig.Refused gets.
	Err error
}

// ConnEventInfo names the connection an event happened to.
type ConnEventInfo struct {
	Local, Remote net.Addr
	// Err is the error the connection failed with.
	Err error
}

// RingResizedInfo is what Tracer.RingResized gets.
type RingResizedInfo struct {
	Local, Remote net.Addr
	Grew          bool // a larger ring; false: back to the small one
	Size          int  // the receive ring's size in bytes now
}

// DeviceRemovedInfo is what Tracer.DeviceRemoved gets.
type DeviceRemovedInfo struct {
	Local, Remote net.Addr // Remote is nil for a listener or PacketConn
	Err           error    // the error its calls return from now on
}

// ConnClosedInfo is what Tracer.ConnClosed gets.
type ConnClosedInfo struct {
	Local, Remote net.Addr
	// Duration is how long the connection lived, from the start of its
	// dial or its request's arrival to its release.
	Duration time.Duration
	// Err is why the connection failed: nil if it ended without failing
	// (Close, the peer's close or CloseWrite); else what its Reads
	// returned or would have (a keepalive that went unanswered, the
	// peer's reset, a protocol violation, the device's removal).
	Err error
	// Stats are the connection's counters at the end.
	Stats ConnStats
}

// observer delivers a connection's, listener's or PacketConn's events to
// its Tracer and its Logger. A nil *observer (neither set) is the common
// case and costs one comparison per event.
type observer struct {
	tr  *Tracer
	log *slog.Logger
}

// newObserver returns nil when there is nothing to tell.
func newObserver(tr *Tracer, log *slog.Logger) *observer {
	if tr == nil && log == nil {
		return nil
	}
	if tr == nil {
		tr = &Tracer{}
	}
	return &observer{tr: tr, log: log}
}

// The levels a service would want: Warn for what an operator must look at
// (a device gone, a peer that breaks the protocol), Info for what changes
// how the service runs (a fallback, a peer that vanished), Debug for the
// ordinary course of things (refusals, which may come in floods, ring
// moves, closes, dials).

func (o *observer) logf(level slog.Level, msg string, attrs ...slog.Attr) {
	if o.log == nil {
		return
	}
	ctx := context.Background()
	if !o.log.Enabled(ctx, level) {
		return
	}
	o.log.LogAttrs(ctx, level, msg, attrs...)
}

func addrAttr(key string, a net.Addr) slog.Attr {
	if a == nil {
		return slog.String(key, "")
	}
	return slog.String(key, a.String())
}

func (o *observer) dialStart(network, address string) {
	if o != nil && o.tr.DialStart != nil {
		o.tr.DialStart(DialStartInfo{Network: network, Address: address})
	}
}

func (o *observer) dialDone(info DialDoneInfo) {
	if o == nil {
		return
	}
	if o.tr.DialDone != nil {
		o.tr.DialDone(info)
	}
	if info.Err != nil {
		o.logf(slog.LevelDebug, "rdma: dial failed", slog.String("address", info.Address),
			slog.Duration("duration", info.Duration), slog.Any("error", info.Err))
	}
}

func (o *observer) fallback(info FallbackInfo) {
	if o == nil {
		return
	}
	if o.tr.Fallback != nil {
		o.tr.Fallback(info)
	}
	o.logf(slog.LevelInfo, "rdma: falling back to "+info.Network, slog.String("op", info.Op),
		slog.String("address", info.Address), slog.Any("reason", info.Reason))
}

func (o *observer) refused(remote net.Addr, err error) {
	if o == nil {
		return
	}
	if o.tr.Refused != nil {
		o.tr.Refused(RefusedInfo{Remote: remote, Err: err})
	}
	o.logf(slog.LevelDebug, "rdma: connection refused", addrAttr("remote", remote), slog.Any("error", err))
}

func (o *observer) keepAliveFailed(info ConnEventInfo) {
	if o == nil {
		return
	}
	if o.tr.KeepAliveFailed != nil {
		o.tr.KeepAliveFailed(info)
	}
	o.logf(slog.LevelInfo, "rdma: peer answered no keepalive probe", addrAttr("local", info.Local),
		addrAttr("remote", info.Remote), slog.Any("error", info.Err))
}

func (o *observer) ringResized(info RingResizedInfo) {
	if o == nil {
		return
	}
	if o.tr.RingResized != nil {
		o.tr.RingResized(info)
	}
	o.logf(slog.LevelDebug, "rdma: receive ring resized", addrAttr("local", info.Local),
		addrAttr("remote", info.Remote), slog.Bool("grew", info.Grew), slog.Int("size", info.Size))
}

func (o *observer) deviceRemoved(info DeviceRemovedInfo) {
	if o == nil {
		return
	}
	if o.tr.DeviceRemoved != nil {
		o.tr.DeviceRemoved(info)
	}
	o.logf(slog.LevelWarn, "rdma: device removed", addrAttr("local", info.Local),
		addrAttr("remote", info.Remote), slog.Any("error", info.Err))
}

func (o *observer) connClosed(info ConnClosedInfo) {
	if o == nil {
		return
	}
	if o.tr.ConnClosed != nil {
		o.tr.ConnClosed(info)
	}
	level := slog.LevelDebug
	if errors.As(info.Err, new(*protocolError)) {
		// A peer that breaks the protocol is broken or hostile.
		level = slog.LevelWarn
	}
	o.logf(level, "rdma: connection closed", addrAttr("local", info.Local), addrAttr("remote", info.Remote),
		slog.Duration("lifetime", info.Duration), slog.Any("error", info.Err))
}
