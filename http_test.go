package rdma_test

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// TestHTTP serves HTTP over an rdma listener and fetches through an
// http.Transport whose DialContext is Dialer.DialContext.
func TestHTTP(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	body := bytes.Repeat([]byte("rdma"), 100<<10)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(body)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	d := &rdma.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	for i := 0; i < 3; i++ { // the second and third reuse the connection
		resp, err := client.Get("http://" + ln.Addr().String() + "/")
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, body, got)
	}
}

// TestHTTPConnFromContext: with ContextWithConn as the server's
// ConnContext, a handler finds the *rdma.Conn its request came on (the
// one whose peer is the request's remote address) and registers a region
// on it.
func TestHTTPConnFromContext(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	srv := &http.Server{ConnContext: rdma.ContextWithConn, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := rdma.ConnFromContext(r.Context())
		if !ok {
			http.Error(w, "no connection", http.StatusInternalServerError)
			return
		}
		if c.RemoteAddr().String() != r.RemoteAddr {
			http.Error(w, "another connection: "+c.RemoteAddr().String(), http.StatusInternalServerError)
			return
		}
		reg, err := c.RegisterRegion(4096, rdma.RemoteRead)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		text, err := reg.Key().MarshalText()
		reg.Close()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Write(text)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	d := &rdma.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := client.Get("http://" + ln.Addr().String() + "/")
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
	var k rdma.RemoteKey
	require.NoError(t, k.UnmarshalText(got))
	require.Equal(t, uint64(4096), k.Size)
}
