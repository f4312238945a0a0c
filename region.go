package rdma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
)

// One-sided RDMA: regions an application registers on a connection, which
// the peer reads and writes with RDMA READ and WRITE without this side's
// CPU. Nothing is granted unless registered: a connection's only other
// remotely accessible memory is its receive ring (remote write, for the
// protocol's messages).
//
// A region lives in the connection's protection domain (one per
// connection: see arena), so its key is worth something only on that
// connection, whatever another peer guesses. The operations go on the
// connection's QP beside the protocol's messages, each signaled and waited
// for by its caller through a slot of the connection's table (oneSided),
// which bounds how many are in flight and reserves their send queue
// entries and completions (layout.cqEntries).

// Access says what the peer may do to a Region through its RemoteKey.
type Access uint8

// Access rights a region may grant; a Region with neither is local: it is
// the target or source of ReadAtContext and WriteAtContext only.
const (
	RemoteRead  Access = 1 << iota // the peer may read it (RDMA READ)
	RemoteWrite                    // the peer may write it (RDMA WRITE)
)

const accessMask = RemoteRead | RemoteWrite

func (a Access) String() string {
	switch a {
	case 0:
		return "local"
	case RemoteRead:
		return "read"
	case RemoteWrite:
		return "write"
	case RemoteRead | RemoteWrite:
		return "read|write"
	}
	return fmt.Sprintf("Access(%#x)", uint8(a))
}

// ErrRemoteAccess is wrapped by the error of a one-sided read or write the
// peer's region does not allow: refused before posting when the key lacks
// the access, or by the peer's NIC when the region was revoked (closed),
// never registered on this connection, or does not allow it. A refusal by
// the NIC also breaks the connection (RC queue pairs go to the error state
// on either side): the error then wraps syscall.ECONNRESET as well, and
// every later call on either end of the connection fails.
var ErrRemoteAccess = errors.New("rdma: the peer's region does not allow this access")

// ErrOutOfBounds is wrapped by the error of a one-sided operation whose
// offset and length fall outside the local region or the peer's (as its
// key says), checked before anything is posted.
var ErrOutOfBounds = errors.New("rdma: offset and length outside the region")

// Limits of regions and operations.
const (
	// MaxRegionSize is the largest region RegisterRegion takes.
	MaxRegionSize = 1 << 40
	// MaxTransfer is the most bytes one ReadAtContext or WriteAtContext
	// moves (one work request; RC allows 2 GiB).
	MaxTransfer = 1 << 30
)

// RemoteKey names a peer's region: what the peer needs to read or write
// it. The owner sends it to the peer over the connection itself
// (MarshalBinary); the peer passes it to Conn.Remote. It is good on that
// connection only, and only until the owner closes the region.
type RemoteKey struct {
	Addr   uint64 // the region's first byte, as the owner's NIC knows it
	Size   uint64 // its length
	RKey   uint32 // the NIC's remote key
	Access Access // what it allows
}

const (
	remoteKeyMagic   = 0x4756524b // "GVRK"
	remoteKeyVersion = 1
	// RemoteKeyLen is the length of a marshaled RemoteKey.
	RemoteKeyLen = 28
)

// AppendBinary appends the key's encoding (RemoteKeyLen bytes: a magic, a
// version, the access and the fields, big-endian) to b.
func (k RemoteKey) AppendBinary(b []byte) ([]byte, error) {
	if err := k.validate(); err != nil {
		return b, err
	}
	b = binary.BigEndian.AppendUint32(b, remoteKeyMagic)
	b = append(b, remoteKeyVersion, byte(k.Access), 0, 0)
	b = binary.BigEndian.AppendUint64(b, k.Addr)
	b = binary.BigEndian.AppendUint64(b, k.Size)
	return binary.BigEndian.AppendUint32(b, k.RKey), nil
}

// MarshalBinary encodes the key (see AppendBinary).
func (k RemoteKey) MarshalBinary() ([]byte, error) {
	return k.AppendBinary(make([]byte, 0, RemoteKeyLen))
}

