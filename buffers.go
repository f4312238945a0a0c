//go:build linux && cgo

package rdma

import (
	"errors"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/rdma/internal/ibv"
)

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
		return nil, &mmapError{need: size, err: os.NewSyscallError("mmap", err)}
	}
	mr, err := pd.RegMR(mem)
	if err != nil {
		unix.Munmap(mem)
		var lim unix.Rlimit
		if errors.Is(err, syscall.ENOMEM) && unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil && lim.Cur != unix.RLIM_INFINITY {
			return nil, &memlockError{need: size, limit: lim.Cur, err: err}
		}
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
