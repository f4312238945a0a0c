//go:build linux && cgo

package rdma

import (
	"errors"
	"os"
	"sync/atomic"
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
	recv   []byte  // the receive ring, in mem
	recvMR *ibv.MR // recv's: local and remote write
	sendMR *ibv.MR // mem[ring:]: local only (the send ring and any header slots)
	base   uint64
	ring   int
	key    poolKey // the layout it was made for, and its QP's queues

	// While pooled: the QP of its last connection, reset, in its PD and
	// on the device's CQ qpShard; inline is the inline data the QP took
	// when created. Nil while a connection holds the QP (the id does),
	// and for an arena whose QP could not be kept.
	qp      *ibv.QP
	qpShard *cqShard
	inline  int

	// stuck counts the registrations in its PD that could not be undone
	// (retryDestroy gave up): a region's, a big ring's, or its own. Such
	// a registration outlives the connection, and the peer of the next
	// QP in the PD could use its key; so the arena serves no other
	// connection (reusable), and its PD, which cannot be deallocated
	// while anything is registered in it, is left with it.
	stuck atomic.Int32
	// stale: the receive ring's registration could not be replaced
	// (rekey): a past peer's key still works on it.
	stale bool
}

// arenaKey is what an arena laid out as lay is kept for.
func arenaKey(lay layout) poolKey {
	return poolKey{size: lay.size(), ring: lay.ring, sendWR: lay.sendQueue(), recvWR: lay.recvSlots}
}

func newArena(ctx *ibv.Context, lay layout) (*arena, error) {
	pd, err := ctx.AllocPD()
	if err != nil {
		return nil, err
	}
	a := &arena{pd: pd, ring: lay.ring, key: arenaKey(lay)}
	if err := a.register(lay); err != nil {
		a.free()
		return nil, err
	}
	return a, nil
}

// register maps the arena's memory and registers its two rings.
func (a *arena) register(lay layout) error {
	size := lay.size()
	mem, err := mapMemory(size)
	if err != nil {
		return err
	}
	a.mem, a.base = mem, addrOf(mem)
	a.recv = mem[lay.recvOff() : lay.recvOff()+lay.ring]
	if a.recvMR, err = a.pd.RegMRRemoteWrite(a.recv); err == nil {
		// The header slots, if any, follow the send ring: one key for both.
		a.sendMR, err = a.pd.RegMR(mem[lay.sendOff():size])
	}
	return registerError(err, size)
}

// mapMemory maps size bytes for registration, faulted in: outside the Go
// heap (see arena), and registering them then pins pages that exist.
func mapMemory(size int) ([]byte, error) {
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, &mmapError{need: size, err: os.NewSyscallError("mmap", err)}
	}
	return mem, nil
}

// registerError is the error of a registration of size bytes that failed
// with err (nil: nil): out of locked memory, it says so with the limit.
func registerError(err error, size int) error {
	var lim unix.Rlimit
	if errors.Is(err, syscall.ENOMEM) && unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil && lim.Cur != unix.RLIM_INFINITY {
		return &memlockError{need: size, limit: lim.Cur, err: err}
	}
	return err
}

// free destroys a's QP, if it holds one, and deregisters, unmaps and
// deallocates whatever a has; no other QP may still be in its PD. What
// cannot be undone stays: memory whose registration remains stays mapped
// (the NIC may still use it), and the PD stays while anything remains
// registered in it. It returns the bytes of a's own memory left
// registered.
func (a *arena) free() (stuckBytes int) {
	a.destroyQP()
	own := 0
	for _, mr := range []*ibv.MR{a.recvMR, a.sendMR} {
		if mr != nil && retryDestroy(mr.Dereg) != nil {
			own++
			stuckBytes += mr.Len()
		}
	}
	a.recvMR, a.sendMR = nil, nil
	a.stuck.Add(int32(own))
	if a.mem != nil && own == 0 {
		unix.Munmap(a.mem)
		a.mem = nil
	}
	if a.pd != nil && a.stuck.Load() == 0 {
		retryDestroy(a.pd.Dealloc)
	}
	return stuckBytes
}

// reusable reports whether a closed connection's arena may serve another
// connection: its receive ring is registered anew (see rekey), and
// nothing of its past connections stayed registered in its PD (stuck).
func (a *arena) reusable() bool { return a.recvMR != nil && !a.stale && a.stuck.Load() == 0 }

// destroyQP destroys the pooled QP a holds, if any.
func (a *arena) destroyQP() {
	if a.qp != nil {
		destroyQP(a.qp)
		a.qp, a.qpShard = nil, nil
	}
}

// destroyQP destroys a QP no id holds.
func destroyQP(qp *ibv.QP) { retryDestroy(qp.Destroy) }

