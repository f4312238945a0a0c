package rdma

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLifecycleFirstErrorWins(t *testing.T) {
	first, second := errors.New("first"), errors.New("second")
	var l lifecycle
	l.failRead(first)
	l.fail(second)
	require.Same(t, first, l.rerr)
	require.Same(t, second, l.werr, "the write side had no error yet")
	l.failWrite(first)
	require.Same(t, second, l.werr)
}

func TestLifecycleResetYieldsToItsCause(t *testing.T) {
	var l lifecycle
	l.fail(syscall.ECONNRESET) // the receives were flushed first
	cause := &wcError{status: 12}
	l.fail(cause)
	require.Equal(t, cause, l.rerr)
	require.Equal(t, cause, l.werr)
	l.fail(syscall.ECONNRESET)
	require.Equal(t, cause, l.rerr, "a cause is never replaced")
}

func TestLifecycleFinKeepsReadsClean(t *testing.T) {
	var l lifecycle
	l.set(shutFinRcvd)
	l.fail(syscall.ECONNRESET)
	require.NoError(t, l.rerr, "after the fin, the stream ends in io.EOF, not an error")
	require.ErrorIs(t, l.werr, syscall.ECONNRESET)
}

func TestLifecycleReadFailed(t *testing.T) {
	var l lifecycle
	require.NoError(t, l.readFailed(3))
	l.set(shutPeerGone)
	require.NoError(t, l.readFailed(3), "flushed receives are still to come and say why")
	require.ErrorIs(t, l.readFailed(0), syscall.ECONNRESET)
	l.failRead(syscall.ETIMEDOUT)
	require.ErrorIs(t, l.readFailed(0), syscall.ETIMEDOUT)
}

func TestLifecycleWriteEnded(t *testing.T) {
	var l lifecycle
	require.NoError(t, l.writeEnded())
	l.failWrite(syscall.ECONNRESET)
	require.ErrorIs(t, l.writeEnded(), syscall.ECONNRESET)
	l.set(shutWrite)
	require.ErrorIs(t, l.writeEnded(), syscall.EPIPE, "after CloseWrite, as TCP after shutdown")
	l.set(shutClosed)
	require.ErrorIs(t, l.writeEnded(), net.ErrClosed)
	require.True(t, l.has(shutWrite|shutClosed))
	require.False(t, l.has(shutRead))
}
