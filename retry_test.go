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
// each drawn from the upper half of its step; a pause fits while it leaves
// twice the longest refused try before the deadline, and always without
// one.
func TestBusyBackoff(t *testing.T) {
	var b busyBackoff
	step := busyPause
	for range 20 {
		d, fits := b.pause(-1)
		require.True(t, fits, "no deadline")
		require.GreaterOrEqual(t, d, step/2)
		require.LessOrEqual(t, d, step)
		step = min(2*step, busyPauseMax)
	}
	require.Equal(t, busyPauseMax, b.next)

	var c busyBackoff
	c.refused(3 * time.Millisecond)
	c.refused(time.Millisecond)
	require.Equal(t, 3*time.Millisecond, c.try, "the longest try")
	d, fits := c.pause(time.Hour)
	require.True(t, fits)
	require.LessOrEqual(t, d, busyPause)
	_, fits = c.pause(10*time.Millisecond + 6*time.Millisecond)
	require.True(t, fits, "the pause (at most 10 ms) and two tries fit")
	_, fits = c.pause(10*time.Millisecond + 5*time.Millisecond)
	require.False(t, fits, "the pause (at least 10 ms) may, the two tries after it do not")
	_, fits = c.pause(0)
	require.False(t, fits, "the deadline has passed")
}
