package rdma

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"time"
)

// A call that libibverbs or librdmacm makes into the kernel may fail for a
// moment (ENOMEM while the host is short of memory, EINTR, a command
// queue that is full) and succeed when made again. The goroutines that
// the process's connections depend on (the CM events' reader, a CQ's
// poller, a device's asynchronous events' reader) therefore try a failed
// call again after a pause that doubles each time, and give up, failing
// what depends on them with the error, only once the failure has lasted.

// retryPause is the first pause; retryTries the tries after the first
// call before giving up: the pauses add up to about a second.
const (
	retryPause = time.Millisecond
	retryTries = 10
)

// retrier paces the tries of one call; the zero value is ready.
type retrier struct{ failures int }

// failed records a failure and returns the pause before the next try, or
// false once the call has failed too often.
func (r *retrier) failed() (time.Duration, bool) {
	r.failures++
	if r.failures > retryTries {
		return 0, false
	}
	return retryPause << (r.failures - 1), true
}

// ok records a success: the next failure starts afresh.
func (r *retrier) ok() { r.failures = 0 }

// sleep pauses for d, or until stop is closed; it reports whether the
// pause ran out (false: stopped).
func sleep(d time.Duration, stop <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

// readEvents runs read (an event channel's Run, whose handler calls ok
// for each event it gets) until it is done for good: stop is closed, the
// channel is closed, or a failure to read has lasted (see retrier), whose
// error it then returns. The event stays queued in the kernel when its
// read fails, so a try after a pause may get it.
func readEvents(read func(ok func()) error, stop <-chan struct{}) error {
	var r retrier
	for {
		err := read(r.ok)
		select {
		case <-stop:
			return nil
		default:
		}
		if err == nil || errors.Is(err, os.ErrClosed) {
			return nil
		}
		pause, again := r.failed()
		if !again {
			return err
		}
		if !sleep(pause, stop) {
			return nil
		}
	}
}

// A Dial refused as RefusedBusy (the listener holds as many handshakes in
// progress as it keeps) tries again after a pause that doubles from
// busyPause up to busyPauseMax, each drawn at random from its upper half
// so that the dialers of one burst come back spread out, until the next
// pause would leave too little of the dial's deadline (every dial has
// one: DefaultDialTimeout) for another try, or its context ends. TCP does
// the same with a SYN that a listener too busy to answer dropped, from 1s
// up; the handshakes here take milliseconds, so the pauses start smaller.
const (
	busyPause    = 5 * time.Millisecond
	busyPauseMax = time.Second
)

// busyBackoff paces a dial's tries after busy refusals; the zero value is
// ready.
type busyBackoff struct {
	next time.Duration // the step of the next pause
	try  time.Duration // the longest refused try so far
}

// refused records a try that the listener refused as busy, and how long
// it took.
func (b *busyBackoff) refused(took time.Duration) { b.try = max(b.try, took) }

// pause returns the pause before the next try, and whether it leaves time
// for that try before the deadline (left: the time to it; negative
// without one). A pause that would leave less than twice the longest
// refused try is not taken: the try after it would most likely run into
// the deadline, and end the dial with a timeout where the refusal says
// more.
func (b *busyBackoff) pause(left time.Duration) (time.Duration, bool) {
	if b.next == 0 {
		b.next = busyPause
	}
	d := b.next/2 + rand.N(b.next/2+1)
	b.next = min(2*b.next, busyPauseMax)
	return d, left < 0 || d+2*b.try <= left
}

// sleepCtx pauses for d, or until ctx ends, whose error it then returns.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if !sleep(d, ctx.Done()) {
		return ctx.Err()
	}
	return nil
}
