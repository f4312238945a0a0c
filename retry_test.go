package rdma

import (
	"errors"
	"os"
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

// readEvents tries a failed read again, starts afresh after an event, and
// gives up with the error of a failure that lasts.
func TestReadEvents(t *testing.T) {
	fail := errors.New("read failed")
	calls := 0
	err := readEvents(func(ok func()) error {
		calls++
		if calls == 3 {
			ok() // an event: the failures so far are forgotten
		}
		return fail
	}, make(chan struct{}))
	require.ErrorIs(t, err, fail)
	require.Equal(t, 3+retryTries, calls, "tries after the last event")

	calls = 0
	require.NoError(t, readEvents(func(func()) error { calls++; return os.ErrClosed }, make(chan struct{})))
	require.Equal(t, 1, calls, "a closed channel ends it")

	stop := make(chan struct{})
	close(stop)
	require.NoError(t, readEvents(func(func()) error { return fail }, stop), "stopped")
}

// The pauses after busy refusals double from busyPause up to busyPauseMax,
// each drawn from the upper half of its step.
func TestBusyBackoff(t *testing.T) {
	var b busyBackoff
	step := busyPause
	for range 20 {
		d := b.pause()
		require.GreaterOrEqual(t, d, step/2)
		require.LessOrEqual(t, d, step)
		step = min(2*step, busyPauseMax)
	}
	require.Equal(t, busyPauseMax, b.next)
}
