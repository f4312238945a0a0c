package rdma

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
)

// One-sided operations in flight: the slot table that bounds them and
// names their completions, starting one, what its completion does, and
// the errors a caller gets. The API (Region, RemoteRegion) is region.go's;
// the waiting for a completion follows the waiting policy (wait.go); the
// bounce memory of ReadAt and WriteAt is bounce.go's.

// One-sided operations.
const (
	opRead        = 1
	opWrite       = 2
	opCompareSwap = 3 // remote atomics: see atomic.go
	opFetchAdd    = 4
)

// opName is the operation's name in errors (net.OpError.Op).
func opName(op uint8) string {
	switch op {
	case opRead:
		return "read"
	case opWrite:
		return "write"
	case opCompareSwap:
		return "compare-and-swap"
	}
	return "fetch-add"
}

func isAtomic(op uint8) bool { return op == opCompareSwap || op == opFetchAdd }

// atomicAt is where, in the bounce memory, the old value of slot i's
// atomic lands: 8 bytes per slot behind the chunks.
func atomicAt(i int) int { return bounceChunks*bounceChunk + i*AtomicSize }

// wrOneSided tags the work request id of a one-sided operation (wrSend
// clear): the slot's index in the low byte, its generation above.
const wrOneSided = 1 << 62

// osSlot is one one-sided operation in flight.
type osSlot struct {
	gen       uint32
	busy      bool // posted (or being posted), not yet given back
	finished  bool // completed; the caller has yet to look
	abandoned bool // the caller gave up (its context): the completion frees the slot
	status    uint32
	old       uint64        // an atomic's result: the word's value before
	reg       *Region       // pinned until the completion
	done      doneFlag      // the completion arrived (see doneFlag)
	wr        [1]ibv.SendWR // posted from here, so that posting does not allocate
}

// oneSided is a connection's state of one-sided RDMA: its regions, the
// slot table of operations in flight, and the bounce memory of ReadAt and
// WriteAt. Conn.mu guards it.
type oneSided struct {
	slots    [oneSidedDepth]osSlot
	free     []uint8       // indexes of free slots
	inFlight int           // posted, completion not yet seen
	posting  int           // being posted with the lock dropped
	room     chan struct{} // capacity 1: a slot came back
	// roomWaits counts the callers waiting for a free slot: a slot
	// given back signals room only then (a channel send costs about a
	// tenth of a 64 B READ over the zero-cost provider).
	roomWaits int

	chunkRoom chan struct{} // capacity 1: a bounce chunk came back
	avgWait   atomic.Int64  // moving average of the waits, in ns (see waitOneSided)

	regions    []*Region
	bounce     *Region
	bounceUp   atomic.Bool // bounce is set: no need to take the locks to look
	chunksFree []int       // free bounce chunks
	chunksOut  int         // bounce chunks held by callers
	bounceGone bool        // the release revoked the bounce memory: it is unmapped once no chunk is held
}

func (t *oneSided) init() {
	if t.room != nil {
		return
	}
	t.room = make(chan struct{}, 1)
	t.chunkRoom = make(chan struct{}, 1)
	t.free = make([]uint8, 0, oneSidedDepth)
	for i := range t.slots {
		t.slots[i].done.ch = make(chan struct{}, 1)
		t.free = append(t.free, uint8(oneSidedDepth-1-i))
	}
}

// get takes a free slot, or reports that all are in use.
func (t *oneSided) get() (int, bool) {
	if len(t.free) == 0 {
		return 0, false
	}
	i := int(t.free[len(t.free)-1])
	t.free = t.free[:len(t.free)-1]
	s := &t.slots[i]
	s.gen++
	s.busy, s.finished, s.abandoned, s.status = true, false, false, 0
	s.done.reset()
	return i, true
}

// passRoom passes a wakeup for room on to another waiter while slots are
// free: a caller that took it and leaves without a slot (its context, the
// connection's end, its region closed) or with one of several would
// otherwise leave the others waiting for the next slot given back. Mu is
// held.
func (t *oneSided) passRoom() {
	if len(t.free) > 0 && t.roomWaits > 0 {
		signal(t.room)
	}
}

// wrid is the work request id of slot i's operation.
func (t *oneSided) wrid(i int) uint64 {
	return wrOneSided | uint64(t.slots[i].gen)<<8 | uint64(i)
}

