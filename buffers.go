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

// arena is anonymous mmap'd memory registered with a protection domain of
// its own, laid out by layout: the receive ring, registered for remote
// write (the one region a peer may touch), and the send ring (and any
// header slots), registered for local access only. It is outside the Go heap because the NIC (and
// C) keep its addresses: the cgo rules forbid C from retaining Go
// pointers, and the GC must never move or free it.
//
// The PD is the arena's own, and the connection's QP is created in it,
// because an rkey is honoured for any QP of the region's PD: with one PD
// per device, the peer of one connection could write, through its own
// QP, into the receive ring of another connection whose rkey and address
// it guessed.
type arena struct {
	pd     *ibv.PD
	mem    []byte
	recvMR *ibv.MR // mem[:ring]: local and remote write
	sendMR *ibv.MR // mem[ring:]: local only (the send ring and any header slots)
	base   uint64
	ring   int
}

func newArena(ctx *ibv.Context, lay layout) (*arena, error) {
	pd, err := ctx.AllocPD()
	if err != nil {
		return nil, err
	}
	a := &arena{pd: pd, ring: lay.ring}
	if err := a.register(lay); err != nil {
		a.free()
		return nil, err
	}
	return a, nil
}

// register maps the arena's memory and registers its two rings.
func (a *arena) register(lay layout) error {
	size := lay.size()
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return &mmapError{need: size, err: os.NewSyscallError("mmap", err)}
	}
	a.mem, a.base = mem, addrOf(mem)
	if a.recvMR, err = a.pd.RegMRRemoteWrite(mem[lay.recvOff() : lay.recvOff()+lay.ring]); err == nil {
		// The header slots, if any, follow the send ring: one key for both.
		a.sendMR, err = a.pd.RegMR(mem[lay.sendOff():size])
	}
	if err != nil {
		var lim unix.Rlimit
		if errors.Is(err, syscall.ENOMEM) && unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil && lim.Cur != unix.RLIM_INFINITY {
			return &memlockError{need: size, limit: lim.Cur, err: err}
		}
		return err
	}
	return nil
}

// free deregisters, unmaps and deallocates whatever a has; no QP may
// still be in its PD.
func (a *arena) free() {
	if a.recvMR != nil {
		a.recvMR.Dereg()
	}
	if a.sendMR != nil {
		a.sendMR.Dereg()
	}
	if a.mem != nil {
		unix.Munmap(a.mem)
	}
	a.pd.Dealloc()
}

// verbsRings registers a connection's big rings (see resize.go) in its
// arena's PD, mapped apart from the arena, and counts them in the
// device's registered memory.
type verbsRings struct {
	pd  *ibv.PD
	dev *device
}

func (v verbsRings) allocRing(size int, remote bool) (*ringMem, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	var mr *ibv.MR
	if remote {
		mr, err = v.pd.RegMRRemoteWrite(mem)
	} else {
		mr, err = v.pd.RegMR(mem)
	}
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	v.dev.addRegistered(size)
	return &ringMem{buf: mem, base: addrOf(mem), lkey: mr.LKey, rkey: mr.RKey, reg: mr}, nil
}

func (v verbsRings) freeRing(m *ringMem) {
	m.reg.(*ibv.MR).Dereg()
	unix.Munmap(m.buf)
	v.dev.addRegistered(-len(m.buf))
}

// addrOf is the address the NIC uses for the first byte of b.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// arenaPool keeps the arenas of closed connections for the next ones on
// the same device: mmap'ing, faulting in and registering a connection's
// memory is most of what setting one up costs (about 10 ms for the
// default 2.3 MiB of the rings' predecessors under Soft-RoCE in the test
// bed). A reused arena still holds what its last connection sent and
// received; that is never exposed: no memory grants remote read, the peer
// of the last connection has no QP left in the arena's PD (its rkey is
// honoured for the new connection's QP only), and only the bytes a
// connection itself wrote are ever sent from it.
type arenaPool struct {
	mu    sync.Mutex
	free  []*arena
	bytes int
}

// maxPooled bounds the registered memory a device keeps unused.
const maxPooled = 32 << 20

// get returns an arena laid out as lay, pooled or new. When a new one cannot
// be had (the locked-memory limit, say), the pool lets its arenas go and
// the registration is tried once more.
func (p *arenaPool) get(ctx *ibv.Context, lay layout) (*arena, error) {
	size := lay.size()
	p.mu.Lock()
	for i, a := range p.free {
		if len(a.mem) == size && a.ring == lay.ring {
			last := len(p.free) - 1
			p.free[i], p.free[last] = p.free[last], nil
			p.free = p.free[:last]
			p.bytes -= size
			p.mu.Unlock()
			return a, nil
		}
	}
	p.mu.Unlock()
	a, err := newArena(ctx, lay)
	if err != nil && p.drop() > 0 {
		a, err = newArena(ctx, lay)
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
