package rdma_test

import (
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// TestStats checks the counters against a known transfer. The server's
// Reads are message-oriented, so the client never merges Writes and every
// Write of n bytes is exactly ceil(n/4096) messages.
func TestStats(t *testing.T) {
	opts := rdma.Options{Messages: true, BufferSize: 4096}
	client, sc := pair(t, &rdma.ListenConfig{Options: opts}, nil)
	server := sc.(*rdma.Conn)
	sizes := []int{1, 4096, 4097, 10000, 100, 3 * 4096}
	total, messages := 0, 0
	for _, n := range sizes {
		total += n
		messages += (n + 4095) / 4096
	}
	// A Read that finds nothing waits (and times out): counted as a spin
	// or a park, whatever the timing of the transfer below.
	require.NoError(t, server.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, err := server.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.NoError(t, server.SetReadDeadline(time.Time{}))
	go func() {
		for _, n := range sizes {
			client.Write(make([]byte, n))
		}
	}()
	buf := make([]byte, 1<<16)
	for i, n := range sizes {
		got, err := io.ReadAtLeast(server, buf, 1)
		require.NoError(t, err)
		require.Equal(t, n, got, "Read %d", i)
	}

	cs, ss := client.Stats(), server.Stats()
	require.Equal(t, uint64(total), cs.BytesWritten)
	require.Equal(t, uint64(messages), cs.MessagesSent)
	require.Equal(t, uint64(total), ss.BytesRead)
	require.Equal(t, uint64(messages), ss.MessagesReceived)
	require.Zero(t, cs.BytesRead)
	require.Zero(t, ss.MessagesSent)
	require.Zero(t, cs.CompletionErrors+ss.CompletionErrors)
	require.Equal(t, registered(t, opts), ss.RegisteredBytes)
	require.Positive(t, ss.Spins+ss.Parks, "the server's Reads waited for data")

	devs := rdma.Devices()
	require.NotEmpty(t, devs)
	var conns, registered int
	for _, d := range devs {
		require.NotEmpty(t, d.Name)
		require.Positive(t, d.CQEntries)
		conns += d.Connections
		registered += d.RegisteredBytes
	}
	require.GreaterOrEqual(t, conns, 2)
	require.GreaterOrEqual(t, registered, ss.RegisteredBytes+cs.RegisteredBytes)
	t.Logf("client %+v\nserver %+v\ndevices %+v", cs, ss, devs)
}
