package rdma

import (
	"math/bits"
	"net/netip"
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
// It is not safe for concurrent use.
type reassembler struct {
	limits  reassemblyLimits
	partial map[reassemblyKey]*partialDgram
	sources map[netip.Addr]*reassemblySource // by the source's IP: the port is the sender's to choose
	oldest  *partialDgram
	newest  *partialDgram
	total   int // bytes charged to incomplete datagrams

	// The datagrams finished last, completed or dropped: a fragment of
	// one that comes later (a duplicate, or one of a datagram given up)
	// cannot complete anything, so it is ignored rather than begin a
	// datagram that would hold memory until the timeout. A datagram
	// refused for want of room is thus counted once, not once per
	// fragment.
	done     [reassemblyDoneMemo]reassemblyKey
	nextDone int

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
// there is no room for it.
//
// The first fragment of a datagram fixes its length and fragment size. A
// fragment that disagrees drops what there was of it and starts it anew:
// a sender that reused an id still gets its new datagram through, and
// the bytes of two datagrams are never mixed. A fragment seen before
// changes nothing, nor does one of a datagram finished lately (completed,
// dropped or refused): it could complete nothing. Senders number their
// datagrams in sequence, so a new datagram never has the id of one
// finished lately. now is to come from a monotonic clock (time.Now): the
// timeouts are swept in the order datagrams began.
func (r *reassembler) add(src netip.AddrPort, h wire.DgramHeader, payload []byte, now time.Time) (datagram []byte, dropped int) {
	dropped = r.expire(now)
	key := reassemblyKey{src, h.ID}
	p := r.partial[key]
	if p != nil && (len(p.buf) != h.Total || p.fragSize != h.FragSize) {
		r.drop(p)
		dropped++
		p = nil
	} else if p == nil && r.recentlyDone(key) {
		return nil, dropped
	}
	if p == nil {
		var n int
		if p, n = r.start(key, h, now); p == nil {
			r.memoDone(key)
			return nil, dropped + n + 1
		}
		dropped += n
	}
	i := h.Offset / h.FragSize
	w, bit := i/64, uint64(1)<<(i%64)
	if p.got[w]&bit != 0 {
		return nil, dropped
	}
	p.got[w] |= bit
	p.have++
	copy(p.buf[h.Offset:], payload)
	if p.have < p.want {
		return nil, dropped
	}
	datagram = p.buf
	p.buf = nil
	r.remove(p)
	r.memoDone(key)
	return datagram, dropped
}

// memoDone remembers that the datagram of key is finished.
func (r *reassembler) memoDone(key reassemblyKey) {
	r.done[r.nextDone] = key
	r.nextDone = (r.nextDone + 1) % reassemblyDoneMemo
}

// recentlyDone reports whether the datagram of key finished lately.
func (r *reassembler) recentlyDone(key reassemblyKey) bool {
	for _, k := range r.done {
		if k == key && k.src.IsValid() {
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
		r.memoDone(s.oldest.key)
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
		r.memoDone(r.oldest.key)
		r.drop(r.oldest)
		n++
	}
	return n
}

// held is the bytes charged to incomplete datagrams: their buffers.
func (r *reassembler) held() int { return r.total }

// reset drops everything, as when the PacketConn closes. Datagrams add
// returned stay the caller's.
func (r *reassembler) reset() {
	for r.oldest != nil {
		r.drop(r.oldest)
	}
	r.done = [reassemblyDoneMemo]reassemblyKey{}
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
