package rdma

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
)

// Opt-in TCP fallback (Dialer.FallbackTCP, ListenConfig.FallbackTCP): a
// service written against this package runs where there is no RDMA (a
// laptop, a CI runner) and between a host with RDMA and one without,
// over Go's TCP on the same address and port number. It is never silent:
// the connection is a *net.TCPConn (IsRDMA says so), and a listener counts
// its TCP connections apart.

// fallsBackToTCP reports whether a failed RDMA dial may be retried over
// TCP: RDMA cannot carry this connection (no device serves the route, none
// on this host, a build without RDMA), the peer has no RDMA listener on
// the port (rdma_cm itself, not a listener, rejected the request), or the
// peer's host never answered rdma_cm (a host without RDMA looks like
// that). A listener's refusal (backlog, resources, shutting down), a
// foreign RDMA server, an expired deadline or a cancelled context are
// answers from an RDMA service or from the caller: they never fall back.
func fallsBackToTCP(err error) bool {
	var re *RefusedError
	switch {
	case errors.Is(err, ErrNoDevice), errors.Is(err, ErrUnsupported):
		return true
	case errors.As(err, &re):
		return re.Reason == RefusedNoListener
	}
	var nr *noRDMAPeerError
	return errors.As(err, &nr)
}

// noRDMAPeerError is a dial whose peer never answered rdma_cm (the CM's
// unreachable event): its host has no RDMA, or is down.
type noRDMAPeerError struct{ err error }

func (e *noRDMAPeerError) Error() string {
	return "the peer does not answer RDMA connection requests: " + e.err.Error()
}
func (e *noRDMAPeerError) Unwrap() error { return e.err }

// fallbackError is a dial that failed over RDMA and then over TCP: both
// reasons are kept.
type fallbackError struct{ rdma, tcp error }

func (e *fallbackError) Error() string {
	return e.rdma.Error() + "; over TCP instead: " + e.tcp.Error()
}

func (e *fallbackError) Unwrap() []error { return []error{e.rdma, e.tcp} }

// tcpNetwork is the TCP network of an rdma network name.
func tcpNetwork(network string) string {
	switch network {
	case "rdma4":
		return "tcp4"
	case "rdma6":
		return "tcp6"
	}
	return "tcp"
}

// dialTCP is the fallback of a failed RDMA dial (rdmaErr, a *net.OpError).
func (d *Dialer) dialTCP(ctx context.Context, network, address string, rdmaErr error) (net.Conn, error) {
	nd := net.Dialer{Timeout: d.Timeout, KeepAlive: d.KeepAlive, KeepAliveConfig: d.KeepAliveConfig}
	if d.LocalAddr != nil {
		nd.LocalAddr = &net.TCPAddr{IP: d.LocalAddr.IP, Zone: d.LocalAddr.Zone}
	}
	c, err := nd.DialContext(ctx, tcpNetwork(network), address)
	if err != nil {
		var oe *net.OpError
		if errors.As(rdmaErr, &oe) {
			return nil, &net.OpError{Op: "dial", Net: "rdma", Source: oe.Source, Addr: oe.Addr, Err: &fallbackError{oe.Err, err}}
		}
		return nil, err
	}
	return c, nil
}

// IsRDMA reports whether c is a connection of this package over RDMA, as
// opposed to the TCP connection a fallback gave (or any other net.Conn).
func IsRDMA(c net.Conn) bool {
	rc, ok := c.(*Conn)
	return ok && rc.ok()
}

// listenFallback is ListenConfig.listen with FallbackTCP: the RDMA
// listener and a TCP listener on the same address and port number, or the
// TCP listener alone where no RDMA device serves the address.
func (lc *ListenConfig) listenFallback(ctx context.Context, network string, ap netip.AddrPort, rdmaListen func(netip.AddrPort) (*Listener, error), obs *observer) (*Listener, error) {
	var lnc net.ListenConfig
	lnc.KeepAlive, lnc.KeepAliveConfig = lc.KeepAlive, lc.KeepAliveConfig
	for try := 0; ; try++ {
		l, err := rdmaListen(ap)
		if err != nil {
			if !errors.Is(err, ErrNoDevice) && !errors.Is(err, ErrUnsupported) {
				return nil, err
			}
			// No RDMA here: TCP alone.
			tl, terr := lnc.Listen(ctx, tcpNetwork(network), ap.String())
			if terr != nil {
				return nil, terr
			}
			l = newTCPOnlyListener()
			l.obs = obs
			l.startTCP(tl)
			obs.fallback(FallbackInfo{Op: "listen", Network: "tcp", Address: tl.Addr().String(), Reason: err})
			return l, nil
		}
		// The port rdma_cm chose (or the one asked for), for TCP too.
		// rdma_cm's ports are not TCP's: the number may be taken there;
		// with port 0 another is tried.
		port := l.addr.Port
		tl, terr := lnc.Listen(ctx, tcpNetwork(network), netip.AddrPortFrom(ap.Addr(), uint16(port)).String())
		if terr != nil {
			l.close()
			if ap.Port() == 0 && errors.Is(terr, syscall.EADDRINUSE) && try < 10 {
				continue
			}
			return nil, terr
		}
		l.startTCP(tl)
		return l, nil
	}
}

// newTCPOnlyListener is a Listener without an RDMA side.
func newTCPOnlyListener() *Listener {
	return &Listener{closing: make(chan struct{}), gone: make(chan struct{}), tcpOnly: true}
}

// startTCP adds the TCP side: a goroutine accepts its connections for
// Accept, until the listener closes.
func (l *Listener) startTCP(tl net.Listener) {
	l.tcp = tl
	l.tcpQueue = make(chan net.Conn)
	l.tcpDone = make(chan struct{})
	l.tcpFailed = make(chan struct{})
	go func() {
		defer close(l.tcpDone)
		for {
			c, err := tl.Accept()
			if err != nil {
				select {
				case <-l.closing:
					return
				default:
				}
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				// The TCP side failed for good: Accept reports it
				// from now on, as a net.Listener's would.
				l.tcpErr = err
				close(l.tcpFailed)
				return
			}
			// Counted first, as an RDMA connection is (see established):
			// once handed over, the connection may be accepted and used,
			// and its dialer may look at the listener's Stats.
			l.count(func(s *ListenerStats) { s.AcceptedTCP++ })
			select {
			case l.tcpQueue <- c:
			case <-l.closing:
				l.count(func(s *ListenerStats) { s.AcceptedTCP-- })
				c.Close()
				return
			}
		}
	}()
}

// closeTCPOnly closes a listener without an RDMA side.
func (l *Listener) closeTCPOnly() error {
	l.tcpMu.Lock()
	defer l.tcpMu.Unlock()
	if l.tcpClosed {
		return net.ErrClosed
	}
	l.tcpClosed = true
	close(l.closing)
	return nil
}

// closeTCP stops the TCP side, if any, and waits for its goroutine.
func (l *Listener) closeTCP() {
	if l.tcp == nil {
		return
	}
	l.tcp.Close()
	<-l.tcpDone
}
