package rdma

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// The dial sequence over the fake connection manager (cm_test.go),
// and the classification of its answers.

// What each answer of the connection manager to a dial step makes of the
// dial: the error's chain, and its syscall.
func TestDialClassifiesAnswers(t *testing.T) {
	refused := func(r RefuseReason) func(*testing.T, error) {
		return func(t *testing.T, err error) {
			var re *RefusedError
			require.ErrorAs(t, err, &re)
			require.Equal(t, r, re.Reason)
			require.ErrorIs(t, err, syscall.ECONNREFUSED)
		}
	}
	aborted := func(t *testing.T, err error) {
		require.ErrorAs(t, err, new(handshakeAbortedError))
	}
	is := func(target error) func(*testing.T, error) {
		return func(t *testing.T, err error) { require.ErrorIs(t, err, target) }
	}
	for _, tc := range []struct {
		name    string
		ev      rdmacm.Event
		syscall string
		check   func(*testing.T, error)
	}{
		{"established", rdmacm.Event{Type: rdmacm.EventEstablished}, "", nil},
		{"refused with a reason", rdmacm.Event{Type: rdmacm.EventRejected, PrivateData: marshalReject(RefusedBacklog)}, "rdma_connect", refused(RefusedBacklog)},
		{"refused by IB: no listener", rdmacm.Event{Type: rdmacm.EventRejected, Status: rdmacm.RejectInvalidServiceID}, "rdma_connect", refused(RefusedNoListener)},
		{"refused by iWARP: SYN reset", rdmacm.Event{Type: rdmacm.EventRejected, Status: -int(syscall.ECONNREFUSED)}, "rdma_connect", refused(RefusedNoListener)},
		{"refused as stale", rdmacm.Event{Type: rdmacm.EventRejected, Status: rdmacm.RejectStaleConn}, "rdma_connect", func(t *testing.T, err error) {
			require.ErrorAs(t, err, new(staleConnError))
			require.ErrorIs(t, err, syscall.ECONNREFUSED)
		}},
		{"reset during MPA", rdmacm.Event{Type: rdmacm.EventRejected, Status: -int(syscall.ECONNRESET)}, "rdma_connect", aborted},
		{"refused, unknown", rdmacm.Event{Type: rdmacm.EventRejected, Status: 28}, "rdma_connect", refused(RefusedUnknown)},
		{"unreachable", rdmacm.Event{Type: rdmacm.EventUnreachable, Status: -int(syscall.ETIMEDOUT)}, "rdma_connect", func(t *testing.T, err error) {
			require.ErrorAs(t, err, new(*noRDMAPeerError))
			require.ErrorIs(t, err, syscall.ETIMEDOUT)
		}},
		{"connect error", rdmacm.Event{Type: rdmacm.EventConnectError, Status: -1}, "rdma_connect", aborted},
		{"disconnected, reset", rdmacm.Event{Type: rdmacm.EventDisconnected, Status: -int(syscall.ECONNRESET)}, "rdma_connect", aborted},
		{"other, its errno", rdmacm.Event{Type: rdmacm.EventAddrChange, Status: -int(syscall.ENETUNREACH)}, "rdma_connect", is(syscall.ENETUNREACH)},
		{"other, lost", rdmacm.Event{Type: rdmacm.EventAddrChange, Status: -1}, "rdma_connect", is(errEventLost)},
		{"other, none", rdmacm.Event{Type: rdmacm.EventAddrChange}, "rdma_connect", is(syscall.ECONNABORTED)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := connectOutcome(tc.ev)
			if tc.check == nil {
				require.NoError(t, err)
				return
			}
			var se *os.SyscallError
			require.ErrorAs(t, err, &se)
			require.Equal(t, tc.syscall, se.Syscall)
			tc.check(t, err)
		})
	}

	require.NoError(t, addrResolved(rdmacm.Event{Type: rdmacm.EventAddrResolved}))
	require.ErrorIs(t, addrResolved(rdmacm.Event{Type: rdmacm.EventAddrError}), syscall.EHOSTUNREACH)
	require.ErrorIs(t, addrResolved(rdmacm.Event{Type: rdmacm.EventAddrError, Status: -int(syscall.ENODEV)}), ErrNoDevice)
	require.ErrorIs(t, addrResolved(rdmacm.Event{Type: rdmacm.EventAddrError, Status: -int(syscall.EINVAL)}), ErrNoDevice, "iWARP's no device")
	require.NoError(t, routeResolved(rdmacm.Event{Type: rdmacm.EventRouteResolved}))
	require.ErrorIs(t, routeResolved(rdmacm.Event{Type: rdmacm.EventRouteError, Status: -int(syscall.ETIMEDOUT)}), syscall.ETIMEDOUT)
	require.ErrorIs(t, routeResolved(rdmacm.Event{Type: rdmacm.EventRouteError, Status: -int(syscall.EADDRNOTAVAIL)}), ErrNoDevice)

	refused(RefusedNoListener)(t, connectCallError(syscall.ECONNREFUSED))
	aborted(t, connectCallError(syscall.ECONNRESET))
	require.Equal(t, syscall.EIO, connectCallError(syscall.EIO))
	require.True(t, portTaken(os.NewSyscallError("rdma_connect", syscall.EADDRNOTAVAIL)))
	require.False(t, portTaken(os.NewSyscallError("rdma_resolve_addr", syscall.EADDRNOTAVAIL)))
}

