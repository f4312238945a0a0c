package rdma

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRetrier(t *testing.T) {
	var r retrier
	var total time.Duration
	for i := 0; i < retryTries; i++ {
		d, ok := r.failed()
		require.True(t, ok, "try %d", i)
		require.Equal(t, retryPause<<i, d)
		total += d
	}
	_, ok := r.failed()
	require.False(t, ok, "gives up after retryTries")
	require.Greater(t, total, 500*time.Millisecond, "a failure may last a moment")
	require.Less(t, total, 2*time.Second, "what depends on it is not kept waiting long")

	r.ok()
	d, ok := r.failed()
	require.True(t, ok)
	require.Equal(t, retryPause, d, "a success starts afresh")
}

func TestSleepStops(t *testing.T) {
	stop := make(chan struct{})
	close(stop)
	require.False(t, sleep(time.Hour, stop))
	require.True(t, sleep(time.Microsecond, make(chan struct{})))
}
