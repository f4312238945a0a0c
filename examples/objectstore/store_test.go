package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// The store's handler over Go TCP, on any host: bodies, the answers to
// errors, and tokens refused off RDMA.

func TestStoreOverTCP(t *testing.T) {
	noLeaks(t)
	st := newStore(1 << 20)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := st.server()
	go srv.Serve(ln)
	defer st.close()
	defer st.wait()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dial := func() *client {
		cl, err := dialClient(ctx, "tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	cl := dial()

	obj := bytes.Repeat([]byte("object"), 1000)
	require.NoError(t, cl.PutBody(ctx, "a b/c", obj), "a name that needs escaping")
	got, err := cl.GetBody(ctx, "a b/c")
	require.NoError(t, err)
	require.Equal(t, obj, got)
	require.NoError(t, cl.PutBody(ctx, "empty", nil))
	got, err = cl.GetBody(ctx, "empty")
	require.NoError(t, err)
	require.Empty(t, got)
	require.NoError(t, cl.PutBody(ctx, "a b/c", []byte("replaced")))
	got, err = cl.GetBody(ctx, "a b/c")
	require.NoError(t, err)
	require.Equal(t, "replaced", string(got))

	_, err = cl.GetBody(ctx, "missing")
	require.Equal(t, http.StatusNotFound, status(err), "%v", err)
	// A well-formed token (of a region on no connection here).
	text, err := rdma.RemoteKey{Addr: 1 << 30, Size: 4096, RKey: 7, Access: rdma.RemoteRead | rdma.RemoteWrite}.MarshalText()
	require.NoError(t, err)
	_, _, err = cl.do(ctx, http.MethodGet, "a b/c", nil, string(text))
	require.Equal(t, http.StatusBadRequest, status(err), "a token over TCP: %v", err)
	_, _, err = cl.do(ctx, http.MethodPut, "a b/c", nil, string(text))
	require.Equal(t, http.StatusBadRequest, status(err), "a token over TCP: %v", err)
	require.Error(t, cl.PutToken(ctx, "x", obj), "the client has no region over TCP")
	_, err = cl.GetToken(ctx, "x", 10)
	require.Error(t, err)

	// Over the limit, with its length announced or not (the server may
	// close a connection whose body it did not read: a client each).
	err = dial().PutBody(ctx, "big", make([]byte, 1<<20+1))
	require.Equal(t, http.StatusRequestEntityTooLarge, status(err), "%v", err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, cl.base+"big", struct{ *bytes.Reader }{bytes.NewReader(make([]byte, 1<<20+1))})
	require.NoError(t, err)
	require.EqualValues(t, 0, req.ContentLength, "length unknown: chunked")
	resp, err := dial().http.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.NoError(t, cl.PutBody(ctx, "big", make([]byte, 1<<20)), "at the limit")
	big, ok := st.lookup("big")
	require.True(t, ok)
	require.Len(t, big.data, 1<<20)
	st.release(big)
}
