package rdma

import (
	"math/bits"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/rdma/internal/wire"
)

// A datagram larger than a UD message arrives as fragments, in any order
// or not at all, and the receiver holds the ones it has until the rest
// come. Every peer that can reach the queue pair can make it hold memory
// that way, so what it holds is bounded per source and in all, and a
// datagram that misses a fragment is given up after a timeout, as IP
// does. A source at its bounds makes room by giving up its own oldest
// datagram, never another source's: a flood from one source cannot push
// out the datagrams of others.
//
// A datagram is named by its sender's address and port and the id the
// sender gave it, which are not unique for ever: a sender that restarts
// on the same port numbers its datagrams anew (from a random start, see
// PacketConn.initPath, so rarely where the old one left off), and ids
// wrap. So nothing here outlives the timeout: an incomplete datagram is
// given up and a finished one forgotten that long after, and a fragment
// whose geometry (length, fragment size) is not its datagram's is never
// merged into it.

// reassemblyLimits bound what a reassembler holds. Zero fields take the
// defaults.
type reassemblyLimits struct {
	Total     int           // bytes of incomplete datagrams held at once, all sources
	PerSource int           // bytes held for one source
	Timeout   time.Duration // an incomplete datagram is dropped this long after its first fragment
}

// The default reassemblyLimits: 64 of the largest datagrams at once, 16
// of them from one source, given a second to complete.
const (
	defaultReassemblyTotal     = 4 << 20
	defaultReassemblyPerSource = 1 << 20
	defaultReassemblyTimeout   = time.Second
)

// A datagram is reassembled in a buffer of a power-of-two size class from
// minReassemblyBuf to maxReassemblyBuf, which is what it is charged: a
// peer's tiny fragmented datagrams cost what they take, not a 64 KiB
// buffer each for the price of their length. Buffers come back through
// release for the next datagram of their class, up to reassemblyIdle
// bytes kept, so a steady stream reassembles without allocating.
const (
	minReassemblyShift = 10 // 1 KiB
	maxReassemblyShift = 16 // 64 KiB, room for wire.MaxDatagram
	minReassemblyBuf   = 1 << minReassemblyShift
	maxReassemblyBuf   = 1 << maxReassemblyShift
	reassemblyClasses  = maxReassemblyShift - minReassemblyShift + 1
	reassemblyIdle     = 1 << 20

	// maxReassemblyFrags is the most fragments a datagram has: the
	// largest in the smallest fragments.
	maxReassemblyFrags = (wire.MaxDatagram + wire.MinFragSize - 1) / wire.MinFragSize

	// reassemblyDoneMemo is how many recently finished datagrams a
	// reassembler remembers (below).
	reassemblyDoneMemo = 16
)

// doneDgram is a datagram finished lately: its name and geometry, and
// when it is forgotten.
type doneDgram struct {
	key             reassemblyKey
	total, fragSize int
	until           time.Time
}

// reassemblyKey names a datagram: its sender and the id the sender gave
// it.
type reassemblyKey struct {
	src netip.AddrPort
	id  uint32
}

// partialDgram is an incomplete datagram: its buffer, which fragments it
// has, and its places in the reassembler's lists.
type partialDgram struct {
	key      reassemblyKey
	buf      []byte // the datagram: len Total, cap its size class
	charge   int    // the size class's bytes, charged to the source and in all
	fragSize int
	have     int // fragments received
	want     int
	got      [(maxReassemblyFrags + 63) / 64]uint64
	deadline time.Time

	prev, next   *partialDgram // all incomplete datagrams, oldest first
	sprev, snext *partialDgram // its source's, oldest first
}

// reassemblySource is what one source holds.
type reassemblySource struct {
	held           int
	oldest, newest *partialDgram
}

