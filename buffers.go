//go:build linux && cgo

package rdma

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/rdma/internal/ibv"
)

// layout places a connection's buffers in one registered arena:
//
//	[ receive buffers: recvSlots × bufSize ]
//	[ send buffers:    sendSlots × bufSize ]
//	[ control sends:   ctrlSlots × ctrlSize ]
//
// Every receive buffer is full size because RC consumes receives in posted
// order whatever the message, so any posted receive may get a data message.
type layout struct {
	bufSize   int
	recvSlots int
	sendSlots int
	ctrlSlots int
}

// ctrlSize is the size of a control send buffer: a header, kept on its own
// cache line.
const ctrlSize = 64

func newLayout(o Options) layout {
	return layout{
		bufSize:   o.BufferSize + hdrLen, // a Write of BufferSize bytes is one message
		recvSlots: o.RecvDepth + ctrlDepth + finSlots,
		sendSlots: o.SendDepth,
		ctrlSlots: ctrlDepth + finSlots,
	}
}

func (l layout) recvOff(i int) int { return i * l.bufSize }
func (l layout) sendOff(i int) int { return (l.recvSlots + i) * l.bufSize }
func (l layout) ctrlOff(i int) int { return (l.recvSlots+l.sendSlots)*l.bufSize + i*ctrlSize }

// size is the arena size, rounded up to whole pages.
func (l layout) size() int {
	n := (l.recvSlots+l.sendSlots)*l.bufSize + l.ctrlSlots*ctrlSize
	const page = 4096
	return (n + page - 1) &^ (page - 1)
}

// arena is anonymous mmap'd memory registered with a PD. It is outside the
// Go heap because the NIC (and C) keep its addresses: the cgo rules forbid C
// from retaining Go pointers, and the GC must never move or free it.
type arena struct {
	mem  []byte
	mr   *ibv.MR
	base uint64
}

func newArena(pd *ibv.PD, size int) (*arena, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	mr, err := pd.RegMR(mem)
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	return &arena{mem: mem, mr: mr, base: addrOf(mem)}, nil
}

// free deregisters and unmaps; no QP may still reference the memory.
func (a *arena) free() {
	a.mr.Dereg()
	unix.Munmap(a.mem)
}

// addrOf is the address the NIC uses for the first byte of b.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }
