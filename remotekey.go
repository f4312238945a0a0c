package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

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

// RemoteKeyLen is the length of a marshaled RemoteKey.
const RemoteKeyLen = 28

const (
	remoteKeyMagic   = 0x4756524b // "GVRK"
	remoteKeyVersion = 1
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
// right, a size of 1 byte to 1 TiB (the largest region a 64-bit peer
// registers, see MaxRegionSize) that does not wrap the address space. It
// leaves k unchanged on error.
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
	case k.Size == 0 || k.Size > maxRemoteRegion:
		return fmt.Errorf("rdma: remote key of size %d outside [1, %d]: %w", k.Size, uint64(maxRemoteRegion), syscall.EINVAL)
	case k.Addr > ^uint64(0)-k.Size:
		return fmt.Errorf("rdma: remote key at %#x of %d bytes wraps the address space: %w", k.Addr, k.Size, syscall.EINVAL)
	}
	return nil
}
