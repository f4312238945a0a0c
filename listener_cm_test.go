package rdma

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// The listener's rdma_cm side over the fake connection manager
// (cm_test.go): requests answered, connections set up, accepted,
// refused and torn down.

// fakeListen listens over the fake; refusals are recorded.
func fakeListen(t *testing.T, backlog int) (*Listener, *refusalLog) {
	t.Helper()
	log := &refusalLog{}
	lc := ListenConfig{Backlog: backlog, Refused: log.add}
	l, err := lc.Listen(context.Background(), "rdma", "0.0.0.0:7471")
	require.NoError(t, err)
	return l.(*Listener), log
}

type refusalLog struct {
	mu   sync.Mutex
	errs []error
}

func (r *refusalLog) add(_ net.Addr, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *refusalLog) all() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errs...)
}

// rejectedWith waits until id was rejected and destroyed, and returns the
// reason the reject gave.
func rejectedWith(t *testing.T, id *fakeID) RefuseReason {
	t.Helper()
	require.Eventually(t, id.isDestroyed, 5*time.Second, time.Millisecond)
	calls := id.callList()
	require.Contains(t, calls, "Reject", "calls: %v", calls)
	id.mu.Lock()
	defer id.mu.Unlock()
	require.NotEmpty(t, id.private)
	return parseReject(id.private[len(id.private)-1])
}

// A request is set up, accepted with the connection's hello, and, once
// established, handed to Accept; the connection and the listener close
// and nothing of the connection manager is left.
func TestListenerAcceptSequence(t *testing.T) {
	f := useFakeCM(t)
	l, _ := fakeListen(t, 4)
	require.Equal(t, []string{"Bind", "Listen"}, f.ids[0].callList())
	id := f.request(l.handle, f.peerHello.Marshal())
	nc, err := l.Accept()
	require.NoError(t, err)
	c := nc.(*Conn)
	require.Equal(t, []string{"SetAckTimeout", "AcceptRead"}, id.callList())
	h, err := wire.ParseHello(id.private[0])
	require.NoError(t, err)
	require.Equal(t, uint32(0x77), h.RKey)
	require.Equal(t, testBase+uint64(c.lay.recvOff()), h.RingAddr, "the receive ring's address")
	require.Equal(t, "127.0.0.2:40000", c.RemoteAddr().String())
	require.Equal(t, uint64(1), l.Stats().Accepted)
	require.Equal(t, 0, l.Stats().HalfOpen)

	require.NoError(t, c.Close())
	require.NoError(t, l.Close())
	require.ErrorIs(t, l.Close(), net.ErrClosed)
	_, err = l.Accept()
	require.ErrorIs(t, err, net.ErrClosed)
	f.waitReleased(t)
}

// Requests the listener cannot take are refused with their reason, which
// the reject carries, Stats counts and the Refused hook hears; the
// listener goes on.
func TestListenerRefusals(t *testing.T) {
	f := useFakeCM(t)
	l, log := fakeListen(t, 1)

	foreign := f.request(l.handle, []byte("GET / HTTP/1.1"))
	require.Equal(t, RefusedProtocol, rejectedWith(t, foreign))
	require.ErrorIs(t, log.all()[0], ErrProtocol)

	// One handshake in progress (its accept never answered) fills a
	// backlog of one, for now: the next request is told to try again.
	f.on("AcceptRead", func(*fakeID, []byte) error { return nil })
	pending := f.request(l.handle, f.peerHello.Marshal())
	require.Eventually(t, func() bool { return l.Stats().HalfOpen == 1 }, 5*time.Second, time.Millisecond)
	busy := f.request(l.handle, f.peerHello.Marshal())
	require.Equal(t, RefusedBusy, rejectedWith(t, busy))
	s := l.Stats()
	require.Equal(t, uint64(1), s.Refused[RefusedProtocol])
	require.Equal(t, uint64(1), s.Refused[RefusedBusy])

	// The pending one goes with the listener.
	require.NoError(t, l.Close())
	require.True(t, pending.isDestroyed())
	f.waitReleased(t)
}

