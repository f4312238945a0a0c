//go:build !linux || !cgo

package rdma

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// Conn is an RDMA connection; on this build every operation fails with an
// error wrapping ErrUnsupported.
type Conn struct{}

// Listener is an RDMA listener; on this build it cannot be created.
type Listener struct{}

func dial(context.Context, netip.Addr, netip.AddrPort, Options) (*Conn, error) {
	return nil, ErrUnsupported
}

func listen(netip.AddrPort, int, Options) (*Listener, error) { return nil, ErrUnsupported }

func unsupported(op string) error {
	return &net.OpError{Op: op, Net: "rdma", Err: ErrUnsupported}
}

// Read fails: RDMA needs linux and cgo.
func (c *Conn) Read([]byte) (int, error) { return 0, unsupported("read") }

// Write fails: RDMA needs linux and cgo.
func (c *Conn) Write([]byte) (int, error) { return 0, unsupported("write") }

// Close fails: RDMA needs linux and cgo.
func (c *Conn) Close() error { return unsupported("close") }

// CloseWrite fails: RDMA needs linux and cgo.
func (c *Conn) CloseWrite() error { return unsupported("close") }

// CloseRead fails: RDMA needs linux and cgo.
func (c *Conn) CloseRead() error { return unsupported("close") }

// LocalAddr returns nil.
func (c *Conn) LocalAddr() net.Addr { return nil }

// RemoteAddr returns nil.
func (c *Conn) RemoteAddr() net.Addr { return nil }

// SetDeadline fails: RDMA needs linux and cgo.
func (c *Conn) SetDeadline(time.Time) error { return unsupported("set") }

// SetReadDeadline fails: RDMA needs linux and cgo.
func (c *Conn) SetReadDeadline(time.Time) error { return unsupported("set") }

// SetWriteDeadline fails: RDMA needs linux and cgo.
func (c *Conn) SetWriteDeadline(time.Time) error { return unsupported("set") }

// Accept fails: RDMA needs linux and cgo.
func (l *Listener) Accept() (net.Conn, error) { return nil, unsupported("accept") }

// Close fails: RDMA needs linux and cgo.
func (l *Listener) Close() error { return unsupported("close") }

// Addr returns nil.
func (l *Listener) Addr() net.Addr { return nil }
