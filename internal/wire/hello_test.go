package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHelloRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    Hello
	}{
		{"defaults", Hello{RecvDepth: 64, CtrlDepth: CtrlDepth, BufSize: 64 << 10,
			RingSize: 128 << 10, RingAddr: 0x7f0012340000, RKey: 0x1234}},
		{"smallest", Hello{RecvDepth: 1, CtrlDepth: 1, BufSize: 1, RingSize: MinRing}},
		{"largest", Hello{RecvDepth: 0xffff, CtrlDepth: 0xff, BufSize: 0xffffffff, RingSize: MaxRing,
			RingAddr: ^uint64(0) - MaxRing, RKey: 0xffffffff}},
		{"mixed", Hello{RecvDepth: 0x1234, CtrlDepth: 0x56, BufSize: 0x789abcde, RingSize: 0x12340, RingAddr: 0x0102030405060708, RKey: 0x9abcdef0}},
		{"messages", Hello{Flags: HelloMessages, RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096, RingSize: 8192, RingAddr: 4096, RKey: 1}},
		{"headers as SENDs", Hello{Flags: HelloMessages | HelloHeaders, RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096, RingSize: 8192, RingAddr: 4096, RKey: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.h.Marshal()
			require.Len(t, b, helloLen)
			got, err := ParseHello(b)
			require.NoError(t, err)
			require.Equal(t, tc.h, got)

			// Providers may pad the private data with zeros up to the
			// IB maximum of 56 bytes.
			padded := append(b, make([]byte, 56-len(b))...)
			got, err = ParseHello(padded)
			require.NoError(t, err)
			require.Equal(t, tc.h, got)
		})
	}
}

// The hello's bytes, field by field: the wire format, which a peer of
// another build reads.
func TestHelloBytes(t *testing.T) {
	h := Hello{Flags: HelloMessages | HelloHeaders, RecvDepth: 0x0102, CtrlDepth: 0x03, BufSize: 0x04050607,
		RingSize: 0x08090a0b, RingAddr: 0x0c0d0e0f10111213, RKey: 0x14151617}
	want := []byte{
		0x47, 0x56, 0x52, 0x44, // magic "GVRD"
		8,          // version
		0x03,       // flags
		0x01, 0x02, // recvDepth
		0x03,                   // ctrlDepth
		0,                      // reserved
		0x04, 0x05, 0x06, 0x07, // bufSize
		0x08, 0x09, 0x0a, 0x0b, // ringSize
		0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11, 0x12, 0x13, // ringAddr
		0x14, 0x15, 0x16, 0x17, // rkey
	}
	require.Equal(t, want, h.Marshal())
	require.Len(t, want, helloLen)
	require.Equal(t, 8, Version)
}

