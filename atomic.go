package rdma

import (
	"context"
	"encoding/binary"
	"fmt"
	"syscall"

	"github.com/goverbs/rdma/internal/ibv"
)

// Remote atomics: 8-byte compare-and-swap and fetch-and-add on a peer's
// region, which the peer's NIC performs without the peer's CPU. They go
// through the one-sided slot table (onesided.go) as READs and WRITEs do,
// count against the same depth (an atomic takes one of the READ
// resources the connection negotiated, see readDepth), and their old
// value lands in the connection's bounce memory (bounce.go), 8 bytes per
// slot, from where the completion copies it into the slot.

// AtomicSize is the size, and the alignment, of the word a remote atomic
// operates on.
const AtomicSize = 8

// atomicCaps is what a device offers of remote atomics.
type atomicCaps struct {
	device string // its name, for errors
	// level is the device's atomicity (ibv_device_attr.atomic_cap):
	// none, against its own operations only (HCA), or against the
	// host's CPUs as well (global).
	level int
	// replyBE: the device returns an atomic's old value big-endian
	// whatever the host's order (see replyBigEndian).
	replyBE bool
}

// supported reports, when the device has no remote atomics, the error
// that says so.
func (a atomicCaps) supported() error {
	if a.level != ibv.AtomicNone {
		return nil
	}
	name := a.device
	if name == "" {
		name = "the device"
	}
	return fmt.Errorf("rdma: %s has no remote atomics (its atomic_cap is IBV_ATOMIC_NONE): %w", name, ErrUnsupported)
}

// value reads an atomic's old value as the NIC left it in b.
func (a atomicCaps) value(b []byte) uint64 {
	if a.replyBE {
		return binary.BigEndian.Uint64(b)
	}
	return binary.NativeEndian.Uint64(b)
}

// replyBigEndian reports whether a device returns the old value of an
// atomic in network order on every host: Mellanox's ConnectX-3 family
// (mlx4), whose extended verbs said so (IBV_EXP_ATOMIC_HCA_REPLY_BE) and
// for which libfabric's verbs provider converts. The word itself is in
// the host's order there as everywhere; only the reply is swapped.
func replyBigEndian(vendor, part uint32) bool {
	const mellanox = 0x02c9
	if vendor != mellanox || isBigEndian() {
		return false
	}
	switch part {
	case 4099, 4100, 4103, 4104: // ConnectX-3 and ConnectX-3 Pro, and their virtual functions
		return true
	}
	return false
}

func isBigEndian() bool {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], 1)
	return b[0] == 0
}

// CompareAndSwap compares the 8-byte word at off in the peer's region
// with old and, if they are equal, replaces it with new, as one atomic
// operation of the peer's NIC; it returns the word's value before, so
// the swap happened exactly when prev == old. The key must grant
// RemoteAtomic, and off must name a word wholly inside the region at an
// address that is a multiple of 8 (checked before anything is posted:
// ErrOutOfBounds, or an error saying "8-byte aligned"). The word is read
// and written in the owner's byte order: its owner sees the value with
// binary.NativeEndian in Region.Bytes.
//
// Atomicity is the device's (see docs/operations.md): against the other
// atomics on the word, from any peer; on most NICs and Soft-RoCE not
// against the owner's CPU, which must leave the word alone while peers
// use it. A device without remote atomics (soft-iWARP) fails it with an
// error wrapping ErrUnsupported. Deadlines and cancellation are as
// ReadAtContext's: ctx's end returns at once, and the operation, which
// cannot be recalled, may still take effect.
func (r *RemoteRegion) CompareAndSwap(ctx context.Context, off int64, old, new uint64) (prev uint64, err error) {
	return r.atomic(ctx, opCompareSwap, off, old, new)
}

// FetchAdd adds delta to the 8-byte word at off in the peer's region, as
// one atomic operation of the peer's NIC (modulo 2^64: a delta of
// ^uint64(0) subtracts 1), and returns the word's value before. The rules
// are CompareAndSwap's.
func (r *RemoteRegion) FetchAdd(ctx context.Context, off int64, delta uint64) (prev uint64, err error) {
	return r.atomic(ctx, opFetchAdd, off, delta, 0)
}

func (r *RemoteRegion) atomic(ctx context.Context, op uint8, off int64, a, b uint64) (uint64, error) {
	c := r.c
	name := opName(op)
	if !c.ok() {
		return 0, errInvalid(name)
	}
	if err := r.check(RemoteAtomic); err != nil {
		return 0, c.opErr(name, err)
	}
	if !inBounds(off, AtomicSize, r.key.Size) {
		return 0, c.opErr(name, ErrOutOfBounds)
	}
	if at := r.key.Addr + uint64(off); at%AtomicSize != 0 {
		return 0, c.opErr(name, fmt.Errorf("rdma: atomic target %#x (offset %d) is not 8-byte aligned: %w", at, off, syscall.EINVAL))
	}
	if err := c.atomics.supported(); err != nil {
		return 0, c.opErr(name, err)
	}
	if err := ctx.Err(); err != nil {
		return 0, c.opErr(name, mapCtxErr(err))
	}
	if err := c.ensureBounce(); err != nil {
		return 0, c.opErr(name, err)
	}
	slot, err := c.startOneSided(ctx, op, nil, 0, AtomicSize, r.key, uint64(off), a, b)
	var prev uint64
	if err == nil {
		prev, err = c.waitOneSided(ctx, slot)
	}
	return prev, c.opErr(name, mapCtxErr(err))
}
