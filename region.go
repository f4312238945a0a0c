package rdma

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"syscall"
	"time"
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

// Access rights a region may grant; a Region with none is local: it is
// the target or source of ReadAtContext and WriteAtContext only.
const (
	RemoteRead  Access = 1 << iota // the peer may read it (RDMA READ)
	RemoteWrite                    // the peer may write it (RDMA WRITE)
	// RemoteAtomic lets the peer apply remote atomics to its 8-byte
	// words (RemoteRegion.CompareAndSwap and FetchAdd). Devices without
	// them (soft-iWARP) refuse it.
	RemoteAtomic
)

const accessMask = RemoteRead | RemoteWrite | RemoteAtomic

// String returns "local", or the rights joined by "|": "read", "write",
// "atomic", as in "read|write".
func (a Access) String() string {
	if a == 0 {
		return "local"
	}
	if a&^accessMask != 0 {
		return fmt.Sprintf("Access(%#x)", uint8(a))
	}
	var b []byte
	for _, r := range [...]struct {
		a    Access
		name string
	}{{RemoteRead, "read"}, {RemoteWrite, "write"}, {RemoteAtomic, "atomic"}} {
		if a&r.a != 0 {
			if len(b) > 0 {
				b = append(b, '|')
			}
			b = append(b, r.name...)
		}
	}
	return string(b)
}

// Limits of regions and operations.
const (
	// MaxRegionSize is the largest region RegisterRegion takes: 1 TiB,
	// or the largest int where that is smaller (32-bit platforms).
	MaxRegionSize = min(maxRemoteRegion, math.MaxInt)
	// MaxTransfer is the most bytes one ReadAtContext or WriteAtContext
	// moves (one work request; RC allows 2 GiB).
	MaxTransfer = 1 << 30

	// maxRemoteRegion is the largest region a peer's key may name: what
	// a 64-bit peer registers at most, whatever this platform's int.
	maxRemoteRegion = 1 << 40
)

// inBounds reports whether n bytes at off lie within size bytes.
func inBounds(off int64, n int, size uint64) bool {
	return off >= 0 && n >= 0 && uint64(off) <= size && uint64(n) <= size-uint64(off)
}

// Region is memory registered on one connection for one-sided RDMA;
// Conn.RegisterRegion allocates one, outside the Go heap. The peer reads
// or writes it, as its Access allows, through its Key; this side moves
// data between it and the peer's regions with RemoteRegion.ReadAtContext
// and WriteAtContext. Close revokes it and unmaps its memory.
//
// Only Close gives the memory back. The connection's end (its Close, a
// failure, the device's removal) revokes the region but leaves it mapped:
// the application may still hold the slice Bytes returned, and memory
// unmapped under it would fault the next time it is used, which kills the
// process.
type Region struct {
	c      *Conn
	mem    []byte // the whole mapping (whole pages); nil once unmapped
	size   int
	access Access
	key    RemoteKey
	base   uint64
	lkey   uint32
	sys    regionSys

	// Under c.mu.
	pins       int           // one-sided operations in flight that use it
	closed     bool          // revoked or being closed: no operation starts on it
	closing    bool          // Close was called
	revokeErr  error         // the deregistration's failure
	unpinned   chan struct{} // capacity 1: pins reached zero
	revokeOnce sync.Once
	share      *regionShare // set once its mapping is shared (ShareRegion); under c.mu
}