// fakeDial dials through the public API over the fake.
func fakeDial(t *testing.T, timeout time.Duration) (*Conn, error) {
	t.Helper()
	d := Dialer{Timeout: timeout}
	c, err := d.DialContext(context.Background(), "rdma", "127.0.0.1:7471")
	if err != nil {
		return nil, err
	}
	return c.(*Conn), nil
}

// A dial runs the connection manager's steps in order, announces its
// receive ring, and gets an established connection; its Close disconnects
// and destroys the id, and the loop goes with its last reference.
func TestDialSequence(t *testing.T) {
	f := useFakeCM(t)
	c, err := fakeDial(t, 5*time.Second)
	require.NoError(t, err)
	id := f.ids[0]
	require.Equal(t, []string{"ResolveAddr", "ResolveRoute", "SetAckTimeout", "ConnectRead"}, id.callList())
	h, err := wire.ParseHello(id.private[0])
	require.NoError(t, err)
	require.Equal(t, uint32(0x77), h.RKey, "the receive ring's key")
	require.Equal(t, testBase+uint64(c.lay.recvOff()), h.RingAddr, "the receive ring's address")
	require.Equal(t, "127.0.0.1:7471", c.RemoteAddr().String())
	require.Equal(t, "127.0.0.1:40001", c.LocalAddr().String())
	c.mu.Lock()
	require.Equal(t, phaseEstablished, c.life.phase)
	require.True(t, c.cmUp)
	c.mu.Unlock()

	require.NoError(t, c.Close())
	f.waitReleased(t)
	calls := id.callList()
	require.Contains(t, calls, "Disconnect")
	require.Equal(t, "Destroy", calls[len(calls)-1], "the id goes last")
	require.ErrorIs(t, c.Close(), net.ErrClosed)
}

// Every way a dial fails returns its error, leaves no id and no loop
// behind, and a stale QP or a port TCP still holds takes another try.
func TestDialFailures(t *testing.T) {
	post := func(ty rdmacm.EventType, status int, private []byte) func(*fakeID, []byte) error {
		return func(id *fakeID, _ []byte) error {
			id.answer(ty, status, private)
			return nil
		}
	}
	fail := func(err error) func(*fakeID, []byte) error {
		return func(*fakeID, []byte) error { return err }
	}
	for _, tc := range []struct {
		name     string
		call     string
		answer   func(*fakeID, []byte) error
		attempts int
		check    func(*testing.T, error)
	}{
		{"address unresolved", "ResolveAddr", post(rdmacm.EventAddrError, -int(syscall.EHOSTUNREACH), nil), 1,
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.EHOSTUNREACH) }},
		{"no device for the address", "ResolveAddr", fail(os.NewSyscallError("rdma_resolve_addr", syscall.ENODEV)), 1,
			func(t *testing.T, err error) { require.ErrorIs(t, err, ErrNoDevice) }},
		{"route unresolved", "ResolveRoute", post(rdmacm.EventRouteError, -int(syscall.ETIMEDOUT), nil), 1,
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.ETIMEDOUT) }},
		{"device removed", "ResolveRoute", post(rdmacm.EventDeviceRemoval, 0, nil), 1,
			func(t *testing.T, err error) { require.ErrorIs(t, err, ErrNoDevice) }},
		{"refused", "ConnectRead", post(rdmacm.EventRejected, 0, marshalReject(RefusedBacklog)), 1,
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.ECONNREFUSED) }},
		{"stale, three tries", "ConnectRead", post(rdmacm.EventRejected, rdmacm.RejectStaleConn, nil), dialAttempts,
			func(t *testing.T, err error) { require.ErrorAs(t, err, new(staleConnError)) }},
		{"port taken, three tries", "ConnectRead", fail(os.NewSyscallError("rdma_connect", syscall.EADDRNOTAVAIL)), dialAttempts,
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.EADDRNOTAVAIL) }},
		{"a foreign server", "ConnectRead", post(rdmacm.EventEstablished, 0, []byte("not a hello")), 1,
			func(t *testing.T, err error) { require.ErrorIs(t, err, ErrProtocol) }},
		{"ack timeout refused", "SetAckTimeout", fail(os.NewSyscallError("rdma_set_option", syscall.EINVAL)), 1,
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.EINVAL) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := useFakeCM(t)
			f.on(tc.call, tc.answer)
			c, err := fakeDial(t, 5*time.Second)
			require.Nil(t, c)
			var oe *net.OpError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, "dial", oe.Op)
			require.Equal(t, "rdma", oe.Net)
			tc.check(t, err)
			f.waitReleased(t)
			require.Len(t, f.ids, tc.attempts)
		})
	}
}

