package rdma

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

func newAsyncBed() (*asyncEvents, *fakeCompleter, *fakeCompleter) {
	p := newPoller(&fakeCQ{}, nil)
	a, b := &fakeCompleter{p: p}, &fakeCompleter{p: p}
	p.add(1, a)
	p.add(2, b)
	return &asyncEvents{conns: p}, a, b
}

func TestAsyncQPEventFailsItsConnection(t *testing.T) {
	for _, typ := range []ibv.AsyncEventType{ibv.EventQPFatal, ibv.EventQPReqErr, ibv.EventQPAccessErr, ibv.EventPathMigErr} {
		ev, a, b := newAsyncBed()
		ev.handle(ibv.AsyncEvent{Type: typ, QPNum: 2})
		ev.handle(ibv.AsyncEvent{Type: typ, QPNum: 99}) // a QP no connection owns
		fa, _ := a.failures()
		require.Empty(t, fa, "only the QP's connection")
		fb, removed := b.failures()
		require.Len(t, fb, 1)
		require.False(t, removed)
		require.ErrorIs(t, fb[0], syscall.ECONNRESET)
		require.ErrorContains(t, fb[0], "device event")
	}
}

func TestAsyncDeviceEvents(t *testing.T) {
	ev, a, b := newAsyncBed()
	ev.handle(ibv.AsyncEvent{Type: ibv.EventCQErr})
	for _, c := range []*fakeCompleter{a, b} {
		f, removed := c.failures()
		require.Len(t, f, 1)
		require.ErrorIs(t, f[0], syscall.EIO)
		require.False(t, removed)
	}

	ev, a, b = newAsyncBed()
	ev.handle(ibv.AsyncEvent{Type: ibv.EventDeviceFatal})
	for _, c := range []*fakeCompleter{a, b} {
		f, removed := c.failures()
		require.Len(t, f, 1)
		require.ErrorIs(t, f[0], ErrNoDevice)
		require.True(t, removed, "a dead device's connections let go of it")
	}
}

func TestAsyncPortDown(t *testing.T) {
	old := portDownGrace
	portDownGrace = 20 * time.Millisecond
	defer func() { portDownGrace = old }()

	// A flap shorter than the grace is survived.
	ev, a, _ := newAsyncBed()
	require.Nil(t, ev.portBack())
	ev.handle(ibv.AsyncEvent{Type: ibv.EventPortErr, Port: 1})
	back := ev.portBack()
	require.NotNil(t, back, "no disconnect is sent while the port is down")
	ev.handle(ibv.AsyncEvent{Type: ibv.EventPortActive, Port: 1})
	require.Nil(t, ev.portBack())
	<-back // a release waiting for the port goes on
	time.Sleep(3 * portDownGrace)
	f, _ := a.failures()
	require.Empty(t, f)

	// Down for longer: every connection fails with ENETDOWN, once, and
	// the port counts as down until it is active again.
	ev.handle(ibv.AsyncEvent{Type: ibv.EventPortErr, Port: 1})
	ev.handle(ibv.AsyncEvent{Type: ibv.EventPortErr, Port: 1})
	require.Eventually(t, func() bool { f, _ := a.failures(); return len(f) > 0 }, 5*time.Second, time.Millisecond)
	time.Sleep(3 * portDownGrace)
	f, _ = a.failures()
	require.Len(t, f, 1)
	require.ErrorIs(t, f[0], syscall.ENETDOWN)
	back = ev.portBack()
	require.NotNil(t, back, "still down after the grace")
	ev.handle(ibv.AsyncEvent{Type: ibv.EventPortActive, Port: 1})
	require.Nil(t, ev.portBack())
	<-back

	// Stopped (the device is going away): no more.
	ev, a, _ = newAsyncBed()
	ev.handle(ibv.AsyncEvent{Type: ibv.EventPortErr, Port: 1})
	back = ev.portBack()
	ev.stop()
	<-back // the device is going away: nothing waits for its port
	require.Nil(t, ev.portBack())
	time.Sleep(3 * portDownGrace)
	f, _ = a.failures()
	require.Empty(t, f)
}

func TestConnFailAsync(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	p.c.failAsync(&asyncError{"local work queue catastrophic error", syscall.ECONNRESET}, false)
	_, err := p.c.Read(make([]byte, 1))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.ErrorContains(t, err, "device event: local work queue catastrophic error")
	var oe *net.OpError
	require.True(t, errors.As(err, &oe))
	_, err = p.c.Write([]byte("x"))
	require.ErrorIs(t, err, syscall.ECONNRESET)
}
