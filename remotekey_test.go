package rdma

import (
	"encoding/base64"
	"net/url"
	"strings"
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

// The RemoteKey's text form: the binary encoding in URL-safe base64
// without padding, decoded strictly.

func TestRemoteKeyText(t *testing.T) {
	require.Equal(t, base64.RawURLEncoding.EncodedLen(RemoteKeyLen), RemoteKeyTextLen)
	k := RemoteKey{Addr: 0x7f0012345000, Size: 1 << 20, RKey: 0xabcdef01, Access: RemoteRead | RemoteWrite}
	text, err := k.MarshalText()
	require.NoError(t, err)
	require.Len(t, text, RemoteKeyTextLen)
	raw, err := k.MarshalBinary()
	require.NoError(t, err)
	require.Equal(t, base64.RawURLEncoding.EncodeToString(raw), string(text))
	var got RemoteKey
	require.NoError(t, got.UnmarshalText(text))
	require.Equal(t, k, got)
	appended, err := k.AppendText([]byte("token="))
	require.NoError(t, err)
	require.Equal(t, "token="+string(text), string(appended))

	// The length is fixed, whatever the fields: every key is RemoteKeyTextLen
	// bytes of the alphabet, and a header or URL takes it as it is.
	for _, k := range []RemoteKey{
		{Addr: 0, Size: 1, RKey: 0, Access: RemoteRead},
		{Addr: ^uint64(0) - 1<<40, Size: 1 << 40, RKey: ^uint32(0), Access: RemoteWrite},
		{Addr: 0xfbfffbfffbff, Size: 0xffff, RKey: 0xfbfffbff, Access: RemoteRead | RemoteWrite},
	} {
		text, err := k.MarshalText()
		require.NoError(t, err)
		require.Len(t, text, RemoteKeyTextLen, "%+v", k)
		for _, c := range text {
			require.True(t, keyTextByte(c), "%q in %s", c, text)
		}
		require.Equal(t, url.PathEscape(string(text)), string(text), "URL-safe as it is")
		var got RemoteKey
		require.NoError(t, got.UnmarshalText(text))
		require.Equal(t, k, got)
	}

	mut := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), text...)) }
	// reencode makes a well-formed text of bytes UnmarshalBinary refuses.
	reencode := func(f func(b []byte)) []byte {
		b := append([]byte(nil), raw...)
		f(b)
		return []byte(base64.RawURLEncoding.EncodeToString(b))
	}
	last := text[RemoteKeyTextLen-1]
	// The last character carries 2 bits of the last byte and 4 unused
	// bits: the same byte with one of those set is another character.
	nonCanonical := mut(func(b []byte) []byte {
		idx := strings.IndexByte(alphabet, last)
		b[len(b)-1] = alphabet[idx^1]
		return b
	})
	_, err = base64.RawURLEncoding.DecodeString(string(nonCanonical))
	require.NoError(t, err, "a lenient decoder takes it")
	for name, bad := range map[string][]byte{
		"empty":         nil,
		"short":         text[:RemoteKeyTextLen-1],
		"long":          append(append([]byte(nil), text...), 'A'),
		"padded":        append(append([]byte(nil), text...), '='),
		"padding":       mut(func(b []byte) []byte { b[len(b)-1] = '='; return b }),
		"std alphabet":  mut(func(b []byte) []byte { b[3] = '+'; return b }),
		"slash":         mut(func(b []byte) []byte { b[3] = '/'; return b }),
		"space":         mut(func(b []byte) []byte { b[10] = ' '; return b }),
		"newline":       mut(func(b []byte) []byte { return append(append(b[:10:10], '\n'), b[10:len(b)-1]...) }),
		"carriage ret":  mut(func(b []byte) []byte { return append(append(b[:10:10], '\r'), b[10:len(b)-1]...) }),
		"nul":           mut(func(b []byte) []byte { b[0] = 0; return b }),
		"high byte":     mut(func(b []byte) []byte { b[5] = 0xc3; return b }),
		"non-canonical": nonCanonical,
		"magic":         reencode(func(b []byte) { b[0] ^= 1 }),
		"version":       reencode(func(b []byte) { b[4] = 2 }),
		"no access":     reencode(func(b []byte) { b[5] = 0 }),
		"reserved":      reencode(func(b []byte) { b[6] = 1 }),
		"zero size":     reencode(func(b []byte) { clear(b[16:24]) }),
		"huge size":     reencode(func(b []byte) { b[16] = 1 }),
		"wraps":         reencode(func(b []byte) { copy(b[8:16], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) }),
	} {
		got := RemoteKey{RKey: 42}
		require.Error(t, got.UnmarshalText(bad), "%s: %q", name, bad)
		require.Equal(t, RemoteKey{RKey: 42}, got, "%s: unchanged on error", name)
	}

	_, err = RemoteKey{}.MarshalText()
	require.Error(t, err, "a key that names no region")
	b, err := RemoteKey{}.AppendText([]byte("x"))
	require.Error(t, err)
	require.Equal(t, "x", string(b), "nothing appended on error")
}

// alphabet is URL-safe base64's, in the order of the values.
const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// FuzzRemoteKeyText: whatever text a peer sends, UnmarshalText accepts
// only a key's canonical text form, and what it accepts is a valid key
// that encodes back to the same bytes.
func FuzzRemoteKeyText(f *testing.F) {
	text, _ := RemoteKey{Addr: 0x1000, Size: 4096, RKey: 1, Access: RemoteRead}.MarshalText()
	f.Add(text)
	f.Add([]byte(strings.Repeat("A", RemoteKeyTextLen)))
	f.Add(append(text[:RemoteKeyTextLen-1:RemoteKeyTextLen-1], 'B'))
	f.Add(append(text[:20:20], append([]byte("\n"), text[20:RemoteKeyTextLen-1]...)...))
	f.Fuzz(func(t *testing.T, text []byte) {
		var k RemoteKey
		if k.UnmarshalText(text) != nil {
			require.Equal(t, RemoteKey{}, k)
			return
		}
		require.NoError(t, k.validate(), "accepted %+v", k)
		again, err := k.MarshalText()
		require.NoError(t, err)
		require.Equal(t, text, again, "the text form is canonical")
	})
}