// UnmarshalBinary decodes a key of exactly RemoteKeyLen bytes and checks
// it: magic, version, reserved bytes, an access of at least one known
// right, a size of 1 to MaxRegionSize bytes that does not wrap the address
// space. It leaves k unchanged on error.
func (k *RemoteKey) UnmarshalBinary(b []byte) error {
	if len(b) != RemoteKeyLen {
		return fmt.Errorf("rdma: remote key of %d bytes, want %d", len(b), RemoteKeyLen)
	}
	if m := binary.BigEndian.Uint32(b); m != remoteKeyMagic {
		return fmt.Errorf("rdma: remote key with bad magic %#x", m)
	}
	if b[4] != remoteKeyVersion {
		return fmt.Errorf("rdma: remote key version %d, want %d", b[4], remoteKeyVersion)
	}
	if b[6] != 0 || b[7] != 0 {
		return errors.New("rdma: remote key with reserved bytes set")
	}
	nk := RemoteKey{
		Access: Access(b[5]),
		Addr:   binary.BigEndian.Uint64(b[8:]),
		Size:   binary.BigEndian.Uint64(b[16:]),
		RKey:   binary.BigEndian.Uint32(b[24:]),
	}
	if err := nk.validate(); err != nil {
		return err
	}
	*k = nk
	return nil
}

// validate checks what a key must be to name a region at all.
func (k RemoteKey) validate() error {
	switch {
	case k.Access == 0 || k.Access&^accessMask != 0:
		return fmt.Errorf("rdma: remote key with access %v", k.Access)
	case k.Size == 0 || k.Size > MaxRegionSize:
		return fmt.Errorf("rdma: remote key of size %d outside [1, %d]", k.Size, uint64(MaxRegionSize))
	case k.Addr > ^uint64(0)-k.Size:
		return fmt.Errorf("rdma: remote key at %#x of %d bytes wraps the address space", k.Addr, k.Size)
	}
	return nil
}

// inBounds reports whether n bytes at off lie within size bytes.
func inBounds(off int64, n int, size uint64) bool {
	return off >= 0 && n >= 0 && uint64(off) <= size && uint64(n) <= size-uint64(off)
}

// Region is memory this library allocated (mmap'd, outside the Go heap)
// and registered on one connection: the peer reads or writes it as its
// Access allows, through its Key, and the local side moves data between it
// and the peer's regions with RemoteRegion's ReadAtContext and
// WriteAtContext. Close revokes it. Closing the connection closes its
// regions.
type Region struct {
	c      *Conn
	mem    []byte // the whole mapping (whole pages); nil once freed
	size   int
	access Access
	key    RemoteKey
	base   uint64
	lkey   uint32
	sys    regionSys

	// Under c.mu.
	pins     int           // one-sided operations in flight that use it
	closed   bool          // Close was called, or the connection released it
	unpinned chan struct{} // capacity 1: pins reached zero

	freeOnce sync.Once
}

// Bytes returns the region's memory: the peer's RDMA WRITEs land there
// and its READs read from there, with no synchronization but the
// application's own (say, a message over the connection once a block is
// written). The slice must not be used after Close, which unmaps it.
func (r *Region) Bytes() []byte {
	if r == nil || r.c == nil {
		return nil
	}
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if r.closed {
		return nil
	}
	return r.mem[:r.size:r.size]
}

// Len returns the region's size in bytes.
func (r *Region) Len() int {
	if r == nil {
		return 0
	}
	return r.size
}

// Access returns what the region grants the peer.
func (r *Region) Access() Access {
	if r == nil {
		return 0
	}
	return r.access
}

// Key returns what the peer needs to access the region (see RemoteKey);
// for a region that grants nothing, a key no peer can use (Access 0).
func (r *Region) Key() RemoteKey {
	if r == nil {
		return RemoteKey{}
	}
	return r.key
}

// Close revokes the region: once it returns, the peer's accesses fail (and
// break the connection: see ErrRemoteAccess) and the memory is unmapped.
// It waits for the local operations in flight that use the region, even
// those whose caller gave up on its context, to complete first. Closing a
// region again, or one its connection's Close closed, returns an error
// wrapping net.ErrClosed.
func (r *Region) Close() error {
	if r == nil || r.c == nil {
		return errInvalid("close")
	}
	c := r.c
	c.mu.Lock()
	if r.closed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	r.closed = true
	// Operations in flight complete: the peer answers, or the
	// connection fails and its queue is flushed. Once the teardown has
	// drained the QP, nothing uses the region any more.
	for r.pins > 0 && !c.life.has(shutQPGone) {
		c.mu.Unlock()
		select {
		case <-r.unpinned:
		case <-time.After(50 * time.Millisecond):
		}
		c.mu.Lock()
	}
	c.mu.Unlock()
	r.free()
	return nil
}

