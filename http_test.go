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
