package rdma

import (
	"errors"
	"net"
	"syscall"

	"github.com/goverbs/rdma/internal/wire"
)

// Refusals that say why. A listener that cannot take a connection rejects
// the request with a reason in the reject's private data (a byte of the
// reject's encoding: wire.MarshalReject), so that the dialer's error
// tells what happened on the server instead of a bare "connection
// refused", and the listener counts it (ListenerStats) and reports it
// (ListenConfig.Refused).

// RefuseReason is why a listener refused a connection request.
type RefuseReason uint8

// Reasons a listener refuses a connection request.
const (
	RefusedUnknown      RefuseReason = iota // the server gave no reason (not this package, or an older version)
	RefusedLockedMemory                     // registering the connection's rings exceeded the server's locked-memory limit
	RefusedResources                        // the server ran out of another resource (memory, QPs, completion queue entries)
	RefusedBacklog                          // the backlog is full of established connections nobody accepted yet
	RefusedShutdown                         // the listener is closing
	RefusedProtocol                         // the dialer does not speak this package's protocol, or another version of it
	// RefusedNoListener: no RDMA listener on that port (rdma_cm itself
	// rejected the request; a listener never says this).
	RefusedNoListener
	// RefusedBusy: the listener has as many handshakes in progress as it
	// keeps, none of them stale yet; a Dial tries again after a pause
	// (see Dialer), as TCP sends its SYN again to a listener too busy to
	// answer it.
	RefusedBusy

	// NumRefuseReasons is the number of reasons above, and the length of
	// ListenerStats.Refused: "for r := range NumRefuseReasons" visits
	// every reason.
	NumRefuseReasons
)

// String says what the reason means, as a dialer's error reports it.
func (r RefuseReason) String() string {
	switch r {
	case RefusedLockedMemory:
		return "the server is out of locked memory (its RLIMIT_MEMLOCK: ulimit -l / LimitMEMLOCK)"
	case RefusedResources:
		return "the server is out of resources"
	case RefusedBacklog:
		return "the server's backlog is full"
	case RefusedShutdown:
		return "the server is shutting down"
	case RefusedProtocol:
		return "the server does not speak this dialer's protocol version"
	case RefusedNoListener:
		return "no RDMA listener on that port"
	case RefusedBusy:
		return "the server has too many handshakes in progress"
	}
	return "no reason given"
}

// errno is what a refusal of this reason wraps besides ECONNREFUSED, for
// errors.Is.
func (r RefuseReason) errno() error {
	switch r {
	case RefusedLockedMemory, RefusedResources:
		return syscall.ENOMEM
	case RefusedBacklog, RefusedBusy:
		return syscall.EAGAIN
	case RefusedShutdown:
		return syscall.ESHUTDOWN
	case RefusedProtocol:
		return ErrProtocol
	}
	return nil
}

// marshalReject is the reject's private data (wire.MarshalReject) for r.
func marshalReject(r RefuseReason) []byte { return wire.MarshalReject(uint8(r)) }

// parseReject reads the reason out of a reject's private data; anything
// else (a foreign server, padding only, a reason this version does not
// know) is RefusedUnknown.
func parseReject(b []byte) RefuseReason {
	if r, ok := wire.ParseReject(b); ok && RefuseReason(r) < NumRefuseReasons {
		return RefuseReason(r)
	}
	return RefusedUnknown
}

// RefusedError is the error a Dial returns (inside *net.OpError) when the
// listener refused the connection. It wraps syscall.ECONNREFUSED, and
// besides, by reason: syscall.ENOMEM (locked memory, resources),
// syscall.EAGAIN (backlog, busy), syscall.ESHUTDOWN (shutting down), ErrProtocol
// (protocol version).
type RefusedError struct {
	Reason RefuseReason // why, as the listener said (RefusedUnknown if it did not)
}

// Error returns "connection refused", and the reason if there is one.
func (e *RefusedError) Error() string {
	if e.Reason == RefusedUnknown {
		return "connection refused"
	}
	return "connection refused: " + e.Reason.String()
}

// Unwrap returns ECONNREFUSED and the reason's own error.
func (e *RefusedError) Unwrap() []error {
	if err := e.Reason.errno(); err != nil {
		return []error{syscall.ECONNREFUSED, err}
	}
	return []error{syscall.ECONNREFUSED}
}

// refuseReasonOf classifies why setting up an accepted connection failed.
func refuseReasonOf(err error) RefuseReason {
	var me *memlockError
	var pe *protocolError
	switch {
	case errors.As(err, &me):
		return RefusedLockedMemory
	case errors.As(err, &pe):
		return RefusedProtocol
	case errors.Is(err, net.ErrClosed):
		return RefusedShutdown
	}
	return RefusedResources
}

// refusedCause is what the Refused hook gets when the listener's own setup
// failed: the reason the dialer was told, and the error that says what to
// do about it on this side.
type refusedCause struct {
	RefusedError
	cause error
}

func (e *refusedCause) Error() string { return e.RefusedError.Error() + ": " + e.cause.Error() }

func (e *refusedCause) Unwrap() []error { return append(e.RefusedError.Unwrap(), e.cause) }

// handshakeAbortedError is a Dial's error when the server answered the
// request and then dropped the connection before the handshake completed.
// how says what told the dialer so: the connection manager's event, or
// the call's own error on iWARP.
type handshakeAbortedError struct{ how string }

func (e handshakeAbortedError) Error() string {
	s := "the server ended the handshake before it completed (its listener closed, or it dropped the connection)"
	if e.how != "" {
		s += ": " + e.how
	}
	return s
}
func (handshakeAbortedError) Unwrap() error { return syscall.ECONNABORTED }
