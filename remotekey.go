package rdma

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
)

// The key of a region (RemoteKey): how a region's owner tells its peer
// where it is, in bytes or in text, and how the peer checks what it was
// told.

// RemoteKey names a peer's region: what the peer needs to read or write
// it. The owner sends it to the peer over the connection itself
// (MarshalBinary), or as text in a protocol carried on the connection,
// such as an HTTP header (MarshalText); the peer passes it to Conn.Remote.
// It is good on that connection only, and only until the owner closes the
// region.
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

// RemoteKeyTextLen is the length of a RemoteKey's text form (MarshalText):
// RemoteKeyLen bytes in URL-safe base64 without padding.
const RemoteKeyTextLen = (RemoteKeyLen*8 + 5) / 6

// keyText is the text form's encoding. Its alphabet goes into HTTP
// headers, URLs and file names as it is, with no quoting or escaping;
// Strict refuses a last character with its unused bits set (another text
// of the same bytes).
var keyText = base64.RawURLEncoding.Strict()

// AppendText appends the key's text form to b: its binary encoding
// (AppendBinary) in URL-safe base64 without padding, RemoteKeyTextLen
// bytes, for a peer that gets the key through a text protocol (an HTTP
// header, say) rather than over the connection's bytes.
func (k RemoteKey) AppendText(b []byte) ([]byte, error) {
	var raw [RemoteKeyLen]byte
	if _, err := k.AppendBinary(raw[:0]); err != nil {
		return b, err
	}
	return keyText.AppendEncode(b, raw[:]), nil
}

// MarshalText encodes the key as text (see AppendText).
func (k RemoteKey) MarshalText() ([]byte, error) {
	return k.AppendText(make([]byte, 0, RemoteKeyTextLen))
}

// UnmarshalText decodes a key's text form, strictly: exactly
// RemoteKeyTextLen bytes, each of the URL-safe base64 alphabet (no padding,
// spaces or line breaks), in the one encoding MarshalText gives (the last
// character's unused bits zero), then checked as UnmarshalBinary checks the
// bytes. A key that arrived as text decodes only if it is what the owner
// sent, byte for byte. It leaves k unchanged on error.
func (k *RemoteKey) UnmarshalText(text []byte) error {
	if len(text) != RemoteKeyTextLen {
		return fmt.Errorf("rdma: remote key text of %d bytes, want %d", len(text), RemoteKeyTextLen)
	}
	// The decoder skips line breaks: checking the alphabet first keeps a
	// key of the right length with one in it from reading as a shorter
	// one.
	for i, c := range text {
		if !keyTextByte(c) {
			return fmt.Errorf("rdma: remote key text with %q at %d, outside URL-safe base64", c, i)
		}
	}
	var raw [RemoteKeyLen]byte
	n, err := keyText.Decode(raw[:], text)
	if err != nil {
		// The only error left: unused bits set in the last character.
		return errors.New("rdma: remote key text not in its canonical encoding")
	}
	return k.UnmarshalBinary(raw[:n])
}

// keyTextByte reports whether c is of the text form's alphabet.
func keyTextByte(c byte) bool {
	return 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_'
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
