package rdma

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

// Dialer holds options for dialing, like net.Dialer. The zero value works.
type Dialer struct {
	// Timeout bounds the whole dial (address and route resolution and
	// connection). Zero means the context's deadline bounds it, or, if it
	// has none, DefaultDialTimeout: a dial never waits forever for a
	// server that received the request and never answers. A listener
	// busy with as many handshakes as it keeps refuses a request as
	// RefusedBusy; the dial tries again after a pause (5ms, doubling up
	// to 1s, each drawn at random from its upper half) until the timeout,
	// as TCP sends its SYN again to a listener too busy to answer it. A
	// dial so refused until its timeout returns the refusal (a
	// *RefusedError), not a timeout: whether the timeout passed in a
	// pause or in the try after it, the listener is there and busy.
	// At most 128 dials of the process to one address are in their
	// handshake at once (each for 2s at most before the next may start);
	// the others wait their turn within the timeout,
	// so that a burst of thousands neither overruns the listener nor
	// answers its replies too late.
	Timeout time.Duration
	// LocalAddr, if not nil, is the local address to dial from (its port
	// is ignored).
	LocalAddr *Addr
	// KeepAlive is how long the connection must be quiet before the first
	// keepalive probe, as net.Dialer's: zero means the default
	// (DefaultKeepAliveIdle), negative turns probes off. It is ignored if
	// KeepAliveConfig.Enable is true.
	KeepAlive time.Duration
	// KeepAliveConfig configures the probes as net.Dialer's does (see
	// Conn.SetKeepAliveConfig). If its Enable is false and KeepAlive is
	// negative, there are none.
	KeepAliveConfig net.KeepAliveConfig
	// FallbackTCP, if set, makes Dial connect over TCP (Go's net, to the
	// same address and port) when RDMA cannot carry the connection: no
	// RDMA device serves the route, or this host has none, or this build
	// has no RDMA (the errors wrapping ErrNoDevice or ErrUnsupported); the
	// peer has no RDMA listener on the port (a RefusedError with reason
	// RefusedNoListener); or the peer's host never answered the RDMA
	// connection request (a host without RDMA). A refusal by an RDMA
	// listener (any other reason), a foreign RDMA server (ErrProtocol), a
	// timeout and a cancelled context never fall back. The connection is
	// then a *net.TCPConn: its local address's network is "tcp", and
	// IsRDMA reports false. If TCP fails too, the error holds both
	// failures.
	FallbackTCP bool
	// Tracer, if not nil, is called for the dial's events and for the
	// connection's later ones (see Tracer).
	Tracer *Tracer
	// Logger, if not nil, logs the dial's and the connection's rare
	// events (a fallback, a keepalive that gave up, the device's
	// removal, a peer that broke the protocol; never one per message);
	// nil logs nothing.
	Logger *slog.Logger
	Options
}

// Dial connects to address on network ("rdma", "rdma4" or "rdma6").
func Dial(network, address string) (*Conn, error) {
	var d Dialer
	return d.dial(context.Background(), network, address, nil)
}

// DialContext connects to address on network, honouring ctx's deadline and
// cancellation during resolution and connection. (On iWARP the kernel
// connects TCP inside rdma_connect and cannot be interrupted there: a Dial
// that gives up then returns at once, and the connection's resources go
// when that call returns, within TCP's SYN retries.) So that it can be plugged
// into code that dials TCP (http.Transport.DialContext, say), it takes
// "tcp", "tcp4" and "tcp6" to mean "rdma", "rdma4" and "rdma6".
// (For net/http's httptrace to see the dial, use rdmahttp.DialContext.)
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
		network = "rdma" + network[3:]
	}
	if d.FallbackTCP && d.Timeout > 0 {
		// One bound for both attempts.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	obs := newObserver(d.Tracer, d.Logger)
	var info *DialDoneInfo // the dial's record, kept only for an observer
	var start time.Time
	if obs != nil {
		start, info = time.Now(), &DialDoneInfo{Network: "rdma", Address: address}
		obs.dialStart(network, address)
	}
	var nc net.Conn
	c, err := d.dial(ctx, network, address, info)
	switch {
	case err == nil:
		if obs != nil {
			c.observe(obs)
		}
		nc = c
	case d.FallbackTCP && fallsBackToTCP(err):
		obs.fallback(FallbackInfo{Op: "dial", Network: "tcp", Address: address, Reason: err})
		nc, err = d.dialTCP(ctx, network, address, err)
		if info != nil {
			info.Network = "tcp"
		}
	}
	if info != nil {
		info.Duration, info.Err = time.Since(start), err
		if err == nil {
			info.Local, info.Remote = nc.LocalAddr(), nc.RemoteAddr()
		}
		obs.dialDone(*info)
	}
	if err != nil {
		return nil, err
	}
	return nc, nil
}

// Dial connects to address on network.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DefaultDialTimeout bounds a dial that has neither a Timeout nor a
// deadline: about what Linux's TCP connect takes to give up on a host that
// does not answer (127 s with the default six SYN retries). rdma_cm alone
// would wait much longer: a server's CM acknowledges a request it has not
// answered yet with an MRA, which stretches the dialer's timeout to minutes.
const DefaultDialTimeout = 2 * time.Minute

// defaultDialTimeout is DefaultDialTimeout; tests shorten it.
var defaultDialTimeout = DefaultDialTimeout

// dial is the RDMA dial; info, if not nil, gets its phases' durations.
func (d *Dialer) dial(ctx context.Context, network, address string, info *DialDoneInfo) (*Conn, error) {
	timeout := d.Timeout
	if _, ok := ctx.Deadline(); !ok && timeout <= 0 {
		timeout = defaultDialTimeout
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	opErr := func(addr net.Addr, err error) error {
		var src net.Addr
		if d.LocalAddr != nil {
			src = d.LocalAddr
		}
		return &net.OpError{Op: "dial", Net: "rdma", Source: src, Addr: addr, Err: err}
	}
	opts, err := d.Options.normalized()
	if err != nil {
		return nil, opErr(nil, err)
	}
	raddr, err := resolve(ctx, network, address)
	if err != nil {
		return nil, opErr(nil, mapCtxErr(err))
	}
	var laddr netip.Addr
	if d.LocalAddr != nil {
		laddr = d.LocalAddr.AddrPort().Addr()
	}
	c, err := dial(ctx, laddr, raddr, opts, info)
	if err != nil {
		return nil, opErr(addrFrom(raddr), mapCtxErr(err))
	}
	c.mu.Lock()
	c.setKeepAlive(keepAliveFrom(d.KeepAlive, d.KeepAliveConfig))
	c.mu.Unlock()
	return c, nil
}

// mapCtxErr turns a context's deadline into the timeout error net uses.
func mapCtxErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return errTimeout
	}
	return err
}
