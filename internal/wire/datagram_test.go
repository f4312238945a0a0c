package wire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// dgram encodes h followed by payload.
func dgram(h DgramHeader, payload []byte) []byte {
	b := make([]byte, h.Len()+len(payload))
	copy(b[PutDgramHeader(b, h):], payload)
	return b
}

func TestDatagramBytes(t *testing.T) {
	// Magic, version 1 and no flags, the port.
	require.Equal(t, []byte{0xd7, 0x10, 0x12, 0x34, 'h', 'i'}, dgram(DgramHeader{Port: 0x1234}, []byte("hi")))
	// A fragment: the flag, then id, total, offset, fragment size, two
	// reserved bytes.
	require.Equal(t,
		[]byte{0xd7, 0x11, 0x12, 0x34, 1, 2, 3, 4, 0x01, 0x00, 0x00, 0x80, 0x00, 0x80, 0, 0},
		dgram(DgramHeader{Port: 0x1234, Fragment: true, ID: 0x01020304, Total: 256, Offset: 128, FragSize: 128}, nil))
	require.Equal(t, DgramHeaderLen, DgramHeader{}.Len())
	require.Equal(t, DgramFragHeaderLen, DgramHeader{Fragment: true}.Len())
	require.Panics(t, func() { PutDgramHeader(make([]byte, DgramHeaderLen), DgramHeader{Fragment: true}) })
	require.Panics(t, func() { PutDgramHeader(make([]byte, DgramHeaderLen-1), DgramHeader{}) })
}

func TestDatagramRoundTrip(t *testing.T) {
	payload := bytes.Repeat([]byte{0xab}, MaxDatagram)
	for _, tc := range []struct {
		name string
		h    DgramHeader
		n    int // payload bytes
	}{
		{"empty", DgramHeader{Port: 9}, 0},
		{"small", DgramHeader{Port: 65535}, 100},
		{"largest whole", DgramHeader{Port: 1}, MaxDatagram},
		{"first fragment", DgramHeader{Port: 7, Fragment: true, ID: 1, Total: 10000, Offset: 0, FragSize: 4080}, 4080},
		{"middle fragment", DgramHeader{Port: 7, Fragment: true, ID: 1, Total: 10000, Offset: 4080, FragSize: 4080}, 4080},
		{"last fragment", DgramHeader{Port: 7, Fragment: true, ID: 1, Total: 10000, Offset: 8160, FragSize: 4080}, 10000 - 8160},
		{"last fragment, full", DgramHeader{Fragment: true, ID: ^uint32(0), Total: 8160, Offset: 4080, FragSize: 4080}, 4080},
		{"one byte past the size", DgramHeader{Fragment: true, Total: MinFragSize + 1, Offset: MinFragSize, FragSize: MinFragSize}, 1},
		{"largest datagram's last", DgramHeader{Fragment: true, Total: MaxDatagram, Offset: 65472, FragSize: MinFragSize}, MaxDatagram - 65472},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := dgram(tc.h, payload[:tc.n])
			h, p, err := ParseDatagram(b)
			require.NoError(t, err)
			require.Equal(t, tc.h, h)
			require.Equal(t, payload[:tc.n], p)
			if tc.n > 0 {
				require.Same(t, &b[h.Len()], &p[0], "the payload is b's")
			}
		})
	}
}