// Bytes returns the region's memory: the peer's RDMA WRITEs land there
// and its READs read from there, with no synchronization but the
// application's own (say, a message over the connection once a block is
// written). The memory stays mapped until Close, even once the
// connection is over (its last contents stay readable then); the slice
// must not be used after Close, which unmaps it. Once Close is called,
// Bytes returns nil.
func (r *Region) Bytes() []byte {
	if r == nil || r.c == nil {
		return nil
	}
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if r.closing || r.mem == nil {
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

// Close revokes the region and unmaps its memory: once it returns, the
// peer's accesses fail (and break the connection: see ErrRemoteAccess),
// and the slice Bytes returned must not be used. It waits for the local
// operations in flight that use the region, even those whose caller gave
// up on its context, to complete first. A region whose connection is over
// is revoked already: Close unmaps its memory, which only Close does (see
// Region). Closing a region again returns an error wrapping
// net.ErrClosed. Should the deregistration fail (an *os.SyscallError
// naming ibv_dereg_mr), the NIC may still use the memory, which then
// stays mapped.
func (r *Region) Close() error {
	if r == nil || r.c == nil {
		return errInvalid("close")
	}
	c := r.c
	c.mu.Lock()
	if r.closing {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	r.closing, r.closed = true, true
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
	if err := r.revoke(); err != nil {
		return c.opErr("close", err)
	}
	c.mu.Lock()
	mem := r.mem
	r.mem = nil
	c.mu.Unlock()
	if r.share.drop() {
		unmapMem(mem)
	}
	return nil
}

// revoke deregisters the region, once, by Close or by the connection's
// release: the NIC's access to it ends (the peer's accesses fail), and
// no operation starts on it any more. Its memory stays mapped.
func (r *Region) revoke() error {
	r.revokeOnce.Do(func() {
		c := r.c
		err := c.deregRegion(r)
		c.mu.Lock()
		r.closed, r.revokeErr = true, err
		if err == nil {
			c.st.RegisteredBytes -= r.size
		}
		c.os.forget(r)
		c.mu.Unlock()
	})
	return r.revokeErr
}

// releaseRegions revokes every region and the bounce memory once the QP
// is gone (nothing can use them any more), before the arena's PD goes to
// the next connection. The regions' memory stays mapped until their
// Close (see Region); the bounce memory's until no caller holds a chunk
// of it (see bounce.go).
func (c *Conn) releaseRegions() {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.mu.Lock()
	c.abortOneSided()
	regs := append([]*Region(nil), c.os.regions...)
	b := c.os.bounce
	c.mu.Unlock()
	for _, r := range regs {
		r.revoke()
	}
	if b != nil {
		b.revoke()
		c.mu.Lock()
		c.os.bounceGone = true
		mem := c.takeBounceMem()
		c.mu.Unlock()
		unmapMem(mem)
	}
}

// RegisterRegion allocates size bytes (zeroed, outside the Go heap) and
// registers them on the connection with exactly the access given: the peer
// may read (RemoteRead), write (RemoteWrite) or apply atomics to
// (RemoteAtomic) them through the region's Key, and nothing else; a
// device without remote atomics refuses RemoteAtomic with an error
// wrapping ErrUnsupported. A region with access 0 is for this side's
// ReadAtContext and WriteAtContext only. The memory counts as the
// connection's registered memory (and against RLIMIT_MEMLOCK) while it is
// registered. Only the region's Close gives the memory back: the end of
// the connection revokes the region but leaves it mapped (see Region).
func (c *Conn) RegisterRegion(size int, access Access) (*Region, error) {
	if !c.ok() {
		return nil, errInvalid("register")
	}
	if size <= 0 || size > MaxRegionSize {
		return nil, c.opErr("register", fmt.Errorf("rdma: region size %d outside [1, %d]: %w", size, MaxRegionSize, syscall.EINVAL))
	}
	r, err := c.register(size, access, nil)
	if err != nil {
		return nil, c.opErr("register", err)
	}
	return r, nil
}

// ShareRegion registers the memory of r, a region of another connection
// (or of this one), on this connection as well, with access, and returns
// the region that names it here: the same bytes, a key of this
// connection's, its own rights. That is how several peers reach one
// counter, lock or table: each through its own connection, and the word
// changes for all of them (atomics on it are atomic across connections of
// the same device). Each region revokes only its own registration when
// closed; the memory is unmapped when the last region sharing it is
// closed. r must not be closed; access is checked as RegisterRegion's.
func (c *Conn) ShareRegion(r *Region, access Access) (*Region, error) {
	if !c.ok() {
		return nil, errInvalid("register")
	}
	if r == nil || r.c == nil {
		return nil, c.opErr("register", fmt.Errorf("rdma: no region to share: %w", syscall.EINVAL))
	}
	mem, err := r.shareMapping()
	if err != nil {
		return nil, c.opErr("register", err)
	}
	nr, err := c.register(r.size, access, mem)
	if err != nil {
		if r.share.drop() {
			unmapMem(mem)
		}
		return nil, c.opErr("register", err)
	}
	c.mu.Lock()
	nr.share = r.share
	c.mu.Unlock()
	return nr, nil
}

// register checks access and registers size bytes with it: new memory,
// or the mapping shared.
func (c *Conn) register(size int, access Access, shared []byte) (*Region, error) {
	if access&^accessMask != 0 {
		return nil, fmt.Errorf("rdma: unknown access %v: %w", access, syscall.EINVAL)
	}
	if access&RemoteAtomic != 0 {
		if err := c.atomics.supported(); err != nil {
			return nil, err
		}
	}
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.mu.Lock()
	err := c.oneSidedEnded()
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	r, err := c.registerMem(size, access, shared)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.os.regions = append(c.os.regions, r)
	c.mu.Unlock()
	return r, nil
}

// regionShare counts the regions that share a mapping (ShareRegion): the
// last one closed unmaps it.
type regionShare struct {
	mu   sync.Mutex
	refs int
}

// shareMapping takes a reference to r's mapping for another region, as
// long as r is not closed.
func (r *Region) shareMapping() ([]byte, error) {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if r.closing || r.mem == nil {
		return nil, fmt.Errorf("rdma: the region to share is closed: %w", net.ErrClosed)
	}
	if r.share == nil {
		r.share = &regionShare{refs: 1}
	}
	r.share.mu.Lock()
	r.share.refs++
	r.share.mu.Unlock()
	return r.mem, nil
}

// drop gives a reference back and reports whether it was the last (or
// the mapping was never shared): then the caller unmaps the memory.
func (s *regionShare) drop() bool {
	if s == nil {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refs--
	return s.refs == 0
}

// RemoteRegion is a peer's region as this side reads and writes it: an
// io.ReaderAt and io.WriterAt over the connection. Conn.Remote returns one
// for the RemoteKey the peer sent. Its methods may be called from several
// goroutines at once.
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
//
// On iWARP an RDMA READ's response is written into the reader's memory
// under a key the READ names, so a region ReadAtContext reads into (and
// the connection's memory ReadAt reads through) allows the peer remote
// writes while it is registered. That is the transport's rule, not this
// package's: keep data the peer must not change out of the regions
// ReadAtContext reads into.
func (r *RemoteRegion) ReadAtContext(ctx context.Context, dst *Region, dstOff int64, n int, off int64) error {
	return r.oneSided(ctx, opRead, dst, dstOff, n, off)
}

// WriteAtContext writes n bytes of src at srcOff into the peer's region at
// off (one RDMA WRITE, no copy), and returns once the peer's NIC has
// acknowledged them (on iWARP, once they are on the wire: they land at the
// peer a moment later, before anything sent after). src must be a region
// of the same connection, and its
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
	slot, err := c.startOneSided(ctx, op, local, int(localOff), n, r.key, uint64(off), 0, 0)
	if err == nil {
		_, err = c.waitOneSided(ctx, slot)
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
