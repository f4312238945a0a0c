package wire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// Both sides derive the same geometry from the two hellos, whichever side
// computes it, and a largest message always fits an empty ring.
func TestRingGeometry(t *testing.T) {
	for _, tc := range []struct {
		name                               string
		ownRing, ownBuf, peerRing, peerBuf int
		span, maxMsg                       int
	}{
		{"defaults", 128 << 10, 64 << 10, 128 << 10, 64 << 10, 128 << 10, 64 << 10},
		{"smaller peer", 128 << 10, 64 << 10, 8192, 4096, 8192, 4096},
		{"tiny peer messages", 4096, 256, 4096, 1, 4096, 1},
		{"peer ring small for its messages", 8192, 4096, 576, 65536, 576, 288},
	} {
		t.Run(tc.name, func(t *testing.T) {
			span, maxMsg := RingGeometry(tc.ownRing, tc.ownBuf, tc.peerRing, tc.peerBuf)
			require.Equal(t, tc.span, span)
			require.Equal(t, tc.maxMsg, maxMsg)
			span2, maxMsg2 := RingGeometry(tc.peerRing, tc.peerBuf, tc.ownRing, tc.ownBuf)
			require.Equal(t, []int{span, maxMsg}, []int{span2, maxMsg2}, "the peer computes the same")
		})
	}
}

func TestRingPlace(t *testing.T) {
	const span, maxMsg = 1024, 300
	for _, tc := range []struct {
		t, start uint64
	}{
		{0, 0},
		{64, 64},
		{704, 704},   // 704 + 300 = 1004: fits
		{768, 1024},  // 768 + 300 > 1024: to the ring's start
		{960, 1024},  // likewise
		{1024, 1024}, // at the start already
		{1024 + 704, 1024 + 704},
		{1088 + 704, 2048}, // offset 768
		{2048 + 768, 3072},
	} {
		require.Equal(t, tc.start, RingPlace(tc.t, span, maxMsg), "tail %d", tc.t)
	}
	require.Equal(t, uint64(1024+64), RingEnd(1024, 1))
	require.Equal(t, uint64(1024+64), RingEnd(1024, 64))
	require.Equal(t, uint64(1024+128), RingEnd(1024, 65))
}

func TestParseRingDesc(t *testing.T) {
	b := make([]byte, RingDescLen)
	RingDesc{Addr: 0xabc000, RKey: 9, Size: 8192}.Put(b)
	d, err := ParseRingDesc(b, 8192)
	require.NoError(t, err)
	require.Equal(t, RingDesc{Addr: 0xabc000, RKey: 9, Size: 8192}, d)
	_, err = ParseRingDesc(b, 4096)
	require.ErrorContains(t, err, "at most 4096")
	RingDesc{Addr: ^uint64(0) - 100, RKey: 9, Size: 4096}.Put(b)
	_, err = ParseRingDesc(b, 8192)
	require.ErrorContains(t, err, "wraps")
	RingDesc{Size: 4096 + 1}.Put(b)
	_, err = ParseRingDesc(b, 8192)
	require.ErrorContains(t, err, "size")
	require.ErrorIs(t, err, ErrMalformed)
	_, err = ParseRingDesc(b[:RingDescLen-1], 8192)
	require.ErrorContains(t, err, "ring offer of 15 bytes")

	// The descriptor's bytes: address, rkey, size, big-endian.
	RingDesc{Addr: 0x0102030405060708, RKey: 0x090a0b0c, Size: 0x0d0e0f10}.Put(b)
	require.Equal(t, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, b)
}

func FuzzParseRingDesc(f *testing.F) {
	b := make([]byte, RingDescLen)
	RingDesc{Addr: 0x1000, RKey: 1, Size: 16384}.Put(b)
	f.Add(b, 1<<17)
	f.Add([]byte{}, 4096)
	f.Fuzz(func(t *testing.T, b []byte, most int) {
		d, err := ParseRingDesc(b, most)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("not ErrMalformed: %v", err)
			}
			return
		}
		if int(d.Size) > most || d.Size < MinRing || d.Size%RingAlign != 0 || d.Addr+uint64(d.Size) < d.Addr {
			t.Fatalf("accepted %+v (most %d)", d, most)
		}
		out := make([]byte, RingDescLen)
		d.Put(out)
		if !bytes.Equal(out, b) {
			t.Fatalf("round trip: %x != %x", out, b)
		}
	})
}