// A dial the connection manager never answers ends at its deadline with
// net's timeout error, and leaves nothing behind.
func TestDialTimeout(t *testing.T) {
	for _, step := range []string{"ResolveAddr", "ResolveRoute", "ConnectRead"} {
		t.Run(step, func(t *testing.T) {
			f := useFakeCM(t)
			f.on(step, func(*fakeID, []byte) error { return nil })
			_, err := fakeDial(t, 30*time.Millisecond)
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			var ne net.Error
			require.ErrorAs(t, err, &ne)
			require.True(t, ne.Timeout())
			f.waitReleased(t)
		})
	}
}

// A dial whose id cannot be created fails with the call's error and lets
// the loop go.
func TestDialNoID(t *testing.T) {
	f := useFakeCM(t)
	f.newIDErr = os.NewSyscallError("rdma_create_id", syscall.ENOMEM)
	_, err := fakeDial(t, time.Second)
	require.ErrorIs(t, err, syscall.ENOMEM)
	f.waitReleased(t)
}

// The connection manager's events reach an established connection: the
// peer's disconnect ends its reads, a device's removal fails them with
// ErrNoDevice; either way the connection is released.
func TestDialedConnEvents(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ev    rdmacm.EventType
		check func(*testing.T, error)
	}{
		{"disconnected", rdmacm.EventDisconnected, func(t *testing.T, err error) {
			if err != io.EOF {
				require.ErrorIs(t, err, syscall.ECONNRESET)
			}
		}},
		{"device removed", rdmacm.EventDeviceRemoval, func(t *testing.T, err error) { require.ErrorIs(t, err, ErrNoDevice) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := useFakeCM(t)
			c, err := fakeDial(t, 5*time.Second)
			require.NoError(t, err)
			f.ids[0].answer(tc.ev, 0, nil)
			_, err = c.Read(make([]byte, 1))
			require.Error(t, err)
			tc.check(t, err)
			c.Close()
			f.waitReleased(t)
		})
	}
}

// A dial whose connection manager loses its event channel fails with the
// loss as its cause.
func TestDialCMLost(t *testing.T) {
	f := useFakeCM(t)
	var lost *cmLoop
	f.on("ResolveRoute", func(*fakeID, []byte) error {
		cmMu.Lock()
		lost = theCM
		cmMu.Unlock()
		lost.lose(&cmLostError{errors.New("fake: channel unreadable")})
		return nil
	})
	_, err := fakeDial(t, 5*time.Second)
	require.ErrorAs(t, err, new(*cmLostError))
	f.waitReleased(t)
}

// A dial refused as busy tries again after a pause, not counted against
// dialAttempts, and connects once the listener takes it; every refused
// try's id is destroyed.
func TestDialTriesAgainWhenBusy(t *testing.T) {
	f := useFakeCM(t)
	busy := 5
	f.on("ConnectRead", func(id *fakeID, _ []byte) error {
		if busy > 0 {
			busy--
			id.answer(rdmacm.EventRejected, 0, marshalReject(RefusedBusy))
			return nil
		}
		id.answer(rdmacm.EventEstablished, 0, f.peerHello.Marshal())
		return nil
	})
	c, err := fakeDial(t, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, f.ids, 6, "five busy refusals, then the connection")
	for _, id := range f.ids[:5] {
		require.True(t, id.isDestroyed())
	}
	require.NoError(t, c.Close())
	f.waitReleased(t)
}

