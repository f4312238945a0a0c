package rdma

import (
	"sync"
	"sync/atomic"
	"time"
)

// The pool of a device's ready connection objects: the registered memory
// of closed connections (an arena: a protection domain and two rings) and,
// with it, a dialed connection's QP, reset and kept in the arena's PD.
// Creating a QP and destroying it were ~2 ms of each connection end's
// setup and release CPU under Soft-RoCE (queue memory the kernel allocates and maps, then frees);
// resetting a drained QP and moving it back to INIT for a new peer are two
// ibv_modify_qp calls. The pool's bookkeeping is here, apart from the
// verbs (buffers.go), so that its rules are tested on any host.

// poolKey is what a kept entry was made for: its memory (the arena's size
// and ring) and, if it has a QP, that QP's queues. An entry serves a
// connection whose layout has the same memory; its QP only one with the
// same queues too.
type poolKey struct {
	size, ring     int // the arena's bytes and each ring's
	sendWR, recvWR int // the QP's send and receive queues
}

// memOf is the part of a key the memory alone must match.
func (k poolKey) memOf() poolKey { return poolKey{size: k.size, ring: k.ring} }

// Default bounds of what a device keeps unused (see SetDevicePool). The
// memory bound counts the arenas (32 MiB: 1,024 idle connection ends'
// worth with the default Options); the QP bound counts the kernel's queue
// memory and the NIC's QP contexts that nothing uses.
const (
	maxPooled    = 32 << 20
	maxPooledQPs = 256
)

// poolBytes and poolQPs are the bounds in force (SetDevicePool).
var poolBytes, poolQPs atomic.Int64

func init() {
	poolBytes.Store(maxPooled)
	poolQPs.Store(maxPooledQPs)
}

// SetDevicePool bounds what each RDMA device keeps of closed connections
// for the next ones on it: at most bytes of their registered memory, and
// of their QPs (reset, ready for a new peer; only dialed connections' QPs
// are kept, for the next dials) at most qps; and, apart, at most bytes of
// the memory of their grown rings (see Options.BufferSize), kept mapped
// but not registered, for the next connections that stream. The defaults are
// 32 MiB and 256; a bound of 0 keeps nothing of that kind, and a negative
// one leaves the bound as it is. Devices shows what each keeps
// (PooledBytes, PooledQPs). The bounds hold for what is kept from the
// call on; a device gives back everything it keeps half a second after its
// last connection closes, and at once when it is removed. It returns the
// bounds that were in force.
func SetDevicePool(bytes, qps int) (oldBytes, oldQPs int) {
	oldBytes, oldQPs = int(poolBytes.Load()), int(poolQPs.Load())
	if bytes >= 0 {
		poolBytes.Store(int64(bytes))
	}
	if qps >= 0 {
		poolQPs.Store(int64(qps))
	}
	return oldBytes, oldQPs
}

// poolLimits returns the bounds in force.
func poolLimits() (bytes, qps int) { return int(poolBytes.Load()), int(poolQPs.Load()) }

// qpCooling is how long a kept QP rests before another connection takes
// it. Its last connection is over on both sides when it is kept, but not
// everything of it may be: a packet of that connection still in the
// network, or the peer's connection manager still to process the
// disconnect's last message (it processes messages concurrently, so a
// new connection's request from the same QP number can overtake it, and
// is then refused as stale: see Conn.reusableQP). InfiniBand's
// connection manager keeps a closed connection's QP number out of use for
// the packet lifetime for the same reason (its timewait: up to seconds, sized for the largest fabrics);
// this is shorter, sized for a data center's round trips and the
// connection managers' queues, and long enough that only connections
// opened at a high rate reuse QPs at all.
const qpCooling = 100 * time.Millisecond

// readyPool keeps entries (arenas, each maybe with its reset QP) of closed
// connections for the next ones, within the bounds limits returns (read
// at each put) of memory and QPs.
// The most recently kept entry goes first: its memory and QP context are
// the likeliest to be in the caches; but a QP only once it has rested
// for cooling.
type readyPool[T any] struct {
	mu      sync.Mutex
	free    []pooled[T]
	bytes   int
	qps     int
	limits  func() (bytes, qps int)
	cooling time.Duration
	now     func() time.Time
}

type pooled[T any] struct {
	v       T
	key     poolKey
	qp      bool      // it comes with a reset QP made for key
	readyAt time.Time // when the QP may serve again
}

func newReadyPool[T any](limits func() (bytes, qps int), cooling time.Duration) readyPool[T] {
	return readyPool[T]{limits: limits, cooling: cooling, now: time.Now}
}