// A backlog full of established connections nobody accepted refuses as
// RefusedBacklog: trying again does not help until Accept is called.
func TestListenerQueueFull(t *testing.T) {
	f := useFakeCM(t)
	l, _ := fakeListen(t, 1)
	f.request(l.handle, f.peerHello.Marshal())
	require.Eventually(t, func() bool { return l.Stats().Accepted == 1 }, 5*time.Second, time.Millisecond)
	full := f.request(l.handle, f.peerHello.Marshal())
	require.Equal(t, RefusedBacklog, rejectedWith(t, full))
	require.NoError(t, l.Close())
	f.waitReleased(t)
}

// A half-open connection is stale once older than halfOpenStale, or older
// than halfOpenGrace while no handshake completes (for a second, or four
// typical handshakes) or one accepted halfOpenGrace after it has.
func TestHalfOpenStale(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var h handshakes
	// A flood: nothing completes.
	require.False(t, h.stale(t0, t0.Add(halfOpenGrace)))
	require.True(t, h.stale(t0, t0.Add(halfOpenGrace+time.Millisecond)))
	// A burst: handshakes accepted after it keep completing, none a
	// second younger than it.
	h.done(t0.Add(500*time.Millisecond), t0.Add(600*time.Millisecond))
	require.Equal(t, 100*time.Millisecond, h.typical)
	require.Equal(t, halfOpenGrace, h.quiet())
	h.done(t0.Add(500*time.Millisecond), t0.Add(10*time.Second))
	require.Equal(t, 100*time.Millisecond+(9500*time.Millisecond-100*time.Millisecond)/8, h.typical)
	require.Equal(t, 4*h.typical, h.quiet())
	require.False(t, h.stale(t0, t0.Add(10*time.Second)))
	// No completion for quiet(): stale.
	require.False(t, h.stale(t0, t0.Add(10*time.Second+h.quiet())))
	require.True(t, h.stale(t0, t0.Add(10*time.Second+h.quiet()+time.Millisecond)))
	for range 64 {
		h.done(t0, t0.Add(time.Minute))
	}
	require.Equal(t, halfOpenStale, h.quiet(), "at most halfOpenStale")
	h.done(t0.Add(600*time.Millisecond), t0.Add(halfOpenStale))
	require.False(t, h.stale(t0, t0.Add(halfOpenStale)))
	require.True(t, h.stale(t0, t0.Add(halfOpenStale+time.Millisecond)), "at most halfOpenStale")
	// One accepted more than a second after it completed: passed by.
	t1 := t0.Add(20 * time.Second)
	h.done(t1.Add(-time.Second), t1)
	require.False(t, h.stale(t0.Add(19*time.Second), t1))
	require.True(t, h.stale(t0.Add(18*time.Second-time.Millisecond), t1))
	// An older completion does not move doneStarted back.
	h.done(t0, t1.Add(time.Millisecond))
	require.True(t, h.stale(t0.Add(18*time.Second-time.Millisecond), t1.Add(time.Millisecond)))
}

// A connection whose handshake fails after its accept is dropped, never
// handed to Accept, and torn down; so is one whose accept fails.
func TestListenerHandshakeFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(id *fakeID, _ []byte) error
	}{
		{"connect error", func(id *fakeID, _ []byte) error {
			id.answer(rdmacm.EventConnectError, -1, nil)
			return nil
		}},
		{"rejected", func(id *fakeID, _ []byte) error {
			id.answer(rdmacm.EventRejected, 0, nil)
			return nil
		}},
		{"device removed", func(id *fakeID, _ []byte) error {
			id.answer(rdmacm.EventDeviceRemoval, 0, nil)
			return nil
		}},
		{"accept fails", func(*fakeID, []byte) error { return syscall.EINVAL }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := useFakeCM(t)
			l, _ := fakeListen(t, 4)
			f.on("AcceptRead", tc.answer)
			id := f.request(l.handle, f.peerHello.Marshal())
			require.Eventually(t, id.isDestroyed, 5*time.Second, time.Millisecond)
			require.Equal(t, uint64(0), l.Stats().Accepted)
			require.Equal(t, 0, l.Stats().HalfOpen)
			require.NoError(t, l.Close())
			f.waitReleased(t)
		})
	}
}

