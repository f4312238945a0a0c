//go:build linux && cgo

package rdma

import (
	"errors"
	"os"
	"sync"
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

// arenaPool keeps the arenas of closed connections for the next ones on
// the same device: mmap'ing, faulting in and registering a connection's
// memory is most of what setting one up costs (about 10 ms for the
// default 2.3 MiB under Soft-RoCE in the test bed). A reused arena still
// holds what its last connection sent and received; that is never exposed:
// the memory grants no remote access, receives overwrite it, and only the
// bytes a connection itself wrote are ever sent from it.
type arenaPool struct {
	mu    sync.Mutex
	free  []*arena
	bytes int
}

// maxPooled bounds the registered memory a device keeps unused.
const maxPooled = 32 << 20

// get returns an arena of size bytes, pooled or new. When a new one cannot
// be had (the locked-memory limit, say), the pool lets its arenas go and
// the registration is tried once more.
func (p *arenaPool) get(pd *ibv.PD, size int) (*arena, error) {
	p.mu.Lock()
	for i, a := range p.free {
		if len(a.mem) == size {
			last := len(p.free) - 1
			p.free[i], p.free[last] = p.free[last], nil
			p.free = p.free[:last]
			p.bytes -= size
			p.mu.Unlock()
			return a, nil
		}
	}
	p.mu.Unlock()
	a, err := newArena(pd, size)
	if err != nil && p.drop() > 0 {
		a, err = newArena(pd, size)
	}
	return a, err
}

// put keeps a for the next connection, or frees it if the pool is full.
// No QP may reference it any more.
func (p *arenaPool) put(a *arena) {
	p.mu.Lock()
	if p.bytes+len(a.mem) <= maxPooled {
		p.free = append(p.free, a)
		p.bytes += len(a.mem)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	a.free()
}

// drop frees every pooled arena and returns how many there were.
func (p *arenaPool) drop() int {
	p.mu.Lock()
	free := p.free
	p.free, p.bytes = nil, 0
	p.mu.Unlock()
	for _, a := range free {
		a.free()
	}
	return len(free)
}

func (p *arenaPool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}