// free deregisters and unmaps the region, once: by Close, or by the
// connection's release.
func (r *Region) free() {
	r.freeOnce.Do(func() {
		r.c.freeRegion(r)
		r.c.mu.Lock()
		r.closed = true
		r.mem = nil
		r.c.os.forget(r)
		r.c.mu.Unlock()
	})
}

// RegisterRegion allocates size bytes (zeroed, outside the Go heap) and
// registers them on the connection with exactly the access given: the peer
// may read (RemoteRead) or write (RemoteWrite) them through the region's
// Key, and nothing else. A region with access 0 is for this side's
// ReadAtContext and WriteAtContext only. The memory counts as the
// connection's registered memory (and against RLIMIT_MEMLOCK).
func (c *Conn) RegisterRegion(size int, access Access) (*Region, error) {
	if !c.ok() {
		return nil, errInvalid("register")
	}
	if size <= 0 || size > MaxRegionSize {
		return nil, c.opErr("register", fmt.Errorf("rdma: region size %d outside [1, %d]: %w", size, MaxRegionSize, syscall.EINVAL))
	}
	if access&^accessMask != 0 {
		return nil, c.opErr("register", fmt.Errorf("rdma: unknown access %v: %w", access, syscall.EINVAL))
	}
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.mu.Lock()
	err := c.oneSidedEnded()
	c.mu.Unlock()
	if err != nil {
		return nil, c.opErr("register", err)
	}
	r, err := c.registerMem(size, access)
	if err != nil {
		return nil, c.opErr("register", err)
	}
	c.mu.Lock()
	c.os.regions = append(c.os.regions, r)
	c.mu.Unlock()
	return r, nil
}

// RemoteRegion is a peer's region as this side reads and writes it: an
// io.ReaderAt and io.WriterAt over the connection. Its methods may be
// called from several goroutines at once.
type RemoteRegion struct {
	c   *Conn
	key RemoteKey
}

var (
	_ io.ReaderAt = (*RemoteRegion)(nil)
	_ io.WriterAt = (*RemoteRegion)(nil)
)

// Remote returns the peer's region that key names. The key is checked
// (see RemoteKey.UnmarshalBinary) when it is used.
func (c *Conn) Remote(key RemoteKey) *RemoteRegion { return &RemoteRegion{c: c, key: key} }

// Key returns the key the region was made from.
func (r *RemoteRegion) Key() RemoteKey { return r.key }

// Size returns the region's length, as its key says.
func (r *RemoteRegion) Size() int64 { return int64(r.key.Size) }

