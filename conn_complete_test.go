package rdma

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

// Failed completions over the fake QP: each fails the connection with the
// work completion's status, and wakes whoever waits.

func TestConnFailedCompletions(t *testing.T) {
	const remoteOpErr = 11 // IBV_WC_REM_OP_ERR
	p := newFakeConn(t, 4, 64)
	p.complete(ibv.WC{WRID: p.q.recvs[0].ID, Status: remoteOpErr})
	_, err := p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.ErrorContains(t, err, "work request failed")
	require.NotContains(t, err.Error(), "ibv_poll_cq", "no verb failed: the completion did")

	p = newFakeConn(t, 4, 64)
	p.c.Write([]byte("x"))
	p.complete(ibv.WC{WRID: p.q.posted()[0].ID, Status: remoteOpErr})
	_, err = p.c.Write([]byte("y"))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	_, err = p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ECONNRESET, "a broken connection fails Reads too")

	// The NIC's retries ran out (the peer host vanished): a timeout, as
	// TCP's when its retransmissions go unanswered, for both directions.
	p = newFakeConn(t, 4, 64)
	p.c.Write([]byte("x"))
	p.complete(ibv.WC{WRID: p.q.posted()[0].ID, Status: ibv.WCRetryExcErr})
	_, err = p.c.Write([]byte("y"))
	require.ErrorIs(t, err, syscall.ETIMEDOUT)
	_, err = p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ETIMEDOUT)

	// A flushed receive (the QP went to error) reads as a reset.
	p = newFakeConn(t, 4, 64)
	p.complete(ibv.WC{WRID: p.q.recvs[0].ID, Status: ibv.WCFlushErr})
	_, err = p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.Equal(t, "connection reset by peer", errors.Unwrap(err).Error())
}

// A failed receive (a peer's SEND with payload, a refused RDMA access)
// breaks the QP: a Write waiting for credit fails at once with the cause,
// not when the CM gives up on a disconnect the peer never answers.
func TestConnFailedReceiveWakesWriter(t *testing.T) {
	const remoteOpErr = 11 // IBV_WC_REM_OP_ERR
	p := newFakeConn(t, 1, 64)
	require.NoError(t, p.c.SetNoDelay(true))
	_, err := p.c.Write([]byte("x")) // spends the only credit
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := p.c.Write(bytes.Repeat([]byte("y"), 1000)) // more than one pending message
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the Write returned before the peer answered: %v", err)
	default:
	}
	p.complete(ibv.WC{WRID: p.q.recvs[0].ID, Status: remoteOpErr})
	select {
	case err := <-done:
		require.ErrorIs(t, err, syscall.ECONNRESET)
		require.ErrorContains(t, err, "work request failed")
	case <-time.After(10 * time.Second):
		t.Fatal("a Write waiting for credit did not see the failed receive")
	}
	_, err = p.c.Read(make([]byte, 8))
	require.ErrorContains(t, err, "work request failed")
	// Close does not linger for a fin that cannot go.
	p.c.mu.Lock()
	require.Error(t, p.c.sendFinDroppingLock())
	p.c.mu.Unlock()
}