// reassembler puts fragmented datagrams together within reassemblyLimits.
// It is not safe for concurrent use: its owner holds a lock around every
// call, the lock its timer takes too (sweepOnTimer).
type reassembler struct {
	limits  reassemblyLimits
	partial map[reassemblyKey]*partialDgram
	sources map[netip.Addr]*reassemblySource // by the source's IP: the port is the sender's to choose
	oldest  *partialDgram
	newest  *partialDgram
	total   int // bytes charged to incomplete datagrams

	// The datagrams finished last, completed or dropped, each for the
	// timeout after: a fragment of one that comes later (a duplicate, or
	// one of a datagram given up) cannot complete anything, so it is
	// dropped (and counted as stale) rather than begin a datagram that
	// would hold memory until the timeout. A datagram refused for want
	// of room is thus counted once, not once per fragment. An entry
	// goes after the timeout, so that the datagram of a restarted
	// sender that reused the id gets through then; one whose geometry
	// differs gets through at once.
	done     [reassemblyDoneMemo]doneDgram
	nextDone int

	// With sweepOnTimer, a timer runs the timeouts while anything is
	// held, so that an incomplete datagram is given up (and counted) in
	// time even when no fragment comes to sweep it. mu is the owner's
	// lock around every call, timeouts counts what the timer drops;
	// armed is whether timer is pending.
	mu       *sync.Mutex
	timeouts *atomic.Uint64
	timer    *time.Timer
	armed    bool

	free     [reassemblyClasses][][]byte
	idle     int // bytes in free
	spare    []*partialDgram
	spareSrc []*reassemblySource
}

func newReassembler(l reassemblyLimits) *reassembler {
	if l.Total <= 0 {
		l.Total = defaultReassemblyTotal
	}
	if l.PerSource <= 0 {
		l.PerSource = defaultReassemblyPerSource
	}
	if l.Timeout <= 0 {
		l.Timeout = defaultReassemblyTimeout
	}
	return &reassembler{
		limits:  l,
		partial: make(map[reassemblyKey]*partialDgram),
		sources: make(map[netip.Addr]*reassemblySource),
	}
}

// add takes one fragment (h.Fragment set, h and payload as
// wire.ParseDatagram returned them) from src at now. It returns the whole
// datagram when this fragment completes it, a buffer the caller owns
// until it gives it back with release, or nil. dropped is how many
// datagrams the call gave up: timed out, evicted to make room, or the
// fragment's own when it disagrees with the datagram's first fragment or
// there is no room for it. stale reports that the fragment itself was
// dropped for it could complete nothing: a duplicate, or one of a
// datagram finished lately.
//
// The first fragment of a datagram fixes its length and fragment size. A
// fragment that disagrees drops what there was of it and starts it anew:
// a sender that reused an id (restarted on the same port) still gets its
// new datagram through, and the bytes of two datagrams are never mixed.
// A fragment seen before changes nothing, nor does one of the same
// geometry of a datagram finished (completed, dropped or refused) less
// than the timeout ago. now is to come from a monotonic clock
// (time.Now): the timeouts are swept in the order datagrams began.
func (r *reassembler) add(src netip.AddrPort, h wire.DgramHeader, payload []byte, now time.Time) (datagram []byte, dropped int, stale bool) {
	dropped = r.expire(now)
	key := reassemblyKey{src, h.ID}
	p := r.partial[key]
	if p != nil && (len(p.buf) != h.Total || p.fragSize != h.FragSize) {
		r.drop(p)
		dropped++
		p = nil
	} else if p == nil && r.recentlyDone(key, h, now) {
		return nil, dropped, true
	}
	if p == nil {
		var n int
		if p, n = r.start(key, h, now); p == nil {
			r.memoDone(key, h.Total, h.FragSize, now)
			return nil, dropped + n + 1, false
		}
		dropped += n
		r.arm(now)
	}
	i := h.Offset / h.FragSize
	w, bit := i/64, uint64(1)<<(i%64)
	if p.got[w]&bit != 0 {
		return nil, dropped, true
	}
	p.got[w] |= bit
	p.have++
	copy(p.buf[h.Offset:], payload)
	if p.have < p.want {
		return nil, dropped, false
	}
	datagram = p.buf
	p.buf = nil
	r.remove(p)
	r.memoDone(key, h.Total, h.FragSize, now)
	return datagram, dropped, false
}