// take removes and returns the entry that serves a dial for key best: the
// newest with a rested QP made for key, else the newest whose memory fits
// and has no QP for key (a QP still resting stays for a later connection).
// qpFits says whether the entry's QP serves key; an entry kept with a QP
// for other queues comes with qpFits false, and its QP is the caller's to
// destroy.
func (p *readyPool[T]) take(key poolKey) (v T, qpFits, ok bool) {
	return p.takeFor(key, true)
}

// takeMemory removes and returns the newest entry without a QP whose
// memory fits key, for an accepted connection: an accept never adopts a
// kept QP (see Conn.reusableQP), and leaves the entries that have one to
// dials.
func (p *readyPool[T]) takeMemory(key poolKey) (v T, ok bool) {
	v, _, ok = p.takeFor(key, false)
	return v, ok
}

func (p *readyPool[T]) takeFor(key poolKey, wantQP bool) (v T, qpFits, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	best := -1
	for i := len(p.free) - 1; i >= 0; i-- {
		e := p.free[i]
		if e.qp && !wantQP {
			continue
		}
		if e.qp && e.key == key {
			if !e.readyAt.After(now) {
				best = i
				break
			}
			continue // resting
		}
		if best < 0 && e.key.memOf() == key.memOf() {
			best = i
		}
	}
	if best < 0 {
		return v, false, false
	}
	e := p.free[best]
	p.free = append(p.free[:best], p.free[best+1:]...)
	p.bytes -= e.key.size
	if e.qp {
		p.qps--
	}
	return e.v, e.qp && e.key == key, true
}

// put keeps v, made for key and with a reset QP if qp, unless that would
// pass a bound; it reports whether it did. An entry refused with its QP
// may be offered again without it.
func (p *readyPool[T]) put(v T, key poolKey, qp bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	maxBytes, maxQPs := p.limits()
	if p.bytes+key.size > maxBytes || (qp && p.qps >= maxQPs) {
		return false
	}
	if !qp {
		key.sendWR, key.recvWR = 0, 0
	}
	e := pooled[T]{v: v, key: key, qp: qp}
	if qp {
		e.readyAt = p.now().Add(p.cooling)
	}
	p.free = append(p.free, e)
	p.bytes += key.size
	if qp {
		p.qps++
	}
	return true
}

// drop empties the pool and returns what it held, for the caller to free.
func (p *readyPool[T]) drop() []T {
	p.mu.Lock()
	defer p.mu.Unlock()
	vs := make([]T, len(p.free))
	for i, e := range p.free {
		vs[i] = e.v
	}
	p.free, p.bytes, p.qps = nil, 0, 0
	return vs
}

// counts returns the memory and the QPs kept.
func (p *readyPool[T]) counts() (bytes, qps int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes, p.qps
}

// ringMaps keeps the memory of closed connections' big rings (resize.go),
// deregistered but still mapped and faulted in, for the next rings of the
// same size on the device. A streaming connection grows its rings to a
// MiB or more each way; mapping that much anew, faulting it in and unmapping
// it again was a sixth of the CPU of a relay whose connections each carry
// a few MiB (bench/README.md, "Applications"), where registering it is not.
// Unregistered, the memory belongs to no protection domain, so any
// connection of the device may register it in its own, with a new key.
// What it held of its last connection is never readable by the next: take
// clears it (a receive ring's bytes are read where the peer's announced
// length puts them, written there or not: see arena.clear).
type ringMaps struct {
	mu    sync.Mutex
	free  map[int][][]byte // by size
	bytes int
}

// take returns a kept mapping of size bytes, cleared, or nil. It is
// cleared here, once it is the caller's and without r.mu, rather than when
// it is kept: only what is used again costs the memset.
func (r *ringMaps) take(size int) []byte {
	r.mu.Lock()
	ms := r.free[size]
	if len(ms) == 0 {
		r.mu.Unlock()
		return nil
	}
	m := ms[len(ms)-1]
	ms[len(ms)-1] = nil
	r.free[size] = ms[:len(ms)-1]
	r.bytes -= size
	r.mu.Unlock()
	clear(m)
	return m
}

// put keeps m unless that would take the kept bytes past limit; it
// reports whether it did (if not, m is the caller's to unmap).
func (r *ringMaps) put(m []byte, limit int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bytes+len(m) > limit {
		return false
	}
	if r.free == nil {
		r.free = map[int][][]byte{}
	}
	r.free[len(m)] = append(r.free[len(m)], m)
	r.bytes += len(m)
	return true
}

// drop empties r and returns what it kept, for the caller to unmap.
func (r *ringMaps) drop() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all [][]byte
	for _, ms := range r.free {
		all = append(all, ms...)
	}
	r.free, r.bytes = nil, 0
	return all
}

// kept returns the bytes r keeps.
func (r *ringMaps) kept() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bytes
}