// rekey registers the receive ring again, for a new rkey. A past peer
// knows the old key, and the next QP in the arena's PD (the kept QP, with
// its number, or a new one whose number the device may hand out again at
// once, as siw does) is the one the key would reach: with the old key
// still valid, a past peer that sent to that number (with a packet
// sequence number it guessed) could write into the next connection's
// ring.
func (a *arena) rekey() error {
	if err := retryDestroy(a.recvMR.Dereg); err != nil {
		// The past peer's key stays valid: the arena must not serve
		// another connection (free tries the deregistration again).
		a.stale = true
		return err
	}
	mr, err := a.pd.RegMRRemoteWrite(a.recv)
	a.recvMR = mr
	return err
}

// scrub readies a closed connection's arena for another connection: its
// memory cleared (clear) and its receive ring rekeyed. An error leaves
// the arena unfit (reusable is false).
func (a *arena) scrub() error {
	a.clear()
	return a.rekey()
}

// clear zeroes the arena's memory. A message's place in the receive ring
// is computed by the receiver from the length its peer announces, not
// from where the bytes went: a peer that announces data and writes it
// elsewhere in the ring (or, on iWARP, sends a header with nothing
// written at all) makes Read return whatever the ring held at that place.
// Cleared, that is zeros or the peer's own bytes, never a past
// connection's. The send ring and the header slots are cleared too: no
// memory keeps a past user's bytes, whatever path may read it.
func (a *arena) clear() { clear(a.mem) }

// verbsRings registers a connection's big rings (see resize.go) in its
// arena's PD, mapped apart from the arena, and counts them in the
// device's registered memory.
type verbsRings struct {
	ar  *arena
	dev *device
}

func (v verbsRings) allocRing(size int, remote bool) (*ringMem, error) {
	var err error
	mem := v.dev.rings.take(size)
	if mem == nil {
		if mem, err = mapMemory(size); err != nil {
			return nil, err
		}
	}
	var mr *ibv.MR
	if remote {
		mr, err = v.ar.pd.RegMRRemoteWrite(mem)
	} else {
		mr, err = v.ar.pd.RegMR(mem)
	}
	if err != nil {
		v.dev.keepMapping(mem)
		return nil, registerError(err, size)
	}
	v.dev.addRegistered(size)
	return &ringMem{buf: mem, base: addrOf(mem), lkey: mr.LKey, rkey: mr.RKey, reg: mr}, nil
}

// freeRing deregisters a ring and gives its memory to the device's
// ringMaps, or unmaps it past their bound; one whose registration cannot
// be undone stays mapped and counted, and its arena serves no other
// connection.
func (v verbsRings) freeRing(m *ringMem) {
	if retryDestroy(m.reg.(*ibv.MR).Dereg) != nil {
		v.ar.stuck.Add(1)
		return
	}
	v.dev.addRegistered(-len(m.buf))
	v.dev.keepMapping(m.buf)
}

// keepMapping gives an unregistered ring's memory to the device's
// ringMaps (which clear it before it serves again), or unmaps it past the
// pool's byte bound.
func (d *device) keepMapping(m []byte) {
	if bytes, _ := poolLimits(); !d.rings.put(m, bytes) {
		unix.Munmap(m)
	}
}

// addrOf is the address the NIC uses for the first byte of b.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// The device's pool (see pool.go) keeps the arenas of closed connections,
// with their reset QPs, for the next ones on the same device: creating a
// QP and mmap'ing, faulting in and registering a connection's memory are
// most of what setting one up costs under Soft-RoCE. The rule of the pool
// is that nothing enters it readable by its next user: keepArena scrubs
// every arena it keeps, with its QP or without (its memory cleared, its
// receive ring rekeyed), and a kept ring mapping is cleared as it is taken
// again (ringMaps.take). Clearing costs a memset of memory already faulted in,
// a small part of the mapping and registration it saves
// (BenchmarkScrubArena).

// newArena makes an arena laid out as lay. When one cannot be had (the
// locked-memory limit, say), the pool lets its arenas go and the
// registration is tried once more.
func (d *device) newArena(lay layout) (*arena, error) {
	a, err := newArena(d.ctx, lay)
	if err != nil && d.dropPool() > 0 {
		a, err = newArena(d.ctx, lay)
	}
	return a, err
}

// keepArena gives a closed connection's arena to the pool, scrubbed (see
// arena.scrub): with its QP if it kept one and the pool takes it, else
// without, else a is freed.
func (d *device) keepArena(a *arena) {
	if !a.reusable() || a.scrub() != nil {
		d.freeArena(a)
		return
	}
	if a.qp != nil {
		if d.pool.put(a, a.key, true) {
			return
		}
		a.destroyQP()
	}
	if !d.pool.put(a, a.key, false) {
		d.freeArena(a)
	}
}

// freeArena frees a, counting what of its memory stays registered
// (a.free) in the device's registered memory.
func (d *device) freeArena(a *arena) {
	if n := a.free(); n > 0 {
		d.addRegistered(n)
	}
}

// dropPool frees everything the pool and the ring mappings keep, and
// returns how many arenas the pool held: only they free registered
// memory, which a registration that failed may be short of.
func (d *device) dropPool() int {
	as := d.pool.drop()
	for _, a := range as {
		d.freeArena(a)
	}
	for _, m := range d.rings.drop() {
		unix.Munmap(m)
	}
	return len(as)
}
