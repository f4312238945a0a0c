package rdma_test

import (
	"crypto/sha256"
	"hash"
	"io"
	"math/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Device tests of the copy paths: io.Copy into and out of a Conn, through
// ReadFrom and WriteTo.

// roomReader is a Reader that implements nothing else (so io.Copy must use
// the destination's ReadFrom) and records the room each Read was given.
type roomReader struct {
	r     io.Reader
	h     hash.Hash
	rooms []int
}

func (r *roomReader) Read(p []byte) (int, error) {
	r.rooms = append(r.rooms, len(p))
	n, err := r.r.Read(p)
	r.h.Write(p[:n])
	return n, err
}

// lenWriter is a Writer that implements nothing else (so io.Copy must use
// the source's WriteTo) and records the length of each Write.
type lenWriter struct {
	h    hash.Hash
	lens []int
}

func (w *lenWriter) Write(p []byte) (int, error) {
	w.lens = append(w.lens, len(p))
	return w.h.Write(p)
}

// TestCopyPaths checks that io.Copy in both directions goes through
// ReadFrom and WriteTo: with a buffer size of 12,345 bytes, the source's
// Reads get exactly a message's room in the registered ring (io.Copy's own
// buffer would be 32 KiB): 8 KiB in the small ring a connection starts
// with, BufferSize once the stream grew it; and the sink's Writes get one
// message each.
func TestCopyPaths(t *testing.T) {
	opts := rdma.Options{BufferSize: 12345}
	client, server := pair(t, &rdma.ListenConfig{Options: opts}, &rdma.Dialer{Options: opts})
	const total = 16 << 20
	src := &roomReader{r: io.LimitReader(rand.New(rand.NewSource(1)), total), h: sha256.New()}
	errc := make(chan error, 1)
	go func() {
		n, err := io.Copy(client, src)
		if err == nil && n != total {
			err = io.ErrShortWrite
		}
		if err == nil {
			err = client.CloseWrite()
		}
		errc <- err
	}()
	sink := &lenWriter{h: sha256.New()}
	n, err := io.Copy(sink, server)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.Equal(t, int64(total), n)
	require.Equal(t, src.h.Sum(nil), sink.h.Sum(nil))

	require.Equal(t, 8192, src.rooms[0], "the first Read of the source fills a message of the small ring (half its 16 KiB)")
	for _, r := range src.rooms {
		require.LessOrEqual(t, r, 12345)
	}
	require.Equal(t, 12345, src.rooms[len(src.rooms)-1], "once the ring grew, a whole BufferSize")
	for _, l := range sink.lens {
		require.LessOrEqual(t, l, 12345, "each Write of the sink is one message")
	}
	require.Equal(t, uint64(total), client.Stats().BytesWritten)
	require.Equal(t, uint64(total), server.(*rdma.Conn).Stats().BytesRead)
}