// memoDone remembers for the timeout that the datagram of key, of total
// bytes in fragments of fragSize, finished at now.
func (r *reassembler) memoDone(key reassemblyKey, total, fragSize int, now time.Time) {
	r.done[r.nextDone] = doneDgram{key, total, fragSize, now.Add(r.limits.Timeout)}
	r.nextDone = (r.nextDone + 1) % reassemblyDoneMemo
}

// memoDropped remembers that p, being given up at now, is finished.
func (r *reassembler) memoDropped(p *partialDgram, now time.Time) {
	r.memoDone(p.key, len(p.buf), p.fragSize, now)
}

// recentlyDone reports whether a datagram of key and h's geometry
// finished less than the timeout before now.
func (r *reassembler) recentlyDone(key reassemblyKey, h wire.DgramHeader, now time.Time) bool {
	for _, d := range r.done {
		if d.key == key && d.key.src.IsValid() && d.total == h.Total && d.fragSize == h.FragSize && now.Before(d.until) {
			return true
		}
	}
	return false
}

// start makes room for a new datagram and begins it, or returns nil when
// there is none. evicted is how many of the source's older datagrams it
// gave up for the room.
func (r *reassembler) start(key reassemblyKey, h wire.DgramHeader, now time.Time) (p *partialDgram, evicted int) {
	class := reassemblyClass(h.Total)
	size := minReassemblyBuf << class
	s := r.sources[key.src.Addr()]
	own := 0
	if s != nil {
		own = s.held
	}
	if size > r.limits.PerSource || r.total-own+size > r.limits.Total {
		// Even all the source's own datagrams would not make room.
		return nil, 0
	}
	for s != nil && (s.held+size > r.limits.PerSource || r.total+size > r.limits.Total) {
		r.memoDropped(s.oldest, now)
		r.drop(s.oldest)
		evicted++
		s = r.sources[key.src.Addr()]
	}
	if s == nil {
		if n := len(r.spareSrc); n > 0 {
			s = r.spareSrc[n-1]
			r.spareSrc = r.spareSrc[:n-1]
		} else {
			s = new(reassemblySource)
		}
		r.sources[key.src.Addr()] = s
	}
	if n := len(r.spare); n > 0 {
		p = r.spare[n-1]
		r.spare = r.spare[:n-1]
	} else {
		p = new(partialDgram)
	}
	*p = partialDgram{
		key:      key,
		buf:      r.buffer(class)[:h.Total],
		fragSize: h.FragSize,
		want:     wire.DgramFragments(h.Total, h.FragSize),
		charge:   size,
		deadline: now.Add(r.limits.Timeout),
		prev:     r.newest,
		sprev:    s.newest,
	}
	if r.newest != nil {
		r.newest.next = p
	} else {
		r.oldest = p
	}
	r.newest = p
	if s.newest != nil {
		s.newest.snext = p
	} else {
		s.oldest = p
	}
	s.newest = p
	s.held += size
	r.total += size
	r.partial[key] = p
	return p, evicted
}

// reassemblyClass is the size class of a datagram of n bytes.
func reassemblyClass(n int) int {
	if n <= minReassemblyBuf {
		return 0
	}
	return bits.Len(uint(n-1)) - minReassemblyShift
}

// buffer returns a buffer of the size class, a released one if any.
func (r *reassembler) buffer(class int) []byte {
	if n := len(r.free[class]); n > 0 {
		b := r.free[class][n-1]
		r.free[class] = r.free[class][:n-1]
		r.idle -= cap(b)
		return b
	}
	return make([]byte, minReassemblyBuf<<class)
}

// release gives back a datagram add returned, for reuse: the caller no
// longer touches its bytes.
func (r *reassembler) release(datagram []byte) {
	r.recycle(datagram)
}

