package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The RemoteKey's binary encoding.

func TestRemoteKeyEncoding(t *testing.T) {
	k := RemoteKey{Addr: 0x7f0012345000, Size: 1 << 20, RKey: 0xabcdef01, Access: RemoteRead | RemoteWrite}
	b, err := k.MarshalBinary()
	require.NoError(t, err)
	require.Len(t, b, RemoteKeyLen)
	require.Equal(t, "GVRK", string(b[:4]))
	var got RemoteKey
	require.NoError(t, got.UnmarshalBinary(b))
	require.Equal(t, k, got)
	b2, err := k.AppendBinary([]byte("x"))
	require.NoError(t, err)
	require.Equal(t, append([]byte("x"), b...), b2)

	mut := func(f func(b []byte)) []byte {
		c := append([]byte(nil), b...)
		f(c)
		return c
	}
	for name, bad := range map[string][]byte{
		"short":          b[:RemoteKeyLen-1],
		"long":           append(append([]byte(nil), b...), 0),
		"magic":          mut(func(b []byte) { b[0] ^= 1 }),
		"version":        mut(func(b []byte) { b[4] = 2 }),
		"no access":      mut(func(b []byte) { b[5] = 0 }),
		"unknown access": mut(func(b []byte) { b[5] = 8 }),
		"reserved":       mut(func(b []byte) { b[7] = 1 }),
		"zero size":      mut(func(b []byte) { clear(b[16:24]) }),
		"huge size":      mut(func(b []byte) { b[16] = 1 }),
		"wraps":          mut(func(b []byte) { copy(b[8:16], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) }),
	} {
		got := RemoteKey{RKey: 42}
		require.Error(t, got.UnmarshalBinary(bad), name)
		require.Equal(t, RemoteKey{RKey: 42}, got, "%s: unchanged on error", name)
	}
	_, err = RemoteKey{}.MarshalBinary()
	require.Error(t, err, "a key that names no region")
	require.Equal(t, "read|write", (RemoteRead | RemoteWrite).String())
	require.Equal(t, "local", Access(0).String())
}

func FuzzRemoteKey(f *testing.F) {
	b, _ := RemoteKey{Addr: 0x1000, Size: 4096, RKey: 1, Access: RemoteRead}.MarshalBinary()
	f.Add(b)
	f.Add([]byte("GVRK"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var k RemoteKey
		if k.UnmarshalBinary(b) != nil {
			require.Equal(t, RemoteKey{}, k)
			return
		}
		if k.Access == 0 || k.Access&^accessMask != 0 || k.Size == 0 || k.Size > maxRemoteRegion || k.Addr+k.Size < k.Addr {
			t.Fatalf("accepted %+v", k)
		}
		again, err := k.MarshalBinary()
		require.NoError(t, err)
		require.Equal(t, b, again, "the encoding is canonical")
	})
}
