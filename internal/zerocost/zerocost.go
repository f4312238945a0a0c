//go:build linux && cgo

package zerocost

/*
#cgo CFLAGS: -O2 -Wall
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "zc.h"

static void zc_noop(void) {}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/pollfd"
)

// Available reports whether this build has the provider.
const Available = true

// Noop calls a C function that does nothing: the fixed cost of one cgo
// call, which every verb the library makes pays on top of the C side's.
func Noop() { C.zc_noop() }

// Wire is two joined ends, each with a QP and a CQ.
type Wire struct {
	w    *C.struct_zc_wire
	ends [2]End
}

// New joins two QPs, each with a send queue of sendQueue work requests, a
// receive queue of recvQueue and a CQ of cqe entries, or, if shared, both
// on end 0's CQ, as the connections of a process share their device's.
func New(sendQueue, recvQueue, cqe int, shared bool) (*Wire, error) {
	sh := C.int(0)
	if shared {
		sh = 1
	}
	w, err := C.zc_open(C.int(sendQueue), C.int(recvQueue), C.int(cqe), sh)
	if w == nil {
		return nil, fmt.Errorf("zerocost: %w", err)
	}
	zw := &Wire{w: w}
	for i := range zw.ends {
		qp := ibv.QPFrom(unsafe.Pointer(C.zc_qp(w, C.int(i))))
		zw.ends[i] = End{QP: qp, QPNum: qp.Num, CQ: ibv.CQFrom(unsafe.Pointer(C.zc_cq(w, C.int(i))))}
	}
	return zw, nil
}

// End returns end i (0 or 1).
func (w *Wire) End(i int) End { return w.ends[i] }

// Alloc allocates size bytes (rounded up to whole pages) outside Go's
// heap: the provider keeps addresses of posted receives.
func Alloc(size int) ([]byte, error) {
	n := (size + 4095) &^ 4095
	p := C.aligned_alloc(4096, C.size_t(n))
	if p == nil {
		return nil, fmt.Errorf("zerocost: %w", syscall.ENOMEM)
	}
	C.memset(p, 0, C.size_t(n))
	return unsafe.Slice((*byte)(p), size), nil
}

// Free frees memory of Alloc.
func Free(buf []byte) { C.free(unsafe.Pointer(unsafe.SliceData(buf))) }

// Register registers buf for an end, writable locally and open to the
// peer as a says; the key is both its lkey and its rkey.
func (w *Wire) Register(end int, buf []byte, a Access) (uint32, error) {
	access := C.int(C.IBV_ACCESS_LOCAL_WRITE)
	if a&RemoteRead != 0 {
		access |= C.IBV_ACCESS_REMOTE_READ
	}
	if a&RemoteWrite != 0 {
		access |= C.IBV_ACCESS_REMOTE_WRITE
	}
	if a&RemoteAtomic != 0 {
		access |= C.IBV_ACCESS_REMOTE_ATOMIC
	}
	key := C.zc_reg(w.w, C.int(end), unsafe.Pointer(unsafe.SliceData(buf)), C.size_t(len(buf)), access)
	if key == 0 {
		return 0, errors.New("zerocost: too many registered regions")
	}
	return uint32(key), nil
}

// Deregister removes a registration of an end.
func (w *Wire) Deregister(end int, key uint32) { C.zc_dereg(w.w, C.int(end), C.uint32_t(key)) }

// Stats returns an end's counts of calls so far.
func (w *Wire) Stats(end int) Stats {
	var s C.struct_zc_stats
	C.zc_stats(w.w, C.int(end), &s)
	return Stats{uint64(s.post_send), uint64(s.send_wrs), uint64(s.post_recv), uint64(s.recv_wrs),
		uint64(s.polls), uint64(s.empty_polls), uint64(s.cqes), uint64(s.arms)}
}

// Err is the first work request the provider refused (one no real device
// would have carried out), or nil.
func (w *Wire) Err() error {
	if e := C.zc_error(w.w); e != nil {
		return errors.New("zerocost: " + C.GoString(e))
	}
	return nil
}

// Events is an end's CQ's completion events, as the library's poller
// parks on a completion channel: ibv_req_notify_cq arms the CQ, and its
// next completion makes Wait return. The provider writes an eventfd, so a
// wakeup costs the two system calls and the netpoller's handoff that a
// device's completion event costs, without the device's interrupt.
type Events struct {
	fd    *pollfd.FD
	drain func(uintptr) bool
	err   error
}

// Events returns end's completion events; Close them before the wire.
func (w *Wire) Events(end int) (*Events, error) {
	efd := int(C.zc_event_fd(w.w, C.int(end)))
	if efd < 0 {
		return nil, errors.New("zerocost: no event fd")
	}
	fd, err := pollfd.New(efd, "zerocost")
	if err != nil {
		return nil, err
	}
	e := &Events{fd: fd}
	e.drain = func(fd uintptr) bool {
		var buf [8]byte
		got := false
		for {
			_, err := syscall.Read(int(fd), buf[:])
			switch err {
			case nil:
				got = true
				continue
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return got
			}
			e.err = err
			return true
		}
	}
	return e, nil
}

// Wait parks until a completion of the armed CQ.
func (e *Events) Wait() error {
	if err := e.fd.Wait(e.drain); err != nil {
		return err
	}
	if err := e.err; err != nil {
		e.err = nil
		return os.NewSyscallError("read", err)
	}
	return nil
}

// Close makes a parked Wait return an error.
func (e *Events) Close() error { return e.fd.Close() }

// Close frees the wire; nothing may use its ends any more.
func (w *Wire) Close() { C.zc_close(w.w) }

// RunC runs the C benchmark of pattern p for n messages of size bytes on
// this wire, whose ends nothing else uses: one cgo call, so the time it
// takes is C's own.
func (w *Wire) RunC(p Pattern, n, size int) error {
	var r C.int
	switch p {
	case PingPong:
		r = C.zc_bench_pingpong(w.w, C.long(n), C.int(size))
	case Rate:
		r = C.zc_bench_rate(w.w, C.long(n), C.int(size))
	case Stream:
		r = C.zc_bench_stream(w.w, C.long(n), C.int(size))
	case Read:
		r = C.zc_bench_read(w.w, C.long(n), C.int(size))
	default:
		return fmt.Errorf("zerocost: unknown pattern %d", p)
	}
	if r != 0 {
		if err := w.Err(); err != nil {
			return err
		}
		return errors.New("zerocost: the C benchmark failed")
	}
	return nil
}