// ReadAt reads len(p) bytes of the peer's region at off into p, through
// registered memory of the connection (up to 256 KiB in flight per call),
// as io.ReaderAt: past the region's end it reads what there is and
// returns io.EOF. It returns once the bytes are in p, or the connection
// fails or is closed. For large blocks, ReadAtContext into a registered
// region avoids the copy.
func (r *RemoteRegion) ReadAt(p []byte, off int64) (int, error) {
	c := r.c
	if !c.ok() {
		return 0, errInvalid("read")
	}
	if off < 0 {
		return 0, c.opErr("read", ErrOutOfBounds)
	}
	if err := r.check(RemoteRead); err != nil {
		return 0, c.opErr("read", err)
	}
	if uint64(off) >= r.key.Size {
		return 0, io.EOF
	}
	want := len(p)
	if uint64(want) > r.key.Size-uint64(off) {
		want = int(r.key.Size - uint64(off))
	}
	n, err := c.bounceIO(opRead, p[:want], r.key, uint64(off))
	if err != nil {
		return n, c.opErr("read", err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes p to the peer's region at off, through registered memory
// of the connection, as io.WriterAt. A write that would pass the region's
// end writes nothing and fails with ErrOutOfBounds. It returns once the
// peer's NIC has acknowledged the bytes (they are in the peer's memory;
// the peer learns of them only if told).
func (r *RemoteRegion) WriteAt(p []byte, off int64) (int, error) {
	c := r.c
	if !c.ok() {
		return 0, errInvalid("write")
	}
	if err := r.check(RemoteWrite); err != nil {
		return 0, c.opErr("write", err)
	}
	if !inBounds(off, len(p), r.key.Size) {
		return 0, c.opErr("write", ErrOutOfBounds)
	}
	n, err := c.bounceIO(opWrite, p, r.key, uint64(off))
	return n, c.opErr("write", err)
}

// ReadAtContext reads n bytes of the peer's region at off straight into
// dst at dstOff (one RDMA READ, no copy). dst must be a region of the
// same connection. If ctx is done first it returns ctx's error at once
// (os.ErrDeadlineExceeded for a deadline, as net does); the read cannot be
// recalled, so dst's bytes are undefined until it completes, and Close of
// dst waits for that.
func (r *RemoteRegion) ReadAtContext(ctx context.Context, dst *Region, dstOff int64, n int, off int64) error {
	return r.oneSided(ctx, opRead, dst, dstOff, n, off)
}

// WriteAtContext writes n bytes of src at srcOff into the peer's region at
// off (one RDMA WRITE, no copy), and returns once the peer's NIC has
// acknowledged them. src must be a region of the same connection, and its
// bytes must not change until then. Cancellation is as ReadAtContext's.
func (r *RemoteRegion) WriteAtContext(ctx context.Context, src *Region, srcOff int64, n int, off int64) error {
	return r.oneSided(ctx, opWrite, src, srcOff, n, off)
}

func (r *RemoteRegion) oneSided(ctx context.Context, op uint8, local *Region, localOff int64, n int, off int64) error {
	c := r.c
	name := opName(op)
	if !c.ok() {
		return errInvalid(name)
	}
	need := RemoteRead
	if op == opWrite {
		need = RemoteWrite
	}
	if err := r.check(need); err != nil {
		return c.opErr(name, err)
	}
	if local == nil || local.c != c {
		return c.opErr(name, fmt.Errorf("rdma: the local region is not one of this connection's: %w", syscall.EINVAL))
	}
	if n > MaxTransfer || !inBounds(localOff, n, uint64(local.size)) || !inBounds(off, n, r.key.Size) {
		return c.opErr(name, ErrOutOfBounds)
	}
	if err := ctx.Err(); err != nil {
		return c.opErr(name, mapCtxErr(err))
	}
	if n == 0 {
		return nil
	}
	slot, err := c.startOneSided(ctx, op, local, int(localOff), n, r.key, uint64(off))
	if err == nil {
		err = c.waitOneSided(ctx, slot)
	}
	return c.opErr(name, mapCtxErr(err))
}

// check refuses, before posting, a key that names no region or lacks the
// access.
func (r *RemoteRegion) check(need Access) error {
	if err := r.key.validate(); err != nil {
		return err
	}
	if r.key.Access&need == 0 {
		return fmt.Errorf("%w: the key grants %v access, not %v", ErrRemoteAccess, r.key.Access, need)
	}
	return nil
}

// One-sided operations.
const (
	opRead  = 1
	opWrite = 2
)

func opName(op uint8) string {
	if op == opRead {
		return "read"
	}
	return "write"
}

// oneSidedDepth is the most one-sided operations a connection has in
// flight; more wait for a slot.
const oneSidedDepth = 16

// Bounce memory of ReadAt and WriteAt: bounceChunks chunks of
// bounceChunk bytes, registered (local access only) on first use.
const (
	bounceChunk  = 64 << 10
	bounceChunks = 4
)

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
	reg       *Region       // pinned until the completion
	done      chan struct{} // capacity 1: the completion arrived
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

	chunkRoom chan struct{} // capacity 1: a bounce chunk came back
	avgWait   atomic.Int64  // moving average of the waits, in ns (see waitOneSided)

	regions    []*Region
	bounce     *Region
	chunksFree []int // free bounce chunks
	chunksOut  int   // bounce chunks held by callers
}

func (t *oneSided) init() {
	if t.room != nil {
		return
	}
	t.room = make(chan struct{}, 1)
	t.chunkRoom = make(chan struct{}, 1)
	t.free = make([]uint8, 0, oneSidedDepth)
	for i := range t.slots {
		t.slots[i].done = make(chan struct{}, 1)
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
	return i, true
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
	signal(t.room)
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
// the bounds, once a slot is free, and returns the slot.
func (c *Conn) startOneSided(ctx context.Context, op uint8, local *Region, lo, n int, key RemoteKey, off uint64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &c.os
	t.init()
	var i int
	for {
		if err := c.oneSidedEnded(); err != nil {
			return 0, err
		}
		if local.closed {
			return 0, net.ErrClosed
		}
		var ok bool
		if i, ok = t.get(); ok {
			break
		}
		c.mu.Unlock()
		select {
		case <-t.room:
		case <-c.closing:
		case <-ctx.Done():
			c.mu.Lock()
			return 0, ctx.Err()
		}
		c.mu.Lock()
	}
	if len(t.free) > 0 {
		signal(t.room) // another waiter may take the next one
	}
	s := &t.slots[i]
	s.reg = local
	local.pins++
	flags := ibv.SendSignaled | ibv.SendWrite
	if op == opRead {
		flags = ibv.SendSignaled | ibv.SendRead
	}
	s.wr[0] = ibv.SendWR{
		ID:         t.wrid(i),
		Addr:       local.base + uint64(lo),
		Len:        uint32(n),
		LKey:       local.lkey,
		Flags:      int32(flags),
		RemoteAddr: key.Addr + off,
		RKey:       key.RKey,
	}
	t.inFlight++
	t.posting++
	c.mu.Unlock()
	err := c.qp.PostSends(s.wr[:])
	c.mu.Lock()
	t.posting--
	if err != nil {
		t.inFlight--
		t.put(i)
	}
	if c.life.phase == phaseDead {
		signal(c.drained)
	}
	return i, err
}

// waitOneSided waits for slot i's completion, or for ctx: then the slot
// is left to the completion, which frees it (and unpins its region). It
// waits as the connection's Reads and Writes do (Options.Poll): an
// operation takes about a round trip, which spinning catches without a
// wakeup.
func (c *Conn) waitOneSided(ctx context.Context, i int) error {
	s := &c.os.slots[i]
	start := time.Now()
	switch c.w.mode {
	case PollBusy:
		c.spinOneSided(ctx, s.done, -1)
	case PollAdaptive:
		budget := c.w.spinTime
		if avg := time.Duration(c.os.avgWait.Load()); avg < maxAdaptiveSpin {
			budget = max(budget, 2*avg)
		}
		c.spinOneSided(ctx, s.done, budget)
	}
	select {
	case <-s.done:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !s.finished {
		s.abandoned = true
		return ctx.Err()
	}
	select {
	case <-s.done: // when ctx won the race with a completion
	default:
	}
	// A moving average, as a Read's (see waiter.wait); concurrent
	// callers may lose each other's updates, which only blurs it.
	avg := time.Duration(c.os.avgWait.Load())
	c.os.avgWait.Store(int64(avg + (min(time.Since(start), 2*maxAdaptiveSpin)-avg)/8))
	status := s.status
	c.os.put(i)
	return c.oneSidedErr(status)
}

// spinOneSided polls the completion queue until done is signaled, ctx is
// done, the connection closes or, with a budget of zero or more, the
// budget passes. It looks at the clock and yields to the process's other
// goroutines less often than waiter.spin: an operation's completion
// follows its post within a round trip, which polls in a tighter loop
// catch sooner (in the test bed, 4 KiB READs' median fell by 10-40 %).
func (c *Conn) spinOneSided(ctx context.Context, done chan struct{}, budget time.Duration) {
	c.w.sp.spinStart()
	defer c.w.sp.spinEnd()
	start := time.Now()
	for i := 1; len(done) == 0; i++ {
		c.w.sp.tryPoll()
		if i%oneSidedSpinCheck == 0 {
			if (budget >= 0 && time.Since(start) > budget) || ctx.Err() != nil || isClosed(c.closing) {
				return
			}
			runtime.Gosched()
		}
	}
}

// oneSidedSpinCheck is how many polls a one-sided wait makes between looks
// at the clock and yields.
const oneSidedSpinCheck = 64

// oneSidedDone handles a one-sided operation's completion (mu is held).
// A failure other than a flush broke the QP: the connection fails with
// it, on both ends.
func (c *Conn) oneSidedDone(wc ibv.WC) {
	t := &c.os
	i, ok := t.lookup(wc.WRID)
	if !ok {
		return
	}
	t.inFlight--
	if wc.Status != ibv.WCSuccess {
		c.countFailed(wc.Status)
		if wc.Status != ibv.WCFlushErr && !c.life.has(shutPeerGone) {
			c.fail(&oneSidedError{wc.Status})
		}
	}
	s := &t.slots[i]
	s.status = wc.Status
	if s.abandoned {
		t.put(i)
		return
	}
	s.finished = true
	signal(s.done)
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

// bounceIO reads (op opRead) the peer's bytes at off into p, or writes p
// there, through the connection's bounce memory: up to bounceChunks
// chunks in flight, completed in order. It returns how many bytes from
// the start of p were moved.
func (c *Conn) bounceIO(op uint8, p []byte, key RemoteKey, off uint64) (int, error) {
	type pending struct{ slot, chunk, pos, n int }
	var q [bounceChunks]pending
	head, cnt := 0, 0
	done, pos := 0, 0
	var firstErr error
	bg := context.Background()
	for {
		if pos < len(p) && firstErr == nil && cnt < bounceChunks {
			// Block for a chunk only with nothing of ours in flight:
			// callers that hold chunks never wait for each other.
			chunk, err := c.getChunk(cnt == 0)
			if err != nil {
				firstErr = err
				continue
			}
			if chunk >= 0 {
				k := min(bounceChunk, len(p)-pos)
				at := chunk * bounceChunk
				if op == opWrite {
					copy(c.os.bounce.mem[at:at+k], p[pos:pos+k])
				}
				slot, err := c.startOneSided(bg, op, c.os.bounce, at, k, key, off+uint64(pos))
				if err != nil {
					c.putChunk(chunk)
					firstErr = err
					continue
				}
				q[(head+cnt)%bounceChunks] = pending{slot, chunk, pos, k}
				cnt++
				pos += k
				continue
			}
		}
		if cnt == 0 {
			return done, firstErr
		}
		e := q[head]
		head = (head + 1) % bounceChunks
		cnt--
		err := c.waitOneSided(bg, e.slot)
		if err == nil && firstErr == nil {
			if op == opRead {
				at := e.chunk * bounceChunk
				copy(p[e.pos:e.pos+e.n], c.os.bounce.mem[at:at+e.n])
			}
			done += e.n
		} else if firstErr == nil {
			firstErr = err
		}
		c.putChunk(e.chunk)
	}
}

// getChunk takes a free bounce chunk, registering the bounce memory on
// first use; with wait unset it returns -1 when none is free instead of
// waiting.
func (c *Conn) getChunk(wait bool) (int, error) {
	c.regMu.Lock()
	c.mu.Lock()
	c.os.init()
	if err := c.oneSidedEnded(); err != nil {
		c.mu.Unlock()
		c.regMu.Unlock()
		return -1, err
	}
	if c.os.bounce == nil {
		c.mu.Unlock()
		b, err := c.registerMem(bounceChunks*bounceChunk, 0)
		if err != nil {
			c.regMu.Unlock()
			return -1, err
		}
		c.mu.Lock()
		c.os.bounce = b
		c.os.chunksFree = make([]int, 0, bounceChunks)
		for i := bounceChunks - 1; i >= 0; i-- {
			c.os.chunksFree = append(c.os.chunksFree, i)
		}
	}
	c.regMu.Unlock()
	defer c.mu.Unlock()
	for {
		if err := c.oneSidedEnded(); err != nil {
			return -1, err
		}
		if n := len(c.os.chunksFree); n > 0 {
			i := c.os.chunksFree[n-1]
			c.os.chunksFree = c.os.chunksFree[:n-1]
			c.os.chunksOut++
			if n > 1 {
				signal(c.os.chunkRoom) // another waiter may take the next one
			}
			return i, nil
		}
		if !wait {
			return -1, nil
		}
		c.mu.Unlock()
		select {
		case <-c.os.chunkRoom:
		case <-c.closing:
		}
		c.mu.Lock()
	}
}

// putChunk gives a bounce chunk back.
func (c *Conn) putChunk(i int) {
	c.mu.Lock()
	c.os.chunksFree = append(c.os.chunksFree, i)
	c.os.chunksOut--
	signal(c.os.chunkRoom)
	if c.life.phase == phaseDead {
		signal(c.drained)
	}
	c.mu.Unlock()
}