// A request for a listener already gone is refused as a shutdown by the
// loop itself.
func TestListenerGoneRefuses(t *testing.T) {
	f := useFakeCM(t)
	l, _ := fakeListen(t, 4)
	orphan := f.request(l.handle+1000, f.peerHello.Marshal())
	require.Equal(t, RefusedShutdown, rejectedWith(t, orphan))
	require.NoError(t, l.Close())
	f.waitReleased(t)
}

// The removal of the listener's device, or the loss of the connection
// manager's events, fails Accept with its cause and destroys the id.
func TestListenerLoses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lose  func(f *fakeCM, l *Listener)
		check func(t *testing.T, err error)
	}{
		{"device removed", func(f *fakeCM, l *Listener) {
			f.post(rdmacm.Event{Type: rdmacm.EventDeviceRemoval, Handle: l.handle})
		}, func(t *testing.T, err error) { require.ErrorIs(t, err, ErrNoDevice) }},
		{"events lost", func(f *fakeCM, l *Listener) {
			l.cm.lose(&cmLostError{errors.New("fake: channel unreadable")})
		}, func(t *testing.T, err error) { require.ErrorAs(t, err, new(*cmLostError)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := useFakeCM(t)
			l, _ := fakeListen(t, 4)
			tc.lose(f, l)
			_, err := l.Accept()
			var oe *net.OpError
			require.ErrorAs(t, err, &oe)
			tc.check(t, err)
			require.Eventually(t, f.ids[0].isDestroyed, 5*time.Second, time.Millisecond)
			require.NoError(t, l.Close())
			f.waitReleased(t)
		})
	}
}

// pendingConn is one of the connections accepted by the listener and not
// yet established, or nil.
func (l *Listener) pendingConn() *Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.pending {
		return c
	}
	return nil
}

// A request whose setup waits for a slot (setupSlots all taken) when the
// listener closes is refused as shutting down, with no cause, and torn
// down; Close waits for it.
func TestListenerCloseDuringSetupWait(t *testing.T) {
	f := useFakeCM(t)
	l, log := fakeListen(t, 4)
	for range cap(setupSlots) {
		setupSlots <- struct{}{}
	}
	freed := false
	free := func() {
		if !freed {
			freed = true
			for range cap(setupSlots) {
				<-setupSlots
			}
		}
	}
	defer free()
	id := f.request(l.handle, f.peerHello.Marshal())
	require.Eventually(t, func() bool { return l.Stats().HalfOpen == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, l.Close())
	require.Equal(t, RefusedShutdown, rejectedWith(t, id))
	errs := log.all()
	require.Len(t, errs, 1)
	var rc *refusedCause
	require.False(t, errors.As(errs[0], &rc), "no cause: %v", errs[0])
	free()
	f.waitReleased(t)
}

// A half-open handshake the listener has made no progress past for
// halfOpenGrace (a flood's) is evicted by the next request, which takes
// its place; until then the request is refused as busy.
func TestListenerEvictsWithoutProgress(t *testing.T) {
	f := useFakeCM(t)
	l, _ := fakeListen(t, 1)
	f.on("AcceptRead", func(*fakeID, []byte) error { return nil })
	stale := f.request(l.handle, f.peerHello.Marshal())
	require.Eventually(t, func() bool { return l.Stats().HalfOpen == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, RefusedBusy, rejectedWith(t, f.request(l.handle, f.peerHello.Marshal())))
	time.Sleep(halfOpenGrace + 100*time.Millisecond)
	taker := f.request(l.handle, f.peerHello.Marshal())
	require.Eventually(t, stale.isDestroyed, 5*time.Second, time.Millisecond, "the stale one is torn down")
	require.Eventually(t, func() bool { return l.Stats().HalfOpen == 1 }, 5*time.Second, time.Millisecond, "the new one is half-open")
	require.False(t, taker.isDestroyed())
	s := l.Stats()
	require.Equal(t, uint64(1), s.Evicted)
	require.Equal(t, uint64(1), s.Refused[RefusedBusy])
	require.NoError(t, l.Close())
	require.True(t, taker.isDestroyed())
	f.waitReleased(t)
}
