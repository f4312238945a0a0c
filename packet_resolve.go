package rdma

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"

	"github.com/goverbs/rdma/internal/rdmacm"
)

// A PacketConn's resolution of a destination, over the connection
// manager's steps: address and route resolution, then rdma_cm's service
// ID resolution of the destination's port, each step's outcome an event
// of the resolution's own id. The address handle it leads to is the
// verbs side's (packet_verbs.go's resolveDest).

// resolver receives the CM events of one resolution's id.
type resolver struct{ ev chan rdmacm.Event }

func (r *resolver) cmEvent(ev rdmacm.Event) {
	select {
	case r.ev <- ev:
	default: // a resolution gets one event per step; more is not its
	}
}

func (r *resolver) cmLost(err error) {
	select {
	case r.ev <- rdmacm.Event{Type: eventLost}:
	default:
	}
}

// resolveUD resolves ap from src on a new id of cm, within timeout or
// until parent ends (then with gone's error: the PacketConn's release
// cut it short), and returns where datagrams to it go. The destination
// must be reached through the device whose context is verbs.
func resolveUD(parent context.Context, cm *cmLoop, src netip.Addr, ap netip.AddrPort, timeout time.Duration, verbs unsafe.Pointer, gone func() error) (*rdmacm.UDParam, error) {
	ctx, cancel := context.WithTimeout(parent, timeout)
	defer cancel()
	r := &resolver{ev: make(chan rdmacm.Event, 4)}
	h := cm.register(r)
	defer cm.unregister(h)
	id, err := cm.ch.newUDPID(h)
	if err != nil {
		return nil, err
	}
	defer retryDestroy(id.Destroy)
	wait := func(want rdmacm.EventType, call string) (rdmacm.Event, error) {
		select {
		case ev := <-r.ev:
			if ev.Type == eventLost {
				return ev, cm.lostErr()
			}
			return ev, resolveStep(ev, want, call)
		case <-ctx.Done():
			if parent.Err() != nil {
				// Cut short by the release: Close's, or the device
				// removal's (whose error the writer gets).
				return rdmacm.Event{}, gone()
			}
			return rdmacm.Event{}, os.NewSyscallError(call, syscall.ETIMEDOUT)
		}
	}
	ms := int(timeout / time.Millisecond)
	if err := id.ResolveAddr(src, ap, ms); err != nil {
		return nil, noDeviceAddr(err)
	}
	if _, err := wait(rdmacm.EventAddrResolved, "rdma_resolve_addr"); err != nil {
		return nil, noDeviceAddr(err)
	}
	if id.Verbs() != verbs {
		return nil, errOtherDevice
	}
	if err := id.ResolveRoute(ms); err != nil {
		return nil, err
	}
	if _, err := wait(rdmacm.EventRouteResolved, "rdma_resolve_route"); err != nil {
		return nil, err
	}
	if err := id.ConnectUD(); err != nil {
		return nil, err
	}
	ev, err := wait(rdmacm.EventEstablished, "rdma_connect")
	if err != nil {
		if sidrNoListener(ev.Type == rdmacm.EventUnreachable, ev.Status) {
			// The address and the route resolved: the host is there,
			// its port is not. UDP sends that datagram and loses it.
			return nil, errNoListener
		}
		return nil, err
	}
	if ev.UD == nil {
		return nil, os.NewSyscallError("rdma_connect", syscall.EPROTO)
	}
	return ev.UD, nil
}

// resolveStep classifies the event that ended a resolution's step, whose
// call was call and whose success is want.
func resolveStep(ev rdmacm.Event, want rdmacm.EventType, call string) error {
	switch ev.Type {
	case want:
		return nil
	case rdmacm.EventRejected:
		return os.NewSyscallError(call, syscall.ECONNREFUSED)
	case rdmacm.EventDeviceRemoval:
		// The resolution's id is on the device too, and may hear of the
		// removal before the PacketConn's own id.
		return &deviceError{os.NewSyscallError(call, syscall.ENODEV)}
	}
	return os.NewSyscallError(call, eventErrno(ev, syscall.EHOSTUNREACH))
}

// errOtherDevice is the resolution's error for a destination that the
// routing table reaches through another device than the PacketConn's.
var errOtherDevice = errors.New("rdma: the destination is reached through another RDMA device than the PacketConn's")
