package rdma

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Deadlines without a device: past, future, extended, cleared, and moved
// earlier while a call waits.

func TestDeadlinePast(t *testing.T) {
	d := newDeadline()
	defer d.stop()
	require.False(t, d.expired(), "a new deadline is unset")

	d.set(time.Now().Add(-time.Second))
	require.True(t, isClosed(d.wait()), "a past deadline is expired at once")
	require.True(t, d.expired())

	// Setting it again, to now or the past, keeps it expired (and must not
	// close the channel twice).
	d.set(time.Now())
	require.True(t, d.expired())
	d.set(time.Now().Add(-time.Hour))
	require.True(t, d.expired())
}

func TestDeadlineFuture(t *testing.T) {
	d := newDeadline()
	defer d.stop()

	d.set(time.Now().Add(time.Hour))
	require.False(t, d.expired(), "a deadline an hour away has not passed")

	target := time.Now().Add(20 * time.Millisecond)
	d.set(target)
	select {
	case <-d.wait():
	case <-time.After(2 * time.Second):
		t.Fatal("deadline 20ms away not passed within 2s")
	}
	require.False(t, time.Now().Before(target), "deadline passed early")
	require.True(t, d.expired())
}

func TestDeadlineExtendWhileWaiting(t *testing.T) {
	d := newDeadline()
	defer d.stop()

	start := time.Now()
	old, later := start.Add(30*time.Millisecond), start.Add(200*time.Millisecond)
	d.set(old)
	ch := d.wait()
	woke := make(chan time.Time, 1)
	go func() {
		select {
		case <-ch:
			woke <- time.Now()
		case <-time.After(5 * time.Second):
			woke <- time.Time{}
		}
	}()
	d.set(later)
	if d.wait() != ch {
		// Only a passed deadline gets a new channel.
		t.Skip("the first deadline passed before it could be moved: machine too slow")
	}
	at := <-woke
	require.False(t, at.IsZero(), "waiter not woken within 5s of the moved deadline")
	require.Falsef(t, at.Before(later), "waiter woke %v after start, before the moved deadline (%v); the old one was %v",
		at.Sub(start), later.Sub(start), old.Sub(start))
	require.True(t, d.expired())
}

func TestDeadlineExtendAfterPassing(t *testing.T) {
	d := newDeadline()
	defer d.stop()

	d.set(time.Now().Add(-time.Second))
	require.True(t, d.expired())
	d.set(time.Now().Add(time.Hour))
	require.False(t, d.expired(), "a later deadline re-arms a passed one")
}

func TestDeadlineClear(t *testing.T) {
	d := newDeadline()
	defer d.stop()

	d.set(time.Now().Add(-time.Second))
	require.True(t, d.expired())
	d.set(time.Time{})
	require.False(t, d.expired(), "the zero time clears a passed deadline")

	// Clearing a pending deadline cancels it.
	d.set(time.Now().Add(20 * time.Millisecond))
	d.set(time.Time{})
	ch := d.wait()
	time.Sleep(100 * time.Millisecond)
	require.False(t, isClosed(ch), "a cleared deadline fired")
	require.False(t, d.expired())
}

func TestDeadlineEarlierWakesWaiter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		earlier time.Duration
	}{
		{"soon", 10 * time.Millisecond},
		{"now", 0},
		{"past", -time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDeadline()
			defer d.stop()

			d.set(time.Now().Add(time.Hour))
			ch := d.wait()
			waiting := make(chan struct{})
			woke := make(chan bool, 1)
			go func() {
				close(waiting)
				select {
				case <-ch:
					woke <- true
				case <-time.After(5 * time.Second):
					woke <- false
				}
			}()
			<-waiting
			time.Sleep(10 * time.Millisecond) // let the waiter reach its select
			d.set(time.Now().Add(tc.earlier))
			select {
			case ok := <-woke:
				require.True(t, ok, "waiter not woken")
			case <-time.After(2 * time.Second):
				t.Fatal("waiter not woken within 2s of an earlier deadline")
			}
			require.True(t, d.expired())
		})
	}
}