// recycle keeps a buffer of a size class for reuse, up to reassemblyIdle
// bytes of them; anything else is the collector's.
func (r *reassembler) recycle(b []byte) {
	c := cap(b)
	if c < minReassemblyBuf || c > maxReassemblyBuf || c&(c-1) != 0 || r.idle+c > reassemblyIdle {
		return
	}
	class := bits.Len(uint(c)) - 1 - minReassemblyShift
	r.free[class] = append(r.free[class], b[:c])
	r.idle += c
}

// expire drops the datagrams that are incomplete their Timeout after
// their first fragment, and returns how many. They are in the order they
// began, with the same timeout each, so it looks at no more than those
// it drops and one.
func (r *reassembler) expire(now time.Time) int {
	n := 0
	for r.oldest != nil && !now.Before(r.oldest.deadline) {
		r.memoDropped(r.oldest, now)
		r.drop(r.oldest)
		n++
	}
	return n
}

// sweepOnTimer makes a timer run r's timeouts while it holds anything,
// not only the adds: an incomplete datagram is given up at its deadline
// even when no fragment follows, and counted in timeouts. mu is the lock
// the owner holds around every call of r's, which the timer takes too.
// reset stops the timer.
func (r *reassembler) sweepOnTimer(mu *sync.Mutex, timeouts *atomic.Uint64) {
	r.mu, r.timeouts = mu, timeouts
}

// arm sets the timer, if r has one and it is not pending, for the
// deadline of the oldest datagram, the first to come: every datagram has
// the same timeout, so later ones are after it. A timer left pending
// for a datagram that completed meanwhile fires early, finds nothing to
// drop, and is set for the oldest again.
func (r *reassembler) arm(now time.Time) {
	if r.mu == nil || r.armed || r.oldest == nil {
		return
	}
	r.armed = true
	d := r.oldest.deadline.Sub(now)
	if r.timer == nil {
		r.timer = time.AfterFunc(d, r.sweep)
	} else {
		r.timer.Reset(d)
	}
}

// sweep is the timer's: it drops the datagrams timed out, counts them,
// and sets the timer again while anything is held.
func (r *reassembler) sweep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = false
	now := time.Now()
	if n := r.expire(now); n > 0 {
		r.timeouts.Add(uint64(n))
	}
	r.arm(now)
}

// held is the bytes charged to incomplete datagrams: their buffers.
func (r *reassembler) held() int { return r.total }

// reset drops everything, as when the PacketConn closes. Datagrams add
// returned stay the caller's.
func (r *reassembler) reset() {
	for r.oldest != nil {
		r.drop(r.oldest)
	}
	if r.timer != nil {
		// A sweep already under way finds nothing held, and stops.
		r.timer.Stop()
		r.armed = false
	}
	r.done = [reassemblyDoneMemo]doneDgram{}
	r.free = [reassemblyClasses][][]byte{}
	r.idle = 0
	r.spare, r.spareSrc = nil, nil
}

// drop gives up an incomplete datagram, keeping its buffer for reuse.
func (r *reassembler) drop(p *partialDgram) {
	b := p.buf
	p.buf = nil
	r.remove(p)
	r.recycle(b)
}

// remove takes p out of the lists and the accounts.
func (r *reassembler) remove(p *partialDgram) {
	delete(r.partial, p.key)
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		r.oldest = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		r.newest = p.prev
	}
	s := r.sources[p.key.src.Addr()]
	if p.sprev != nil {
		p.sprev.snext = p.snext
	} else {
		s.oldest = p.snext
	}
	if p.snext != nil {
		p.snext.sprev = p.sprev
	} else {
		s.newest = p.sprev
	}
	s.held -= p.charge
	r.total -= p.charge
	if s.oldest == nil {
		delete(r.sources, p.key.src.Addr())
		*s = reassemblySource{}
		r.spareSrc = append(r.spareSrc, s)
	}
	*p = partialDgram{}
	r.spare = append(r.spare, p)
}
