package wire

import "encoding/binary"

// rejectLen is the length of a reject's private data: the magic, the
// version, the reason, two reserved bytes.
const rejectLen = 8

// MarshalReject is a reject's private data, saying why.
func MarshalReject(reason uint8) []byte {
	b := make([]byte, rejectLen)
	binary.BigEndian.PutUint32(b, helloMagic)
	b[4] = Version
	b[5] = reason
	return b
}

// ParseReject reads the reason out of a reject's private data; ok is
// false for anything else (a foreign server's reject, padding only). The
// version is not checked: a listener of another version refuses a request
// with a reject of its own version, and its reason (a protocol mismatch)
// is what the dialer has to report. Which reasons exist is the caller's
// to check.
func ParseReject(b []byte) (reason uint8, ok bool) {
	if len(b) < rejectLen || binary.BigEndian.Uint32(b) != helloMagic {
		return 0, false
	}
	return b[5], true
}
