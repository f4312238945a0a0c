package rdma

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The Tracer's and Logger's events over the fakes and over the fallbacks
// (no RDMA device serves 127.0.0.1, here or in the test bed);
// tracer_dev_test.go has them on the device.

// events records a Tracer's calls in order.
type events struct {
	mu  sync.Mutex
	got []string
	all []any
}

func (e *events) add(name string, info any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, name)
	e.all = append(e.all, info)
}

func (e *events) names() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

// tracer returns a Tracer that records every event in e.
func (e *events) tracer() *Tracer {
	return &Tracer{
		DialStart:       func(i DialStartInfo) { e.add("DialStart", i) },
		DialDone:        func(i DialDoneInfo) { e.add("DialDone", i) },
		Fallback:        func(i FallbackInfo) { e.add("Fallback", i) },
		Refused:         func(i RefusedInfo) { e.add("Refused", i) },
		KeepAliveFailed: func(i ConnEventInfo) { e.add("KeepAliveFailed", i) },
		RingResized:     func(i RingResizedInfo) { e.add("RingResized", i) },
		DeviceRemoved:   func(i DeviceRemovedInfo) { e.add("DeviceRemoved", i) },
		ConnClosed:      func(i ConnClosedInfo) { e.add("ConnClosed", i) },
	}
}

// logRecords is a Logger that keeps its records as JSON objects.
type logRecords struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logRecords) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

func (l *logRecords) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logRecords) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		out = append(out, m)
	}
	return out
}

func TestTracerDialFallsBackToTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var ev events
	var logs logRecords
	d := Dialer{FallbackTCP: true, Tracer: ev.tracer(), Logger: logs.logger(), Timeout: 5 * time.Second}
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.False(t, IsRDMA(c))

	require.Equal(t, []string{"DialStart", "Fallback", "DialDone"}, ev.names())
	require.Equal(t, DialStartInfo{Network: "rdma", Address: ln.Addr().String()}, ev.all[0])
	fb := ev.all[1].(FallbackInfo)
	require.Equal(t, "dial", fb.Op)
	require.Equal(t, "tcp", fb.Network)
	require.Equal(t, ln.Addr().String(), fb.Address)
	require.True(t, errors.Is(fb.Reason, ErrNoDevice) || errors.Is(fb.Reason, ErrUnsupported), "%v", fb.Reason)
	done := ev.all[2].(DialDoneInfo)
	require.Equal(t, "tcp", done.Network)
	require.NoError(t, done.Err)
	require.Equal(t, c.LocalAddr(), done.Local)
	require.Equal(t, c.RemoteAddr(), done.Remote)
	require.Positive(t, done.Duration)
	require.Zero(t, done.Route, "the RDMA dial never resolved a route")

	recs := logs.records(t)
	require.Len(t, recs, 1, "one record: the fallback")
	require.Equal(t, "INFO", recs[0]["level"])
	require.Equal(t, "rdma: falling back to tcp", recs[0]["msg"])
	require.Equal(t, "dial", recs[0]["op"])
}

func TestTracerDialFailsWithoutFallback(t *testing.T) {
	var ev events
	var logs logRecords
	d := Dialer{Tracer: ev.tracer(), Logger: logs.logger()}
	_, err := d.Dial("rdma", "127.0.0.1:7")
	require.Error(t, err)
	require.Equal(t, []string{"DialStart", "DialDone"}, ev.names())
	done := ev.all[1].(DialDoneInfo)
	require.Equal(t, "rdma", done.Network)
	require.Equal(t, err, done.Err, "the dial's own error")
	require.Nil(t, done.Local)
	require.Nil(t, done.Remote)
	recs := logs.records(t)
	require.Len(t, recs, 1)
	require.Equal(t, "DEBUG", recs[0]["level"])
	require.Equal(t, "rdma: dial failed", recs[0]["msg"])
}

