package rdma

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// The Listener's refusals and accept states, without a device.

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

func TestDefaultBacklog(t *testing.T) {
	require.Equal(t, 4096, parseSomaxconn([]byte("4096\n"), nil))
	require.Equal(t, 65535, parseSomaxconn([]byte("1000000\n"), nil), "capped as net caps it")
	require.Equal(t, 128, parseSomaxconn(nil, os.ErrNotExist), "no such file (another system)")
	require.Equal(t, 128, parseSomaxconn([]byte("lots"), nil))
	require.Equal(t, 128, parseSomaxconn([]byte("0"), nil))
	require.Positive(t, defaultBacklog())
}