func TestDatagramRejected(t *testing.T) {
	frag := DgramHeader{Port: 5, Fragment: true, ID: 3, Total: 1000, Offset: 256, FragSize: 256}
	full := make([]byte, 256)
	mutate := func(h DgramHeader, n int, f func(b []byte)) []byte {
		b := dgram(h, make([]byte, n))
		f(b)
		return b
	}
	with := func(f func(h *DgramHeader), n int) []byte {
		h := frag
		f(&h)
		return dgram(h, make([]byte, n))
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string // in the error message
	}{
		{"nil", nil, "datagram of 0 bytes"},
		{"short", []byte{DgramMagic, DgramVersion << 4, 0}, "datagram of 3 bytes"},
		{"bad magic", mutate(DgramHeader{}, 1, func(b []byte) { b[0] = 0xd6 }), "bad magic 0xd6"},
		{"version 0", mutate(DgramHeader{}, 1, func(b []byte) { b[1] = 0x00 }), "datagram version 0, want 1"},
		{"version 2", mutate(DgramHeader{}, 1, func(b []byte) { b[1] = 0x20 }), "datagram version 2, want 1"},
		{"unknown flag", mutate(DgramHeader{}, 1, func(b []byte) { b[1] |= 0x2 }), "unknown flags 0x2"},
		{"unknown flag on a fragment", mutate(frag, 256, func(b []byte) { b[1] |= 0x8 }), "unknown flags 0x8"},
		{"whole, too large", dgram(DgramHeader{}, make([]byte, MaxDatagram+1)), "datagram of 65508 bytes (at most 65507)"},
		{"fragment header cut", mutate(frag, 0, func(b []byte) {})[:DgramFragHeaderLen-1], "fragment of 15 bytes"},
		{"reserved byte 14", mutate(frag, 256, func(b []byte) { b[14] = 1 }), "reserved bytes 0x0100"},
		{"reserved byte 15", mutate(frag, 256, func(b []byte) { b[15] = 0x80 }), "reserved bytes 0x0080"},
		{"total too large", with(func(h *DgramHeader) { h.Total = MaxDatagram + 1 }, 256), "datagram of 65508 bytes (at most 65507)"},
		{"total at 16 bits", with(func(h *DgramHeader) { h.Total = 65535 }, 256), "at most 65507"},
		{"fragment size too small", with(func(h *DgramHeader) { h.FragSize, h.Offset = MinFragSize-1, 0 }, MinFragSize-1), "fragment size 63 (at least 64)"},
		{"fragment size zero", with(func(h *DgramHeader) { h.FragSize, h.Offset = 0, 0 }, 1), "fragment size 0"},
		{"fits whole", with(func(h *DgramHeader) { h.Total, h.Offset = 256, 0 }, 256), "datagram of 256 bytes that fits one of 256"},
		{"total zero", with(func(h *DgramHeader) { h.Total, h.Offset = 0, 0 }, 1), "fits one"},
		{"offset not a multiple", with(func(h *DgramHeader) { h.Offset = 100 }, 256), "offset 100, not a multiple of 256"},
		{"offset at the end", with(func(h *DgramHeader) { h.Total, h.Offset = 768, 768 }, 1), "offset 768 of a datagram of 768 bytes"},
		{"offset past the end", with(func(h *DgramHeader) { h.Offset = 1024 }, 1), "offset 1024 of a datagram of 1000 bytes"},
		{"empty fragment", with(func(h *DgramHeader) {}, 0), "empty fragment at offset 256"},
		{"empty last fragment", with(func(h *DgramHeader) { h.Offset = 768 }, 0), "empty fragment"},
		{"more than the size", with(func(h *DgramHeader) {}, 257), "fragment of 257 bytes, more than its size 256"},
		{"short of the size", with(func(h *DgramHeader) {}, 255), "fragment of 255 bytes at offset 256 short of its size 256"},
		{"first short", with(func(h *DgramHeader) { h.Offset = 0 }, 1), "short of its size"},
		{"last short", with(func(h *DgramHeader) { h.Offset = 768 }, 231), "fragment of 231 bytes at offset 768 short of its size 256"},
		{"last too long", with(func(h *DgramHeader) { h.Offset = 768 }, 233), "fragment of 233 bytes at offset 768 past the datagram's end 1000"},
		{"last full past the end", with(func(h *DgramHeader) { h.Offset = 768 }, 256), "past the datagram's end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseDatagram(tc.b)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrMalformed)
			require.ErrorContains(t, err, tc.want)
		})
	}
	// The fragment the cases above mutate is itself good.
	_, _, err := ParseDatagram(dgram(frag, full))
	require.NoError(t, err)
}

func TestDgramFragments(t *testing.T) {
	for _, tc := range []struct{ total, size, want int }{
		{0, 64, 0},
		{1, 64, 1},
		{64, 64, 1},
		{65, 64, 2},
		{128, 64, 2},
		{MaxDatagram, 4080, 17},
		{MaxDatagram, MinFragSize, 1024},
	} {
		require.Equal(t, tc.want, DgramFragments(tc.total, tc.size), "%d bytes in fragments of %d", tc.total, tc.size)
	}
}

func FuzzParseDatagram(f *testing.F) {
	f.Add(dgram(DgramHeader{Port: 80}, []byte("hello")))
	f.Add(dgram(DgramHeader{}, nil))
	f.Add(dgram(DgramHeader{Port: 7, Fragment: true, ID: 1, Total: 10000, Offset: 4080, FragSize: 4080}, make([]byte, 4080)))
	f.Add(dgram(DgramHeader{Port: 7, Fragment: true, ID: 1, Total: 100, Offset: 64, FragSize: 64}, make([]byte, 36)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, p, err := ParseDatagram(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("not ErrMalformed: %v", err)
			}
			return
		}
		n := h.Len()
		if len(b) != n+len(p) || (len(p) > 0 && &b[n] != &p[0]) {
			t.Fatalf("payload of %d bytes is not the rest of %d after a header of %d", len(p), len(b), n)
		}
		out := make([]byte, n)
		PutDgramHeader(out, h)
		if !bytes.Equal(out, b[:n]) {
			t.Fatalf("round trip of %+v: %x != %x", h, out, b[:n])
		}
		if len(p) > MaxDatagram {
			t.Fatalf("datagram of %d bytes", len(p))
		}
		if !h.Fragment {
			if h.ID != 0 || h.Total != 0 || h.Offset != 0 || h.FragSize != 0 {
				t.Fatalf("whole datagram with fragment fields %+v", h)
			}
			return
		}
		end := h.Offset + len(p)
		if h.Total > MaxDatagram || h.FragSize < MinFragSize || h.Total <= h.FragSize ||
			h.Offset%h.FragSize != 0 || h.Offset >= h.Total || len(p) == 0 || len(p) > h.FragSize ||
			end > h.Total || (end < h.Total && len(p) != h.FragSize) {
			t.Fatalf("accepted fragment %+v of %d bytes", h, len(p))
		}
		// Every fragment has the one length its offset allows, and its
		// index fits the datagram's count.
		if len(p) != min(h.FragSize, h.Total-h.Offset) || h.Offset/h.FragSize >= DgramFragments(h.Total, h.FragSize) {
			t.Fatalf("fragment %+v of %d bytes", h, len(p))
		}
	})
}