// A dial refused as busy until its deadline ends with the refusal once the
// next pause would leave no time for another try: at about the deadline,
// not after a pause past it.
func TestDialBusyUntilDeadline(t *testing.T) {
	f := useFakeCM(t)
	f.on("ConnectRead", func(id *fakeID, _ []byte) error {
		id.answer(rdmacm.EventRejected, 0, marshalReject(RefusedBusy))
		return nil
	})
	start := time.Now()
	_, err := fakeDial(t, 200*time.Millisecond)
	var re *RefusedError
	require.ErrorAs(t, err, &re)
	require.Equal(t, RefusedBusy, re.Reason)
	require.ErrorIs(t, err, syscall.EAGAIN)
	require.Less(t, time.Since(start), 300*time.Millisecond)
	require.Greater(t, len(f.ids), 1, "tried again")
	f.waitReleased(t)
}

// A dial refused as busy whose deadline passes in the try after the pause
// (the listener does not answer it) returns the refusal too, as it would
// have had it stopped before the pause; a cancellation returns as the
// caller's own.
func TestDialBusyThenDeadline(t *testing.T) {
	for _, cancel := range []bool{false, true} {
		t.Run(map[bool]string{false: "deadline", true: "cancel"}[cancel], func(t *testing.T) {
			f := useFakeCM(t)
			var tries atomic.Int32
			asked := make(chan struct{})
			f.on("ConnectRead", func(id *fakeID, _ []byte) error {
				if tries.Add(1) == 1 {
					id.answer(rdmacm.EventRejected, 0, marshalReject(RefusedBusy))
				} else {
					close(asked) // and no answer
				}
				return nil
			})
			ctx, stop := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer stop()
			if cancel {
				go func() {
					<-asked
					stop()
				}()
			}
			_, err := (&Dialer{}).DialContext(ctx, "rdma", "127.0.0.1:7471")
			require.EqualValues(t, 2, tries.Load())
			if cancel {
				require.ErrorIs(t, err, context.Canceled)
				require.NotErrorAs(t, err, new(*RefusedError))
			} else {
				var re *RefusedError
				require.ErrorAs(t, err, &re)
				require.Equal(t, RefusedBusy, re.Reason)
			}
			f.waitReleased(t)
		})
	}
}

// At most maxDialsInFlight dials to one address hold a turn; the others
// wait, or give up with their context; the table empties when all are done.
func TestDialSlots(t *testing.T) {
	var s slotsByAddr
	s.m = map[netip.AddrPort]*addrSlots{}
	a := netip.MustParseAddrPort("10.0.0.1:7471")
	b := netip.MustParseAddrPort("10.0.0.2:7471")
	var releases []func()
	for range maxDialsInFlight {
		r, err := s.acquire(context.Background(), a)
		require.NoError(t, err)
		releases = append(releases, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := s.acquire(ctx, a)
	require.ErrorIs(t, err, context.DeadlineExceeded, "all of a's turns are taken")
	rb, err := s.acquire(context.Background(), b)
	require.NoError(t, err, "another address has turns of its own")
	rb()
	got := make(chan func(), 1)
	go func() {
		r, err := s.acquire(context.Background(), a)
		if err == nil {
			got <- r
		}
	}()
	releases[0]()
	r := <-got
	r()
	for _, r := range releases[1:] {
		r()
	}
	require.Empty(t, s.m)

	// A turn held past holdFor is given back for the next dial; its own
	// release later gives back nothing more.
	s.holdFor = 20 * time.Millisecond
	releases = releases[:0]
	for range maxDialsInFlight {
		r, err := s.acquire(context.Background(), a)
		require.NoError(t, err)
		releases = append(releases, r)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	late, err := s.acquire(ctx, a)
	require.NoError(t, err, "a turn held past holdFor came free")
	for _, r := range releases {
		r()
	}
	late()
	require.Empty(t, s.m)
	require.Empty(t, dialSlots.m, "the process's table is empty between dials")
}
