package rdma

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ListenConfig holds options for listening, like net.ListenConfig.
type ListenConfig struct {
	// Backlog is the most connections that may be in their handshake or
	// established and waiting for Accept (and the rdma_listen backlog);
	// requests beyond it are refused: as RefusedBacklog when Accept has
	// fallen behind, as RefusedBusy (which the dialer tries again) while
	// handshakes in progress hold the room. Default: the system's limit for a
	// TCP listener's backlog (net.core.somaxconn), as net.Listen takes
	// it, so that a burst of dials a TCP listener would take is not
	// refused.
	Backlog int
	// KeepAlive and KeepAliveConfig configure the keepalive probes of
	// accepted connections, as the Dialer's fields of those names do.
	KeepAlive       time.Duration
	KeepAliveConfig net.KeepAliveConfig
	// Refused, if not nil, is called for every connection request the
	// listener refuses (a dialer refused as RefusedBusy tries again, and
	// each try is refused, counted and reported anew), with the dialer's
	// address and a *net.OpError
	// (Op "accept") whose chain holds a *RefusedError (the reason the
	// dialer was told) and, when the listener's own setup failed, the
	// error that says what to do (the locked-memory limit to raise, say).
	// It runs on a goroutine of the listener's, one call after another,
	// when the refusal is decided on arrival (backlog full, too many
	// handshakes in progress, another protocol), so a call that blocks holds up that listener's later
	// refusals and not the process's other connections (but for a flood:
	// past 256 refusals waiting, the goroutine that answers every
	// connection request of the process makes them), and on the goroutine
	// that set the connection up when its setup failed (out of locked
	// memory, say): it may be called from several goroutines at once,
	// must be safe for that, return quickly (log, count) and not call the
	// listener. Listener.Stats counts the refusals either way. Both
	// happen before the reject is sent, so a dialer that has been refused
	// finds its refusal counted.
	Refused func(remote net.Addr, err error)
	// FallbackTCP, if set, makes the listener accept TCP connections too,
	// on the same address and port number (from dialers on hosts without
	// RDMA, or whose FallbackTCP found no RDMA route), and makes Listen
	// succeed over TCP alone where no RDMA device serves the address (or
	// the build has no RDMA). Accept returns a *net.TCPConn for those;
	// IsRDMA tells them apart, and Listener.Stats counts them
	// (AcceptedTCP).
	FallbackTCP bool
	// Tracer, if not nil, is called for the listener's events (its
	// refusals, a fallback, its device's removal) and its connections'
	// (see Tracer), and for a PacketConn's that ListenPacket opens.
	Tracer *Tracer
	// Logger, if not nil, logs the rare events of the listener, its
	// connections or the PacketConn (a fallback, a keepalive that gave
	// up, a device's removal, a peer that broke the protocol; refusals
	// at Debug level; never one per message); nil logs nothing.
	Logger *slog.Logger
	// FallbackUDP, if set, makes ListenPacket open a kernel UDP socket on
	// the address where RDMA cannot serve it: no RDMA device serves the
	// address, the device's transport has no datagrams (iWARP), or the
	// build has no RDMA. PacketConn.IsUDP tells.
	FallbackUDP bool
	// Packet configures the PacketConns of ListenPacket.
	Packet PacketOptions
	Options
}

// Listen announces on the local address: "host:port" with an address of an
// RDMA-capable interface, or an empty host for all of them. Port 0 picks a
// free port; Listener.Addr reports it.
func Listen(network, address string) (*Listener, error) {
	var lc ListenConfig
	return lc.listen(context.Background(), network, address)
}

// Listen announces on the local address; see the package-level Listen.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	l, err := lc.listen(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (lc *ListenConfig) listen(ctx context.Context, network, address string) (*Listener, error) {
	opErr := func(addr net.Addr, err error) error {
		return &net.OpError{Op: "listen", Net: "rdma", Addr: addr, Err: err}
	}
	opts, err := lc.Options.normalized()
	if err != nil {
		return nil, opErr(nil, err)
	}
	backlog := lc.Backlog
	if backlog <= 0 {
		backlog = defaultBacklog()
	}
	ap, err := resolve(ctx, network, address)
	if err != nil {
		return nil, opErr(nil, err)
	}
	var l *Listener
	obs := newObserver(lc.Tracer, lc.Logger)
	if lc.FallbackTCP {
		l, err = lc.listenFallback(ctx, network, ap, func(ap netip.AddrPort) (*Listener, error) {
			return listen(ap, backlog, opts, lc.Refused, obs)
		}, obs)
	} else {
		l, err = listen(ap, backlog, opts, lc.Refused, obs)
	}
	if err != nil {
		return nil, opErr(addrFrom(ap), err)
	}
	l.keepAlive = keepAliveFrom(lc.KeepAlive, lc.KeepAliveConfig)
	return l, nil
}

// defaultBacklog is ListenConfig.Backlog's default: net.core.somaxconn, as
// net reads it for its listeners (at most 65535), or 128, the kernel's old
// default, where it cannot be read.
var defaultBacklog = sync.OnceValue(func() int {
	return parseSomaxconn(os.ReadFile("/proc/sys/net/core/somaxconn"))
})

// parseSomaxconn is defaultBacklog's reading of the file's content.
func parseSomaxconn(b []byte, err error) int {
	if err != nil {
		return 128
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		return 128
	}
	return min(n, 1<<16-1)
}
