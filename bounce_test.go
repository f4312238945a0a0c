package rdma

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// ReadAt and WriteAt through the bounce memory, over a QP whose one-sided
// operations complete as they are posted: large transfers go in chunks,
// several in flight; ReadAt past the end is short with io.EOF, WriteAt
// past the end and a key without the access fail before posting.
func TestBounceReadWriteAt(t *testing.T) {
	c, q := benchConn(t)
	q.oneSided = true
	// The bounce memory, as getChunk would register it on first use.
	c.mu.Lock()
	c.os.init()
	c.os.bounce = fakeRegion(c, bounceChunks*bounceChunk)
	for i := bounceChunks - 1; i >= 0; i-- {
		c.os.chunksFree = append(c.os.chunksFree, i)
	}
	c.mu.Unlock()
	const size = 1 << 20
	remote := c.Remote(RemoteKey{Addr: 0x900000, Size: size, RKey: 5, Access: RemoteRead | RemoteWrite})

	p := make([]byte, 5*bounceChunk+123)
	posts := q.posts
	n, err := remote.WriteAt(p, 100)
	require.NoError(t, err)
	require.Equal(t, len(p), n)
	require.Equal(t, 6, q.posts-posts, "one RDMA WRITE per chunk")

	n, err = remote.ReadAt(p, 200)
	require.NoError(t, err)
	require.Equal(t, len(p), n)

	n, err = remote.ReadAt(p[:1000], size-10)
	require.Equal(t, io.EOF, err, "past the end: what there is, and io.EOF")
	require.Equal(t, 10, n)
	_, err = remote.ReadAt(p[:10], size)
	require.Equal(t, io.EOF, err)
	_, err = remote.ReadAt(p[:10], -1)
	require.ErrorIs(t, err, ErrOutOfBounds)
	_, err = remote.WriteAt(p[:1000], size-10)
	require.ErrorIs(t, err, ErrOutOfBounds)

	readOnly := c.Remote(RemoteKey{Addr: 0x900000, Size: size, RKey: 5, Access: RemoteRead})
	posts = q.posts
	_, err = readOnly.WriteAt(p[:10], 0)
	require.ErrorIs(t, err, ErrRemoteAccess)
	require.Equal(t, posts, q.posts, "refused before posting")

	c.mu.Lock()
	require.True(t, c.os.idle(), "every chunk back")
	c.mu.Unlock()
}
