//go:build !linux || !cgo

package rdma

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
	"unsafe"

	"github.com/goverbs/rdma/internal/ibv"
)

// On this build there is no verbs layer: Dial and Listen fail with an
// error wrapping ErrUnsupported, so no RDMA Conn exists, and the only
// Listener is the TCP-only one that ListenConfig.FallbackTCP makes; the
// methods (declared once for every build, in the files of their concerns)
// otherwise only meet nil or zero values, for which they return errors as
// package net does. This file holds the verbs hooks those methods call.

// verbsSys has no verbs objects here, and its steps do nothing: a Conn
// here is the host tests', over fakes.
type verbsSys struct{}

func (s *connSys) openPath(Options, completer) (dataPath, error) { return dataPath{}, ErrUnsupported }
func (s *connSys) ackTimeout() uint8                             { return 0 }
func (s *connSys) readDepths() (uint8, uint8)                    { return 0, 0 }
func (s *connSys) blockingConnect() bool                         { return false }
func (s *connSys) portDown() bool                                { return false }
func (s *connSys) markIDRemoved()                                {}
func (s *connSys) markDeviceRemoved()                            {}
func (s *connSys) qpKeepable() bool                              { return false }
func (s *connSys) retireQP(bool)                                 {}
func (s *connSys) dropArena()                                    {}
func (s *connSys) waitPortBack(bool)                             {}
func (s *connSys) releaseDevice()                                {}

// newEventChannel finds no connection manager: Dial and Listen fail with
// ErrUnsupported.
func newEventChannel() (eventChannel, error) { return nil, ErrUnsupported }

func markRemoved(unsafe.Pointer)      {}
func addListener(unsafe.Pointer, int) {}

func wcStatusString(status uint32) string { return fmt.Sprintf("status %d", status) }

func asyncEventString(t ibv.AsyncEventType) string { return fmt.Sprintf("event %d", int(t)) }

func devicesStats() []DeviceStats { return nil }

func releaseIdleDevices() {}

var (
	deviceLinger time.Duration
	devMu        sync.Mutex
)

// packetSys has only what tests over a fake fabric use: resolveFake,
// which resolves a destination in place of rdma_cm (see packet_verbs.go).
type packetSys struct {
	resolveFake func(netip.AddrPort) (udDest, error)
}

func listenPacket(netip.AddrPort, PacketOptions, netip.Addr, *observer) (*PacketConn, error) {
	return nil, ErrUnsupported
}
func (c *PacketConn) releaseAsync()                           {}
func multicastLocal(*net.Interface, bool) (netip.Addr, error) { return netip.Addr{}, ErrUnsupported }

// startResolve resolves through resolveFake, at once, if a test set it:
// without RDMA there is nothing else to resolve with.
func (c *PacketConn) startResolve(ap netip.AddrPort, ref *peerRef[udDest], refresh bool) {
	d, err := udDest{}, error(ErrUnsupported)
	if c.resolveFake != nil {
		d, err = c.resolveFake(ap)
	}
	c.resolutionDone(ref, refresh, d, err)
}

// release lets the reassembly go, as the verbs side's does: its timer
// stops (a PacketConn here is the tests' over a fake QP).
func (c *PacketConn) release() {
	c.rmu.Lock()
	if c.reasm != nil {
		c.reasm.reset()
	}
	c.rmu.Unlock()
}

type regionSys struct{}

func (c *Conn) registerMem(int, Access, []byte) (*Region, error) { return nil, ErrUnsupported }
func (c *Conn) deregRegion(*Region) error                        { return nil }
func unmapMem([]byte)                                            {}
