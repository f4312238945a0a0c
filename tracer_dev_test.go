package rdma_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
	"github.com/goverbs/rdma/rdmahttp"
)

// The Tracer's events on the device: a dial's phases, both ends'
// closes, a refusal, net/http's ConnectStart and ConnectDone over RDMA.
// TestDeviceRemoval (removal_test.go) checks DeviceRemoved.

// traceLog records a Tracer's calls.
type traceLog struct {
	mu    sync.Mutex
	names []string
	infos []any
}

func (l *traceLog) add(name string, info any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.names, l.infos = append(l.names, name), append(l.infos, info)
}

// of returns the infos of the events called name.
func (l *traceLog) of(name string) []any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []any
	for i, n := range l.names {
		if n == name {
			out = append(out, l.infos[i])
		}
	}
	return out
}

func (l *traceLog) tracer() *rdma.Tracer {
	return &rdma.Tracer{
		DialStart:       func(i rdma.DialStartInfo) { l.add("DialStart", i) },
		DialDone:        func(i rdma.DialDoneInfo) { l.add("DialDone", i) },
		Fallback:        func(i rdma.FallbackInfo) { l.add("Fallback", i) },
		Refused:         func(i rdma.RefusedInfo) { l.add("Refused", i) },
		KeepAliveFailed: func(i rdma.ConnEventInfo) { l.add("KeepAliveFailed", i) },
		RingResized:     func(i rdma.RingResizedInfo) { l.add("RingResized", i) },
		DeviceRemoved:   func(i rdma.DeviceRemovedInfo) { l.add("DeviceRemoved", i) },
		ConnClosed:      func(i rdma.ConnClosedInfo) { l.add("ConnClosed", i) },
	}
}

func TestTracerDialAndClose(t *testing.T) {
	needDevice(t)
	var srv, cli traceLog
	lc := &rdma.ListenConfig{Tracer: srv.tracer()}
	d := &rdma.Dialer{Tracer: cli.tracer()}
	c, s := pair(t, lc, d)

	require.Len(t, cli.of("DialStart"), 1)
	require.Equal(t, rdma.DialStartInfo{Network: "rdma", Address: c.RemoteAddr().String()}, cli.of("DialStart")[0])
	dones := cli.of("DialDone")
	require.Len(t, dones, 1)
	done := dones[0].(rdma.DialDoneInfo)
	require.Equal(t, "rdma", done.Network)
	require.NoError(t, done.Err)
	require.Equal(t, c.LocalAddr(), done.Local)
	require.Equal(t, c.RemoteAddr(), done.Remote)
	for name, ph := range map[string]time.Duration{"Resolve": done.Resolve, "Route": done.Route, "Setup": done.Setup, "Connect": done.Connect} {
		require.Positive(t, ph, name)
	}
	require.LessOrEqual(t, done.Resolve+done.Route+done.Connect, done.Duration, "the phases follow one another within the dial")

	transfer(t, c, s, "traced")
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	for _, end := range []struct {
		name string
		log  *traceLog
		conn net.Conn
		sent uint64
	}{{"dialer", &cli, c, 6}, {"acceptor", &srv, s, 0}} {
		require.Eventually(t, func() bool { return len(end.log.of("ConnClosed")) == 1 }, 10*time.Second, 10*time.Millisecond, end.name)
		info := end.log.of("ConnClosed")[0].(rdma.ConnClosedInfo)
		require.NoError(t, info.Err, "%s: a graceful close is no failure", end.name)
		require.Equal(t, end.conn.LocalAddr(), info.Local, end.name)
		require.Equal(t, end.conn.RemoteAddr(), info.Remote, end.name)
		require.Equal(t, end.sent, info.Stats.BytesWritten, end.name)
		require.Positive(t, info.Duration, end.name)
	}
	require.Empty(t, srv.of("DialStart"), "the listener's tracer sees no dial")
	require.Empty(t, cli.of("Refused"))
}

func TestTracerRefusal(t *testing.T) {
	needDevice(t)
	var srv traceLog
	lc := rdma.ListenConfig{Backlog: 1, Tracer: srv.tracer()}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	require.NoError(t, err, "the backlog holds one")
	defer c.Close()
	waitAccepted(t, ln, 1)
	_, err = rdma.Dial("rdma", ln.Addr().String())
	var re *rdma.RefusedError
	require.ErrorAs(t, err, &re)
	require.Equal(t, rdma.RefusedBacklog, re.Reason)
	require.Eventually(t, func() bool { return len(srv.of("Refused")) == 1 }, 5*time.Second, time.Millisecond)
	info := srv.of("Refused")[0].(rdma.RefusedInfo)
	require.ErrorAs(t, info.Err, &re)
	require.Equal(t, rdma.RefusedBacklog, re.Reason)
	require.NotNil(t, info.Remote)
	require.NoError(t, ln.Close())
	// The queued connection was never accepted: nothing reports its end.
	time.Sleep(100 * time.Millisecond)
	require.Empty(t, srv.of("ConnClosed"))
}

// TestHTTPTraceOverRDMA: net/http's ClientTrace sees the Transport's dial
// (rdmahttp.DialContext) over RDMA, and only that one.
func TestHTTPTraceOverRDMA(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "over rdma") })}
	go srv.Serve(ln)
	defer srv.Close()
	d := &rdma.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: rdmahttp.DialContext(d)}
	defer tr.CloseIdleConnections()

	var mu sync.Mutex
	var got []string
	var rdmaConn bool
	trace := &httptrace.ClientTrace{
		ConnectStart: func(network, addr string) { mu.Lock(); got = append(got, "start "+network+" "+addr); mu.Unlock() },
		ConnectDone: func(network, addr string, err error) {
			mu.Lock()
			defer mu.Unlock()
			require.NoError(t, err)
			got = append(got, "done "+network+" "+addr)
		},
		GotConn: func(i httptrace.GotConnInfo) { mu.Lock(); rdmaConn = rdma.IsRDMA(i.Conn); mu.Unlock() },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "http://"+ln.Addr().String()+"/", nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, "over rdma", string(body))
	mu.Lock()
	defer mu.Unlock()
	addr := ln.Addr().String()
	require.Equal(t, []string{"start rdma " + addr, "done rdma " + addr}, got)
	require.True(t, rdmaConn, "the request went over RDMA")
}
