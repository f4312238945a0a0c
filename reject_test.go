package rdma

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRejectRoundTrip(t *testing.T) {
	for r := RefusedUnknown; r < numRefuseReasons; r++ {
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

func FuzzParseReject(f *testing.F) {
	f.Add(marshalReject(RefusedBacklog))
	f.Add([]byte{})
	f.Add(make([]byte, 56))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := parseReject(b)
		if r >= numRefuseReasons {
			t.Fatalf("reason %d out of range", r)
		}
		if r != RefusedUnknown && parseReject(marshalReject(r)) != r {
			t.Fatalf("round trip of %v", r)
		}
	})
}