func TestHelloRejected(t *testing.T) {
	good := Hello{RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096, RingSize: 8192, RingAddr: 0x10000, RKey: 5}
	with := func(h Hello) []byte { return h.Marshal() }
	mutate := func(f func(b []byte)) []byte {
		b := good.Marshal()
		f(b)
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string // in the error message
	}{
		{"nil", nil, "handshake of 0 bytes"},
		{"short", good.Marshal()[:helloLen-1], "handshake of 29 bytes"},
		{"version 3 (16 bytes)", Hello{RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096}.Marshal()[:16], "handshake of 16 bytes"},
		{"zeros", make([]byte, 56), "bad magic"},
		{"bad magic", mutate(func(b []byte) { b[0] ^= 0xff }), "bad magic"},
		{"version 0", mutate(func(b []byte) { b[4] = 0 }), "protocol version 0"},
		{"version 1 (header in the payload)", mutate(func(b []byte) { b[4] = 1 }), "protocol version 1"},
		{"version 2 (no flags)", mutate(func(b []byte) { b[4] = 2 }), "protocol version 2, want 8"},
		{"version 3 (receive buffers)", mutate(func(b []byte) { b[4] = 3 }), "protocol version 3, want 8"},
		{"version 4 (immediate data only)", mutate(func(b []byte) { b[4] = 4 }), "protocol version 4, want 8"},
		{"version 5 (fixed rings)", mutate(func(b []byte) { b[4] = 5 }), "protocol version 5, want 8"},
		{"version 6 (no wants flag)", mutate(func(b []byte) { b[4] = 6 }), "protocol version 6, want 8"},
		{"version 7 (iWARP responder may send first)", mutate(func(b []byte) { b[4] = 7 }), "protocol version 7, want 8"},
		{"version 9", mutate(func(b []byte) { b[4] = Version + 1 }), "protocol version 9"},
		{"unknown flag", mutate(func(b []byte) { b[5] = 0x80 }), "unknown flags 0x80"},
		{"zero recvDepth", with(Hello{RecvDepth: 0, CtrlDepth: CtrlDepth, BufSize: 4096}), "bad geometry"},
		{"zero ctrlDepth", with(Hello{RecvDepth: 16, CtrlDepth: 0, BufSize: 4096}), "bad geometry"},
		{"zero bufSize", with(Hello{RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 0, RingSize: 8192}), "bad geometry"},
		{"no ring", with(Hello{RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096}), "bad ring size 0"},
		{"ring too small", with(Hello{RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096, RingSize: MinRing - RingAlign}), "bad ring size"},
		{"ring too large", with(Hello{RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096, RingSize: MaxRing + RingAlign}), "bad ring size"},
		{"ring not aligned", with(Hello{RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096, RingSize: 8192 + 32}), "bad ring size"},
		{"ring wraps the address space", with(Hello{RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096, RingSize: 8192, RingAddr: ^uint64(0) - 4096}), "wraps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseHello(tc.b)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrMalformed)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func FuzzParseHello(f *testing.F) {
	f.Add(Hello{RecvDepth: 64, CtrlDepth: CtrlDepth, BufSize: 64 << 10, RingSize: 128 << 10, RingAddr: 0x7f0000000000, RKey: 7}.Marshal())
	f.Add(Hello{Flags: HelloMessages, RecvDepth: 1, CtrlDepth: 1, BufSize: 1, RingSize: MinRing}.Marshal())
	f.Add(Hello{Flags: HelloMessages | HelloHeaders, RecvDepth: 1, CtrlDepth: 1, BufSize: 1, RingSize: MinRing}.Marshal())
	f.Add(append(Hello{RecvDepth: 0xffff, CtrlDepth: 0xff, BufSize: 0xffffffff, RingSize: MaxRing, RingAddr: 1 << 40, RKey: 0xffffffff}.Marshal(), make([]byte, 26)...))
	f.Add(Hello{RecvDepth: 16, CtrlDepth: CtrlDepth, BufSize: 4096, RingSize: 8192 + 32}.Marshal())
	f.Add([]byte("GVRD"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHello(b)
		if err != nil {
			if h != (Hello{}) {
				t.Fatalf("a rejected hello returned %+v", h)
			}
			return
		}
		if h.RecvDepth == 0 || h.CtrlDepth == 0 || h.BufSize == 0 || h.Flags&^(HelloMessages|HelloHeaders) != 0 {
			t.Fatalf("accepted a hello that grants nothing or has unknown flags: %+v", h)
		}
		if h.RingSize < MinRing || h.RingSize > MaxRing || h.RingSize%RingAlign != 0 || h.RingAddr+uint64(h.RingSize) < h.RingAddr {
			t.Fatalf("accepted a ring that cannot be placed in: %+v", h)
		}
		// Whatever the peer announced, the geometry keeps a largest
		// message inside an empty ring.
		span, maxMsg := RingGeometry(128<<10, 64<<10, int(h.RingSize), int(h.BufSize))
		if maxMsg < 1 || 2*maxMsg > span || span%RingAlign != 0 {
			t.Fatalf("geometry %d, %d from %+v", span, maxMsg, h)
		}
		again, err := ParseHello(h.Marshal())
		if err != nil || again != h {
			t.Fatalf("round trip of %+v: %+v, %v", h, again, err)
		}
	})
}
