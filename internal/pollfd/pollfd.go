//go:build unix

// Package pollfd parks goroutines on a foreign file descriptor (a verbs
// completion channel, an rdma_cm event channel) through Go's netpoller, so
// that no OS thread sits blocked in C while a device is idle.
package pollfd

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// FD is a duplicate of a C library's descriptor registered with the
// netpoller. It is a duplicate so that closing it (which is how a parked
// waiter is woken for shutdown) never closes the descriptor the C library
// still owns; both share one open file description, so readiness and the
// O_NONBLOCK flag are shared too.
type FD struct {
	f  *os.File
	rc syscall.RawConn
}

// New makes fd nonblocking and registers a duplicate of it.
func New(fd int, name string) (*FD, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, os.NewSyscallError("fcntl", err)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("fcntl", err)
	}
	f := os.NewFile(uintptr(dup), name)
	if f == nil {
		unix.Close(dup)
		return nil, fmt.Errorf("pollfd: cannot wrap descriptor %d", dup)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &FD{f: f, rc: rc}, nil
}

// Wait calls drain, and while drain reports that it found the descriptor
// empty (returns false), parks until the descriptor is readable and calls it
// again. The netpoller is edge-triggered, so drain must consume everything
// (read to EAGAIN) before it returns false, or a wakeup is lost. Wait
// returns nil once drain returns true, and os.ErrClosed after Close. Callers
// on a hot path pass the same func value every time: a new closure per call
// would allocate.
func (p *FD) Wait(drain func(fd uintptr) bool) error {
	return p.rc.Read(drain)
}

// Drain reads a queue of events behind the descriptor until Close: next
// takes one event off it and returns nil, or EAGAIN (or EINTR) when the
// queue is empty, which parks until the descriptor is readable again; any
// other error of next ends Drain with that error. After Close, Drain
// returns os.ErrClosed.
func (p *FD) Drain(next func() error) error {
	var failed error
	err := p.Wait(func(uintptr) bool {
		for {
			switch err := next(); err {
			case nil:
			case syscall.EAGAIN, syscall.EINTR:
				return false
			default:
				failed = err
				return true
			}
		}
	})
	if failed != nil {
		return failed
	}
	return err
}

// Close wakes a parked Wait (which then returns an error) and releases the
// duplicate descriptor.
func (p *FD) Close() error { return p.f.Close() }
