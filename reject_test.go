package rdma

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRejectRoundTrip(t *testing.T) {
	for r := RefusedUnknown; r < NumRefuseReasons; r++ {
		require.Equal(t, r, parseReject(marshalReject(r)))
		// Providers may pad the private data.
		require.Equal(t, r, parseReject(append(marshalReject(r), make([]byte, 40)...)))
	}
	require.Equal(t, RefusedUnknown, parseReject(nil), "a foreign server's reject")
	require.Equal(t, RefusedUnknown, parseReject(make([]byte, 56)), "padding only")
	b := marshalReject(RefusedBacklog)
	b[5] = 200
	require.Equal(t, RefusedUnknown, parseReject(b), "a reason this version does not know")
}

func TestRefusedErrorWraps(t *testing.T) {
	for _, tc := range []struct {
		r    RefuseReason
		also error
	}{
		{RefusedLockedMemory, syscall.ENOMEM},
		{RefusedResources, syscall.ENOMEM},
		{RefusedBacklog, syscall.EAGAIN},
		{RefusedShutdown, syscall.ESHUTDOWN},
		{RefusedProtocol, ErrProtocol},
		{RefusedUnknown, nil},
	} {
		err := error(&net.OpError{Op: "dial", Net: "rdma", Err: &RefusedError{tc.r}})
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "%v", tc.r)
		if tc.also != nil {
			require.ErrorIs(t, err, tc.also, "%v", tc.r)
		}
		if tc.r != RefusedUnknown {
			require.Contains(t, err.Error(), tc.r.String())
		}
	}
	// What the Refused hook gets for a failed setup carries both.
	cause := &memlockError{need: 2368 << 10, limit: 64 << 10, err: syscall.ENOMEM}
	err := error(&refusedCause{RefusedError{RefusedLockedMemory}, cause})
	var me *memlockError
	require.True(t, errors.As(err, &me))
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Equal(t, RefusedLockedMemory, refuseReasonOf(cause))
	require.Equal(t, RefusedResources, refuseReasonOf(&mmapError{need: 1, err: syscall.ENOMEM}))
	require.Equal(t, RefusedShutdown, refuseReasonOf(net.ErrClosed))
}

func TestResourceErrorsSayWhatToDo(t *testing.T) {
	me := &memlockError{need: 2368 << 10, limit: 64 << 10, err: syscall.ENOMEM}
	for _, want := range []string{"2368 KiB", "RLIMIT_MEMLOCK 64 KiB", "ulimit -l", "LimitMEMLOCK=infinity", "Options.BufferSize"} {
		require.Contains(t, me.Error(), want)
	}
	require.ErrorIs(t, me, syscall.ENOMEM)

	mm := &mmapError{need: 4 << 20, err: syscall.ENOMEM}
	require.Contains(t, mm.Error(), "4096 KiB")
	require.ErrorIs(t, mm, syscall.ENOMEM)

	cq := &cqLimitError{need: 32790, max: 32767}
	for _, want := range []string{"takes 32790", "32767 per completion queue (max_cqe)", "SendDepth and RecvDepth"} {
		require.Contains(t, cq.Error(), want)
	}
	require.ErrorIs(t, cq, syscall.ENOSPC)
}

// Which dial errors fall back to TCP (FallbackTCP): no RDMA here or at
// the peer, never an answer from an RDMA service or from the caller.
func TestFallsBackToTCP(t *testing.T) {
	noPeer := &noRDMAPeerError{syscall.EHOSTUNREACH}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&deviceError{syscall.ENODEV}, true},
		{ErrUnsupported, true},
		{&RefusedError{RefusedNoListener}, true},
		{noPeer, true},
		{&RefusedError{RefusedShutdown}, false},
		{&RefusedError{RefusedBacklog}, false},
		{errHandshakeAborted, false},
		{context.Canceled, false},
		{os.ErrDeadlineExceeded, false},
	} {
		require.Equal(t, tc.want, fallsBackToTCP(&net.OpError{Op: "dial", Net: "rdma", Err: tc.err}), "%v", tc.err)
	}
	require.ErrorIs(t, noPeer, syscall.EHOSTUNREACH)
	require.Contains(t, noPeer.Error(), "does not answer RDMA connection requests")
	both := &fallbackError{rdma: noPeer, tcp: syscall.ECONNREFUSED}
	require.ErrorIs(t, both, syscall.EHOSTUNREACH)
	require.ErrorIs(t, both, syscall.ECONNREFUSED)
	require.Contains(t, both.Error(), "; over TCP instead: ")
	require.Equal(t, "tcp4", tcpNetwork("rdma4"))
	require.Equal(t, "tcp6", tcpNetwork("rdma6"))
	require.Equal(t, "tcp", tcpNetwork("rdma"))
}

// A Dial whose server dropped the handshake after its reply says so, and
// is ECONNABORTED.
func TestHandshakeAbortedError(t *testing.T) {
	err := os.NewSyscallError("rdma_connect", errHandshakeAborted)
	require.ErrorIs(t, err, syscall.ECONNABORTED)
	require.Contains(t, err.Error(), "the server ended the handshake before it completed")
}

// A refusal is counted, and the Refused hook gets it as an accept error
// naming the reason told to the dialer and this side's cause.
func TestListenerRefusedHook(t *testing.T) {
	var got []error
	l := &Listener{closing: make(chan struct{}), onRefuse: func(_ net.Addr, err error) { got = append(got, err) }}
	cause := errors.New("out of locked memory here")
	l.refused(nil, RefusedLockedMemory, cause)
	l.refused(nil, RefusedBacklog, nil)
	require.Equal(t, uint64(1), l.Stats().Refused[RefusedLockedMemory])
	require.Equal(t, uint64(1), l.Stats().Refused[RefusedBacklog])
	require.Len(t, got, 2)
	var oe *net.OpError
	require.ErrorAs(t, got[0], &oe)
	require.Equal(t, "accept", oe.Op)
	require.ErrorIs(t, got[0], cause)
	require.ErrorIs(t, got[0], syscall.ENOMEM)
	require.Contains(t, got[0].Error(), "out of locked memory here")
	var re *RefusedError
	require.ErrorAs(t, got[1], &re)
	require.Equal(t, RefusedBacklog, re.Reason)
}

// Accept hands out what was established, and says why it cannot once
// the listener is closed or its device gone.
func TestListenerAcceptStates(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	l := &Listener{queue: make(chan *Conn, 1), closing: make(chan struct{}), gone: make(chan struct{})}
	l.queue <- p.c
	c, err := l.Accept()
	require.NoError(t, err)
	require.Same(t, p.c, c)

	l.err = &deviceError{syscall.ENODEV}
	close(l.gone)
	_, err = l.Accept()
	require.ErrorIs(t, err, ErrNoDevice)

	l = &Listener{queue: make(chan *Conn, 1), closing: make(chan struct{}), gone: make(chan struct{})}
	close(l.closing)
	_, err = l.Accept()
	require.ErrorIs(t, err, net.ErrClosed)
	var nilListener *Listener
	_, err = nilListener.Accept()
	require.ErrorIs(t, err, syscall.EINVAL)
}