// lookup finds the slot a completion's id names; a stale or foreign id
// names none.
func (t *oneSided) lookup(wrid uint64) (int, bool) {
	i := int(wrid & 0xff)
	if wrid&(wrSend|wrOneSided) != wrOneSided || i >= oneSidedDepth || t.room == nil {
		return 0, false
	}
	s := &t.slots[i]
	if !s.busy || s.finished || uint32(wrid>>8) != s.gen {
		return 0, false
	}
	return i, true
}

// put gives slot i back and unpins its region.
func (t *oneSided) put(i int) {
	s := &t.slots[i]
	s.busy, s.finished, s.abandoned = false, false, false
	if r := s.reg; r != nil {
		s.reg = nil
		if r.pins--; r.pins == 0 {
			signal(r.unpinned)
		}
	}
	t.free = append(t.free, uint8(i))
	t.passRoom()
}

// idle reports whether no one-sided operation is in flight or being
// posted, and no caller holds bounce memory.
func (t *oneSided) idle() bool { return t.inFlight == 0 && t.posting == 0 && t.chunksOut == 0 }

// abort completes, as flushed, every operation whose completion never
// came (the teardown's drain timed out): their callers return instead of
// waiting for ever, and their regions are unpinned.
func (c *Conn) abortOneSided() {
	t := &c.os
	for i := range t.slots {
		if s := &t.slots[i]; s.busy && !s.finished {
			c.oneSidedDone(ibv.WC{WRID: t.wrid(i), Status: ibv.WCFlushErr})
		}
	}
}

// forget drops a freed region from the list.
func (t *oneSided) forget(r *Region) {
	for i, x := range t.regions {
		if x == r {
			t.regions = append(t.regions[:i], t.regions[i+1:]...)
			return
		}
	}
}

// oneSidedEnded is why a one-sided operation cannot start (mu is held):
// the connection is closed, not established, or failed.
func (c *Conn) oneSidedEnded() error {
	switch {
	case c.life.has(shutClosed) || c.tx.draining || c.life.phase == phaseDead:
		return net.ErrClosed
	case c.life.werr != nil:
		return c.life.werr
	case c.life.rerr != nil:
		return c.life.rerr
	case c.life.has(shutPeerGone) || c.qpBroken:
		return syscall.ECONNRESET
	case c.life.phase != phaseEstablished:
		return net.ErrClosed
	}
	return nil
}

// startOneSided posts one RDMA READ (op opRead: the peer's bytes at off
// of key into local at lo) or WRITE of n bytes, the caller having checked
// the bounds, once a slot is free, and returns the slot. An atomic (op
// opCompareSwap of a for b, or opFetchAdd of a) of the word at off takes
// no local region: its result lands in the slot's bytes of the bounce
// memory, which the caller has registered.
func (c *Conn) startOneSided(ctx context.Context, op uint8, local *Region, lo, n int, key RemoteKey, off uint64, a, b uint64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &c.os
	t.init()
	var i int
	for {
		if err := c.oneSidedEnded(); err != nil {
			t.passRoom()
			return 0, err
		}
		if isAtomic(op) {
			local = t.bounce
		}
		if local.closed {
			t.passRoom()
			return 0, net.ErrClosed
		}
		var ok bool
		if i, ok = t.get(); ok {
			break
		}
		t.roomWaits++
		c.mu.Unlock()
		select {
		case <-t.room:
		case <-c.closing:
		case <-ctx.Done():
			c.mu.Lock()
			t.roomWaits--
			t.passRoom()
			return 0, ctx.Err()
		}
		c.mu.Lock()
		t.roomWaits--
	}
	t.passRoom() // another waiter may take the next one
	s := &t.slots[i]
	s.reg = local
	local.pins++
	if isAtomic(op) {
		lo = atomicAt(i)
	}
	flags := ibv.SendSignaled | ibv.SendWrite
	switch op {
	case opRead:
		flags = ibv.SendSignaled | ibv.SendRead
	case opCompareSwap:
		flags = ibv.SendSignaled | ibv.SendCompareSwap
	case opFetchAdd:
		flags = ibv.SendSignaled | ibv.SendFetchAdd
	}
	s.wr[0] = ibv.SendWR{
		ID:         t.wrid(i),
		Addr:       local.base + uint64(lo),
		Len:        uint32(n),
		LKey:       local.lkey,
		Flags:      int32(flags),
		RemoteAddr: key.Addr + off,
		RKey:       key.RKey,
		Compare:    a,
		Swap:       b,
	}
	t.inFlight++
	held := c.postHeld && n <= heldPostBytes
	if !held {
		t.posting++
		c.mu.Unlock()
	}
	err := c.qp.PostSends(s.wr[:])
	if !held {
		c.mu.Lock()
		t.posting--
	}
	if err != nil {
		t.inFlight--
		t.put(i)
		if e := c.oneSidedEnded(); e != nil {
			err = e // the connection ended meanwhile: say so, not how the post failed
		} else {
			// As a failed post of sends does (see postFailed).
			if errors.Is(err, syscall.ENOTCONN) {
				err = syscall.ECONNRESET
			} else {
				c.fail(err)
			}
		}
	}
	c.wakeRelease()
	return i, err
}

