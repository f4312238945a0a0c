package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRejectBytes(t *testing.T) {
	// The magic, the version, the reason, two reserved bytes.
	require.Equal(t, []byte{0x47, 0x56, 0x52, 0x44, 8, 3, 0, 0}, MarshalReject(3))
	for _, r := range []uint8{0, 1, 6, 200, 0xff} {
		got, ok := ParseReject(MarshalReject(r))
		require.True(t, ok)
		require.Equal(t, r, got)
		// Providers may pad the private data.
		got, ok = ParseReject(append(MarshalReject(r), make([]byte, 40)...))
		require.True(t, ok)
		require.Equal(t, r, got)
	}
	// Another version's reject still says why.
	b := MarshalReject(5)
	b[4] = Version + 1
	got, ok := ParseReject(b)
	require.True(t, ok)
	require.Equal(t, uint8(5), got)

	for _, b := range [][]byte{nil, make([]byte, 56), MarshalReject(1)[:rejectLen-1], []byte("GVRK\x01\x01\x00\x00")} {
		_, ok := ParseReject(b)
		require.False(t, ok, "%x", b)
	}
}

func FuzzParseReject(f *testing.F) {
	f.Add(MarshalReject(3))
	f.Add([]byte{})
	f.Add(make([]byte, 56))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, ok := ParseReject(b)
		if !ok {
			if r != 0 {
				t.Fatalf("no reject, yet reason %d", r)
			}
			return
		}
		if len(b) < rejectLen || b[5] != r {
			t.Fatalf("reason %d from %x", r, b)
		}
		if again, ok := ParseReject(MarshalReject(r)); !ok || again != r {
			t.Fatalf("round trip of %d: %d, %v", r, again, ok)
		}
	})
}
