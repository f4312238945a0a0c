package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Options: normalization and the completion queue entries they need.

func TestCompletionQueueEntries(t *testing.T) {
	n, err := Options{}.CompletionQueueEntries()
	require.NoError(t, err)
	require.Equal(t, DefaultRecvDepth+DefaultSendDepth+28, n, "receives (+4 control, +1 fin), sends, control sends (4 + fin), one-sided operations (16), the keepalive probe, the drain marker")
	n, err = Options{SendDepth: 1024, RecvDepth: 1024}.CompletionQueueEntries()
	require.NoError(t, err)
	require.Equal(t, 2076, n)
	_, err = Options{SendDepth: -1}.CompletionQueueEntries()
	require.Error(t, err)
}

func TestOptionsNormalized(t *testing.T) {
	defaults := Options{BufferSize: DefaultBufferSize, SendDepth: DefaultSendDepth, RecvDepth: DefaultRecvDepth}
	// buffers picks out the settings under test, so that options added
	// later (with defaults of their own) do not break the comparison.
	buffers := func(o Options) [3]int { return [3]int{o.BufferSize, o.SendDepth, o.RecvDepth} }

	t.Run("valid", func(t *testing.T) {
		for _, tc := range []struct {
			in, want Options
		}{
			{Options{}, defaults},
			{Options{BufferSize: 4096}, Options{BufferSize: 4096, SendDepth: DefaultSendDepth, RecvDepth: DefaultRecvDepth}},
			{Options{SendDepth: 3}, Options{BufferSize: DefaultBufferSize, SendDepth: 3, RecvDepth: DefaultRecvDepth}},
			{Options{RecvDepth: 5}, Options{BufferSize: DefaultBufferSize, SendDepth: DefaultSendDepth, RecvDepth: 5}},
			{Options{BufferSize: minBufferSize, SendDepth: 2, RecvDepth: 2}, Options{BufferSize: minBufferSize, SendDepth: 2, RecvDepth: 2}},
			{Options{BufferSize: maxBufferSize, SendDepth: maxDepth, RecvDepth: maxDepth}, Options{BufferSize: maxBufferSize, SendDepth: maxDepth, RecvDepth: maxDepth}},
		} {
			got, err := tc.in.normalized()
			require.NoError(t, err, "%+v", tc.in)
			require.Equal(t, buffers(tc.want), buffers(got), "%+v", tc.in)
		}
	})

	t.Run("invalid", func(t *testing.T) {
		for _, tc := range []struct {
			in   Options
			want string
		}{
			{Options{BufferSize: minBufferSize - 1}, "BufferSize 255 outside"},
			{Options{BufferSize: maxBufferSize + 1}, "BufferSize 16777217 outside"},
			{Options{BufferSize: -1}, "BufferSize -1 outside"},
			{Options{SendDepth: 1}, "SendDepth 1 outside"},
			{Options{SendDepth: maxDepth + 1}, "SendDepth 1025 outside"},
			{Options{SendDepth: -4}, "SendDepth -4 outside"},
			{Options{RecvDepth: 1}, "RecvDepth 1 outside"},
			{Options{RecvDepth: maxDepth + 1}, "RecvDepth 1025 outside"},
			{Options{RecvDepth: -4}, "RecvDepth -4 outside"},
		} {
			_, err := tc.in.normalized()
			require.Error(t, err, "%+v", tc.in)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "rdma: ")
		}
	})
}