// oneSidedDone handles a one-sided operation's completion (mu is held);
// it reports whether the operation was one of ours (complete counts the
// failed ones that were). A failure other than a flush broke the QP: the
// connection fails with it, on both ends.
func (c *Conn) oneSidedDone(wc ibv.WC) bool {
	t := &c.os
	i, ok := t.lookup(wc.WRID)
	if !ok {
		return false
	}
	t.inFlight--
	s := &t.slots[i]
	if wc.Status != ibv.WCSuccess {
		if wc.Status != ibv.WCFlushErr && !c.life.has(shutPeerGone) {
			c.fail(&oneSidedError{wc.Status})
		}
		// A READ the peer refused got its NAK before any of a response;
		// any other failure may have come in the middle of one.
		if s.wr[0].Flags&ibv.SendRead != 0 && wc.Status != ibv.WCRemAccessErr && wc.Status != ibv.WCRemInvReqErr {
			c.readCut = true
		}
	}
	s.status = wc.Status
	if wc.Status == ibv.WCSuccess && s.wr[0].Flags&(ibv.SendCompareSwap|ibv.SendFetchAdd) != 0 {
		// The bounce memory is mapped: it goes only once the QP is
		// gone, after the last completion (see releaseRegions).
		if b := t.bounce; b != nil && b.mem != nil {
			at := atomicAt(i)
			s.old = c.atomics.value(b.mem[at : at+AtomicSize])
		}
	}
	if s.abandoned {
		t.put(i)
		return true
	}
	s.finished = true
	s.done.set()
	return true
}

// oneSidedErr is what a caller gets for a completion's status (mu is
// held): a flushed operation fails with the connection's failure.
func (c *Conn) oneSidedErr(status uint32) error {
	switch status {
	case ibv.WCSuccess:
		return nil
	case ibv.WCFlushErr:
		if c.life.werr != nil {
			return c.life.werr
		}
		if c.life.has(shutClosed) {
			return net.ErrClosed
		}
		return syscall.ECONNRESET
	}
	return &oneSidedError{status}
}

// oneSidedError is a one-sided operation's failed completion.
type oneSidedError struct{ status uint32 }

func (e *oneSidedError) Error() string {
	return "one-sided operation failed: " + wcStatusString(e.status)
}

// Unwrap says what the failure means: the peer refused the access (its
// region revoked, never registered, or not allowing it), which broke the
// connection; or, as for any failed work request, a timeout or a reset.
func (e *oneSidedError) Unwrap() []error {
	switch e.status {
	case ibv.WCRemAccessErr, ibv.WCRemInvReqErr:
		return []error{ErrRemoteAccess, syscall.ECONNRESET}
	case ibv.WCRetryExcErr:
		return []error{syscall.ETIMEDOUT}
	}
	return []error{syscall.ECONNRESET}
}

// waitOneSided waits for slot i's completion, or for ctx: then the slot
// is left to the completion, which frees it (and unpins its region). It
// waits as the connection's Reads and Writes do (Options.Poll): an
// operation takes about a round trip, which spinning catches without a
// wakeup.
//
// It returns an atomic's result: the word's value before.
func (c *Conn) waitOneSided(ctx context.Context, i int) (uint64, error) {
	s := &c.os.slots[i]
	start := c.w.clock()
	c.w.waitDone(ctx, &s.done, c.closing, time.Duration(c.os.avgWait.Load()), start)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !s.finished {
		s.abandoned = true
		return 0, ctx.Err()
	}
	// A moving average, as a Read's (see waiter.wait); concurrent
	// callers may lose each other's updates, which only blurs it.
	if !start.IsZero() {
		c.os.avgWait.Store(int64(nextAvgWait(time.Duration(c.os.avgWait.Load()), time.Since(start))))
	}
	status, old := s.status, s.old
	c.os.put(i)
	return old, c.oneSidedErr(status)
}