func TestTracerListenFallsBack(t *testing.T) {
	var ev events
	lc := ListenConfig{FallbackTCP: true, FallbackUDP: true, Tracer: ev.tracer()}
	ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	pc, err := lc.ListenPacket(context.Background(), "rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer pc.Close()
	require.Equal(t, []string{"Fallback", "Fallback"}, ev.names())
	l, p := ev.all[0].(FallbackInfo), ev.all[1].(FallbackInfo)
	require.Equal(t, "listen", l.Op)
	require.Equal(t, "tcp", l.Network)
	require.Equal(t, ln.Addr().String(), l.Address)
	require.Equal(t, "listenpacket", p.Op)
	require.Equal(t, "udp", p.Network)
	require.Equal(t, pc.LocalAddr().String(), p.Address)
	for _, f := range []FallbackInfo{l, p} {
		require.True(t, errors.Is(f.Reason, ErrNoDevice) || errors.Is(f.Reason, ErrUnsupported), "%v", f.Reason)
	}
}

// TestTracerConnClosed: a connection handed out reports its end once,
// with why it failed; one never handed out reports nothing.
func TestTracerConnClosed(t *testing.T) {
	// The fake's writes never complete: the release's drain gives up on
	// them at once.
	defer func(d time.Duration) { drainTimeout = d }(drainTimeout)
	drainTimeout = time.Millisecond
	var ev events
	var logs logRecords
	p := newFakeConn(t, 4, 64)
	p.c.obs = newObserver(ev.tracer(), logs.logger())
	p.c.born = time.Now().Add(-time.Second)
	p.c.observe(nil)
	_, err := p.c.Write([]byte("abc"))
	require.NoError(t, err)
	p.c.mu.Lock()
	p.c.fail(&protocolError{"a test's violation"})
	p.c.mu.Unlock()
	p.c.release()
	p.c.release()
	require.Equal(t, []string{"ConnClosed"}, ev.names())
	info := ev.all[0].(ConnClosedInfo)
	require.ErrorIs(t, info.Err, ErrProtocol)
	require.GreaterOrEqual(t, info.Duration, time.Second)
	require.Equal(t, uint64(3), info.Stats.BytesWritten)
	recs := logs.records(t)
	require.Len(t, recs, 1)
	require.Equal(t, "WARN", recs[0]["level"], "a peer that breaks the protocol is worth a warning")
	require.Equal(t, "rdma: connection closed", recs[0]["msg"])

	q := newFakeConn(t, 4, 64)
	var none events
	q.c.obs = newObserver(none.tracer(), nil)
	q.c.release()
	require.Empty(t, none.names(), "never handed out: nothing to report")
}

func TestTracerKeepAliveFailed(t *testing.T) {
	var ev events
	p := newFakeConn(t, 4, 64)
	p.c.obs = newObserver(ev.tracer(), nil)
	cfg := net.KeepAliveConfig{Enable: true, Idle: 8 * time.Millisecond, Interval: 10 * time.Millisecond, Count: 2}
	require.NoError(t, p.c.SetKeepAliveConfig(cfg))
	_, err := p.c.Read(make([]byte, 8))
	require.ErrorIs(t, err, syscall.ETIMEDOUT)
	require.Eventually(t, func() bool { return len(ev.names()) == 1 }, 5*time.Second, time.Millisecond)
	require.Equal(t, []string{"KeepAliveFailed"}, ev.names())
	info := ev.all[0].(ConnEventInfo)
	require.ErrorIs(t, info.Err, syscall.ETIMEDOUT)
	require.ErrorContains(t, info.Err, "keepalive")
}

func TestTracerRingResized(t *testing.T) {
	noShrink(t)
	a, b := newWire(t, Options{}, Options{})
	got := make(chan RingResizedInfo, 4)
	b.c.obs = newObserver(&Tracer{RingResized: func(i RingResizedInfo) { got <- i }}, nil)
	stream(t, a.c, b.c, 4<<20, 64<<10)
	select {
	case info := <-got:
		require.True(t, info.Grew)
		require.Equal(t, 1<<20, info.Size, "the big receive ring")
	case <-time.After(5 * time.Second):
		t.Fatal("no RingResized for the ring's growth")
	}
	require.Len(t, got, 0, "one growth, one event")
}

// TestObserverUnset: with neither a Tracer nor a Logger there is no
// observer, and every event on a nil one does nothing.
func TestObserverUnset(t *testing.T) {
	require.Nil(t, newObserver(nil, nil))
	var o *observer
	o.dialStart("rdma", "x")
	o.dialDone(DialDoneInfo{})
	o.fallback(FallbackInfo{})
	o.refused(nil, nil)
	o.keepAliveFailed(ConnEventInfo{})
	o.ringResized(RingResizedInfo{})
	o.deviceRemoved(DeviceRemovedInfo{})
	o.connClosed(ConnClosedInfo{})
	// A Logger alone: the Tracer's fields are all nil.
	var logs logRecords
	o = newObserver(nil, logs.logger())
	o.deviceRemoved(DeviceRemovedInfo{Err: &deviceError{syscall.ENODEV}})
	recs := logs.records(t)
	require.Len(t, recs, 1)
	require.Equal(t, "WARN", recs[0]["level"])
}
