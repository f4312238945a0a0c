package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/goverbs/rdma/internal/wire"
)

// The wire protocol's codec is internal/wire, whose package comment
// describes the protocol. Here: what this package makes of a peer's bytes
// that break it, the ids of its own work requests, and the region key's
// encoding.

// parseHello is wire.ParseHello for a hello from the peer: a malformed
// one is a protocol error.
func parseHello(b []byte) (wire.Hello, error) {
	h, err := wire.ParseHello(b)
	if err != nil {
		return h, peerError(err)
	}
	return h, nil
}

// parseRingDesc is wire.ParseRingDesc for the peer's ring offer: a
// malformed one is a protocol error.
func parseRingDesc(b []byte, most int) (wire.RingDesc, error) {
	d, err := wire.ParseRingDesc(b, most)
	if err != nil {
		return d, peerError(err)
	}
	return d, nil
}

// peerError reports a wire error in what the peer sent as ErrProtocol,
// with the wire's detail.
func peerError(err error) error { return &protocolError{err.Error()} }

// sendable reports whether a side whose transport carries immediate data
// (or not: headers) can send the way peer takes its headers: every
// transport sends SENDs, not every one immediate data.
func sendable(peer wire.Hello, headers bool) error {
	if headers && peer.Flags&wire.HelloHeaders == 0 {
		return &protocolError{"the peer takes headers as immediate data, which this device's transport (iWARP) cannot send"}
	}
	return nil
}

// Work request ids. A receive's id is recvWRID (receives are all alike:
// zero-length). A send's id has the
// top bit set and carries the data and control sequence numbers reached by
// that send: RC completes sends in order, so a signaled completion also
// retires every unsignaled send posted before it.
const (
	wrSend   = 1 << 63
	recvWRID = 0
)

func sendWRID(dataSeq, ctrlSeq uint32) uint64 {
	return wrSend | uint64(ctrlSeq&0x7fffffff)<<32 | uint64(dataSeq)
}

func parseSendWRID(id uint64) (dataSeq, ctrlSeq uint32) {
	return uint32(id), uint32(id>>32) & 0x7fffffff
}

// The key of a region (RemoteKey): how a region's owner tells its peer
// where it is, and how the peer checks what it was told.

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
		return fmt.Errorf("rdma: remote key with access %v: %w", k.Access, syscall.EINVAL)
	case k.Size == 0 || k.Size > MaxRegionSize:
		return fmt.Errorf("rdma: remote key of size %d outside [1, %d]: %w", k.Size, uint64(MaxRegionSize), syscall.EINVAL)
	case k.Addr > ^uint64(0)-k.Size:
		return fmt.Errorf("rdma: remote key at %#x of %d bytes wraps the address space: %w", k.Addr, k.Size, syscall.EINVAL)
	}
	return nil
}
