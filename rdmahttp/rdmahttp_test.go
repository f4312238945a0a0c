package rdmahttp_test

import (
	"context"
	"errors"
	"fmt"
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

// Over the TCP fallback (no RDMA device serves 127.0.0.1): the ClientTrace
// sees the RDMA attempt fail, then net.Dialer's TCP attempt. The same over
// RDMA is TestHTTPTraceOverRDMA, in the package's device tests.

func TestClientTraceSeesBothAttempts(t *testing.T) {
	lc := rdma.ListenConfig{FallbackTCP: true}
	ln, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hi") })}
	go srv.Serve(ln)
	defer srv.Close()

	var fallbacks int
	d := &rdma.Dialer{FallbackTCP: true, Timeout: 5 * time.Second,
		Tracer: &rdma.Tracer{Fallback: func(rdma.FallbackInfo) { fallbacks++ }}}
	tr := &http.Transport{DialContext: rdmahttp.DialContext(d)}
	defer tr.CloseIdleConnections()
	var mu sync.Mutex
	var got []string
	var rdmaErr error
	trace := &httptrace.ClientTrace{
		ConnectStart: func(network, addr string) { mu.Lock(); got = append(got, "start "+network+" "+addr); mu.Unlock() },
		ConnectDone: func(network, addr string, err error) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, fmt.Sprintf("done %s %s %v", network, addr, err != nil))
			if network == "rdma" {
				rdmaErr = err
			}
		},
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", "http://"+ln.Addr().String()+"/", nil)
	require.NoError(t, err)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, "hi", string(body))

	mu.Lock()
	defer mu.Unlock()
	addr := ln.Addr().String()
	require.Equal(t, []string{"start rdma " + addr, "done rdma " + addr + " true", "start tcp " + addr, "done tcp " + addr + " false"}, got)
	require.True(t, errors.Is(rdmaErr, rdma.ErrNoDevice) || errors.Is(rdmaErr, rdma.ErrUnsupported), "%v", rdmaErr)
	require.Equal(t, 1, fallbacks, "the Dialer's own Tracer is called as before")
	require.Nil(t, d.Tracer.DialStart, "the Dialer is not changed")
}

// Without a ClientTrace the dial is the Dialer's own.
func TestNoClientTrace(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	var starts int
	d := &rdma.Dialer{FallbackTCP: true, Tracer: &rdma.Tracer{DialStart: func(rdma.DialStartInfo) { starts++ }}}
	c, err := rdmahttp.DialContext(d)(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	c.Close()
	require.Equal(t, 1, starts)
}
