package rdma

import (
	"errors"
	"os"
	"syscall"
)

// ErrNoDevice is wrapped by the error Dial and Listen return when no RDMA
// device serves the address (127.0.0.1, say, or an interface without RDMA),
// and when librdmacm finds no RDMA device on the host at all; and by the
// errors of Accept, Read, Write and a Dial in progress once their device
// has gone away (removed, or failed fatally): the library then releases
// what it held of the device without waiting for Close.
var ErrNoDevice = errors.New("rdma: no RDMA device serves this address")

// ErrProtocol is wrapped by the error Dial returns when the listener at the
// address is not an rdma (this package's) listener, e.g. a perftest server,
// and by Read and Write errors once the peer broke the protocol (a message
// of an unknown type, more messages or credits than granted). A listener
// of this package refuses a dialer of another protocol version (the
// dialer's error, a *RefusedError, wraps syscall.ECONNREFUSED and
// ErrProtocol).
var ErrProtocol = errors.New("rdma: peer does not speak this package's protocol")

// ErrUnsupported is wrapped by the error of every Dial and Listen with valid
// options and address on builds without cgo or off Linux.
var ErrUnsupported = errors.New("rdma: not supported on this build (needs linux and cgo)")

// ErrRemoteAccess is wrapped by the error of a one-sided read or write the
// peer's region does not allow: refused before posting when the key lacks
// the access, or by the peer's NIC when the region was revoked (closed),
// never registered on this connection, or does not allow it. A refusal by
// the NIC also breaks the connection (RC queue pairs go to the error state
// on either side): the error then wraps syscall.ECONNRESET as well, and
// every later call on either end of the connection fails.
var ErrRemoteAccess = errors.New("rdma: the peer's region does not allow this access")

// ErrOutOfBounds is wrapped by the error of a one-sided operation whose
// offset and length fall outside the local region or the peer's (as its
// key says), checked before anything is posted.
var ErrOutOfBounds = errors.New("rdma: offset and length outside the region")

// deviceError says no device serves an address while keeping the verb's
// own error reachable through errors.As.
type deviceError struct{ err error }

func (e *deviceError) Error() string   { return ErrNoDevice.Error() + " (" + e.err.Error() + ")" }
func (e *deviceError) Unwrap() []error { return []error{ErrNoDevice, e.err} }

// hostDeviceError is the error of a call that looks for the host's RDMA
// devices (opening the connection manager's event channel): ErrNoDevice
// when it failed with ENODEV, librdmacm having found none, and the call's
// own error (an *os.SyscallError naming it) for anything else. ENOMEM or
// EIO says nothing about the devices, and ErrNoDevice would send a Dialer
// with FallbackTCP to TCP over a transient failure.
func hostDeviceError(err error) error {
	if errors.Is(err, syscall.ENODEV) {
		return &deviceError{err}
	}
	return err
}

// noDeviceLeft reports whether a rescan of the host's devices (n found,
// or err) says that none is left: none found, or ENODEV. Any other
// failure says nothing about the devices.
func noDeviceLeft(n int, err error) bool {
	if err != nil {
		return errors.Is(err, syscall.ENODEV)
	}
	return n == 0
}

// protocolError says what was wrong with the peer's handshake.
type protocolError struct{ detail string }

func (e *protocolError) Error() string { return ErrProtocol.Error() + ": " + e.detail }
func (e *protocolError) Unwrap() error { return ErrProtocol }

// errTimeout is the error of every deadline or timeout, as in package net.
var errTimeout = os.ErrDeadlineExceeded
