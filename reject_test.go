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
		{RefusedBusy, syscall.EAGAIN},
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
		{&RefusedError{RefusedBusy}, false},
		{handshakeAbortedError{}, false},
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
	err := os.NewSyscallError("rdma_connect", handshakeAbortedError{})
	require.ErrorIs(t, err, syscall.ECONNABORTED)
	require.Contains(t, err.Error(), "the server ended the handshake before it completed")
}
