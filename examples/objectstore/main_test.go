package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goverbs/rdma"
)

// The store's device tests: objects PUT and GOT by token and by body, the
// answers to tokens the store must refuse, and no goroutine or region
// left. They need an RDMA device (the test bed's VM).

var testAddr = os.Getenv("RDMA_TEST_ADDR")

func needDevice(t testing.TB) {
	t.Helper()
	if testAddr == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test does, in the VM)")
	}
}

// TestMain checks, once the devices the tests used are let go, that no
// goroutine is left.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		waitDevicesIdle()
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// waitDevicesIdle waits for the devices to be let go: a device stays set
// up, with its goroutines, a while after its last connection closed.
func waitDevicesIdle() {
	for deadline := time.Now().Add(10 * time.Second); len(rdma.Devices()) > 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
}

// noLeaks checks, when the test ends (after the closes it registered
// later), that the test left no goroutine of its own.
func noLeaks(t testing.TB) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		waitDevicesIdle()
		goleak.VerifyNone(t, opt)
	})
}

// The objects' sizes: a page, a typical block, a large object.
var sizes = []struct {
	name string
	n    int
}{{"4KiB", 4 << 10}, {"1MiB", 1 << 20}, {"16MiB", 16 << 20}}

const maxObject = 16 << 20

// testbed is a store served over RDMA on the test bed's address and over
// Go TCP on loopback, with a client of each.
type testbed struct {
	st        *store
	rdmaAddr  string
	tcpAddr   string
	rdma, tcp *client
}

func startStore(t testing.TB) *testbed {
	t.Helper()
	st := newStore(maxObject)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ln.Close()
		require.NoError(t, err)
	}
	srv, tsrv := st.server(), st.server()
	go srv.Serve(ln)
	go tsrv.Serve(tln)
	t.Cleanup(func() {
		srv.Close()
		tsrv.Close()
		st.wait()  // every connection's regions closed
		st.close() // and the objects' memory given back
	})
	tb := &testbed{st: st, rdmaAddr: ln.Addr().String(), tcpAddr: tln.Addr().String()}
	tb.rdma = tb.dial(t, "rdma")
	tb.tcp = tb.dial(t, "tcp")
	return tb
}

// dial connects another client, closed when the test ends.
func (tb *testbed) dial(t testing.TB, network string) *client {
	t.Helper()
	addr := tb.rdmaAddr
	if network == "tcp" {
		addr = tb.tcpAddr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := dialClient(ctx, network, addr)
	require.NoError(t, err)
	t.Cleanup(func() { cl.Close() })
	return cl
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// status returns the HTTP status an error carries, or 0.
func status(err error) int {
	var se *statusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestObjectStore: objects of each size PUT and GOT by token and by body,
// each way read back the other ways, over RDMA and over TCP; then a GET
// into too small a region, and missing objects.
func TestObjectStore(t *testing.T) {
	needDevice(t)
	noLeaks(t)
	tb := startStore(t)
	ctx := testCtx(t)
	registered := tb.rdma.conn.Stats().RegisteredBytes

	for _, sz := range sizes {
		t.Run(sz.name, func(t *testing.T) {
			byToken, byBody := random(sz.n), random(sz.n)
			require.NoError(t, tb.rdma.PutToken(ctx, "token-"+sz.name, byToken))
			require.NoError(t, tb.rdma.PutBody(ctx, "body-"+sz.name, byBody))
			for name, want := range map[string][]byte{"token-" + sz.name: byToken, "body-" + sz.name: byBody} {
				got, err := tb.rdma.GetToken(ctx, name, sz.n)
				require.NoError(t, err, "GET %s by token", name)
				require.True(t, bytes.Equal(want, got), "GET %s by token: the bytes differ", name)
				got, err = tb.rdma.GetBody(ctx, name)
				require.NoError(t, err, "GET %s by body over RDMA", name)
				require.True(t, bytes.Equal(want, got), "GET %s by body over RDMA: the bytes differ", name)
				got, err = tb.tcp.GetBody(ctx, name)
				require.NoError(t, err, "GET %s by body over TCP", name)
				require.True(t, bytes.Equal(want, got), "GET %s by body over TCP: the bytes differ", name)
			}
			// A region larger than the object: the answer says how much
			// of it the object filled.
			got, err := tb.rdma.GetToken(ctx, "token-"+sz.name, sz.n+4096)
			require.NoError(t, err)
			require.True(t, bytes.Equal(byToken, got), "GET into a larger region: the bytes differ")

			_, err = tb.rdma.GetToken(ctx, "token-"+sz.name, sz.n-1)
			require.Equal(t, http.StatusRequestEntityTooLarge, status(err), "GET into a region a byte short: %v", err)
		})
	}

	_, err := tb.rdma.GetToken(ctx, "missing", 4096)
	require.Equal(t, http.StatusNotFound, status(err), "%v", err)
	_, err = tb.rdma.GetBody(ctx, "missing")
	require.Equal(t, http.StatusNotFound, status(err), "%v", err)
	_, err = tb.tcp.GetBody(ctx, "missing")
	require.Equal(t, http.StatusNotFound, status(err), "%v", err)

	// An object over the store's limit, by token: refused before any
	// transfer (the connection is fine after).
	err = tb.rdma.PutToken(ctx, "huge", make([]byte, maxObject+1))
	require.Equal(t, http.StatusRequestEntityTooLarge, status(err), "%v", err)
	require.NoError(t, tb.rdma.PutToken(ctx, "after", []byte("fine")))

	// Every region the client registered is closed: its registered
	// memory is back to the rings' once the rings the bodies grew have
	// shrunk back, a few seconds after the last body.
	require.Eventually(t, func() bool { return tb.rdma.conn.Stats().RegisteredBytes == registered }, 20*time.Second, 50*time.Millisecond,
		"the client's registered memory: %d, was %d", tb.rdma.conn.Stats().RegisteredBytes, registered)
	// And by body over TCP (the server may close the connection after
	// refusing a body it did not read: a client of its own).
	err = tb.dial(t, "tcp").PutBody(ctx, "huge", make([]byte, maxObject+1))
	require.Equal(t, http.StatusRequestEntityTooLarge, status(err), "%v", err)
}

// TestObjectStoreTokens: the tokens the store refuses, each without
// touching the client's memory, the connection serving on after each.
func TestObjectStoreTokens(t *testing.T) {
	needDevice(t)
	noLeaks(t)
	tb := startStore(t)
	ctx := testCtx(t)
	cl := tb.rdma

	first, second := random(4096), random(4096)
	require.NoError(t, cl.PutBody(ctx, "second", second))
	r, err := cl.conn.RegisterRegion(4096, rdma.RemoteRead|rdma.RemoteWrite)
	require.NoError(t, err)
	copy(r.Bytes(), first)
	text, err := r.Key().MarshalText()
	require.NoError(t, err)
	token := string(text)

	_, _, err = cl.do(ctx, http.MethodPut, "first", nil, token)
	require.NoError(t, err, "the token's first use")
	got, err := cl.GetBody(ctx, "first")
	require.NoError(t, err)
	require.Equal(t, first, got)

	// Used again, for a GET that would overwrite the region: refused,
	// the region as it was.
	_, _, err = cl.do(ctx, http.MethodGet, "second", nil, token)
	require.Equal(t, http.StatusConflict, status(err), "a replayed token: %v", err)
	require.Equal(t, first, r.Bytes(), "a refused token's region is not written")
	_, _, err = cl.do(ctx, http.MethodPut, "first", nil, token)
	require.Equal(t, http.StatusConflict, status(err), "a replayed token: %v", err)

	// The region closed, its token again: refused as used, and the
	// connection, which an access to the revoked key would have broken,
	// still serves.
	require.NoError(t, r.Close())
	_, _, err = cl.do(ctx, http.MethodGet, "second", nil, token)
	require.Equal(t, http.StatusConflict, status(err), "a closed region's token: %v", err)
	got, err = cl.GetToken(ctx, "second", 4096)
	require.NoError(t, err, "the connection after the refusals")
	require.Equal(t, second, got)

	// Malformed tokens, and tokens without the access a request needs.
	w, err := cl.conn.RegisterRegion(4096, rdma.RemoteWrite)
	require.NoError(t, err)
	defer w.Close()
	wtext, err := w.Key().MarshalText()
	require.NoError(t, err)
	ro, err := cl.conn.RegisterRegion(4096, rdma.RemoteRead)
	require.NoError(t, err)
	defer ro.Close()
	rotext, err := ro.Key().MarshalText()
	require.NoError(t, err)
	for name, tc := range map[string]struct{ method, token string }{
		"not base64":        {http.MethodPut, "not a token"},
		"short":             {http.MethodPut, token[:len(token)-1]},
		"not a key":         {http.MethodGet, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
		"PUT without read":  {http.MethodPut, string(wtext)},
		"GET without write": {http.MethodGet, string(rotext)},
	} {
		_, _, err := cl.do(ctx, tc.method, "second", nil, tc.token)
		require.Equal(t, http.StatusBadRequest, status(err), "%s: %v", name, err)
	}
	// The RDMA connection's own token on a TCP connection to the same
	// store: no region of this connection's.
	_, _, err = tb.tcp.do(ctx, http.MethodGet, "second", nil, string(wtext))
	require.Equal(t, http.StatusBadRequest, status(err), "a token over TCP: %v", err)
	require.Equal(t, make([]byte, 4096), w.Bytes(), "nothing written through refused tokens")

	got, err = cl.GetToken(ctx, "second", 4096)
	require.NoError(t, err, "the connection after the refusals")
	require.Equal(t, second, got)
}

// TestObjectStoreRevokedToken: why tokens are used once. A token whose
// region the client closed before the store ever saw it cannot be told
// from a good one: the store's RDMA WRITE to it fails, and the failure
// breaks the connection (both sides), not the request alone. The store
// serves its other connections on.
func TestObjectStoreRevokedToken(t *testing.T) {
	needDevice(t)
	noLeaks(t)
	tb := startStore(t)
	ctx := testCtx(t)
	require.NoError(t, tb.rdma.PutBody(ctx, "x", []byte("the object")))

	victim := tb.dial(t, "rdma")
	r, err := victim.conn.RegisterRegion(4096, rdma.RemoteWrite)
	require.NoError(t, err)
	text, err := r.Key().MarshalText()
	require.NoError(t, err)
	require.NoError(t, r.Close())
	_, _, err = victim.do(ctx, http.MethodGet, "x", nil, string(text))
	require.Error(t, err)
	require.Zero(t, status(err), "no answer arrives: %v", err)
	_, err = victim.GetBody(ctx, "x")
	require.Error(t, err, "the connection is over")

	got, err := tb.rdma.GetToken(ctx, "x", 4096)
	require.NoError(t, err, "another connection")
	require.Equal(t, "the object", string(got))
}

// TestObjectStoreRegions: PUT and GET through a region the client
// registered once, each request naming other bytes of it; its tokens
// taken once like any.
func TestObjectStoreRegions(t *testing.T) {
	needDevice(t)
	noLeaks(t)
	tb := startStore(t)
	ctx := testCtx(t)
	cl := tb.rdma

	const n = 64 << 10
	up, err := cl.conn.RegisterRegion(n+1, rdma.RemoteRead)
	require.NoError(t, err)
	defer up.Close()
	copy(up.Bytes(), random(n+1))
	require.NoError(t, cl.PutRegion(ctx, "at0", up, 0, n))
	require.NoError(t, cl.PutRegion(ctx, "at1", up, 1, n), "another token of the same region")
	err = cl.PutRegion(ctx, "again", up, 0, n)
	require.Equal(t, http.StatusConflict, status(err), "the same bytes again: %v", err)
	require.NoError(t, cl.PutRegion(ctx, "short", up, 0, n-1), "other bytes: another token")
	require.Error(t, cl.PutRegion(ctx, "past", up, 2, n), "past the region's end")

	down, err := cl.conn.RegisterRegion(n+8, rdma.RemoteWrite)
	require.NoError(t, err)
	defer down.Close()
	for i, name := range []string{"at0", "at1", "short"} {
		want := up.Bytes()[min(i, 1):][:n]
		if name == "short" {
			want = up.Bytes()[:n-1]
		}
		got, err := cl.GetRegion(ctx, name, down, i, n)
		require.NoError(t, err, "GET %s", name)
		require.Equal(t, len(want), got)
		require.True(t, bytes.Equal(want, down.Bytes()[i:i+got]), "GET %s: the bytes differ", name)
	}
	_, err = cl.GetRegion(ctx, "at0", down, 0, n)
	require.Equal(t, http.StatusConflict, status(err), "the same bytes again: %v", err)
	_, err = cl.GetRegion(ctx, "at0", up, 0, n)
	require.Error(t, err, "a region the store may not write")
}

// TestObjectStoreLifetime: an object outlives the connection that brought
// it, GETs on other connections write from its memory registered there,
// and replacing it frees those registrations; GETs and PUTs of one name
// on two connections at once.
func TestObjectStoreLifetime(t *testing.T) {
	needDevice(t)
	noLeaks(t)
	tb := startStore(t)
	ctx := testCtx(t)

	obj := random(1 << 20)
	other := tb.dial(t, "rdma")
	require.NoError(t, other.PutToken(ctx, "x", obj))
	require.NoError(t, other.Close())
	for range 2 { // the second from the registration the first made
		got, err := tb.rdma.GetToken(ctx, "x", len(obj))
		require.NoError(t, err, "GET of an object whose connection is over")
		require.True(t, bytes.Equal(obj, got), "the bytes differ")
	}
	old, ok := tb.st.lookup("x")
	require.True(t, ok)
	tb.st.release(old)
	old.mu.Lock()
	require.Len(t, old.shares, 1, "its memory registered on the GETs' connection")
	old.mu.Unlock()

	require.NoError(t, tb.rdma.PutBody(ctx, "x", []byte("replaced")))
	old.mu.Lock()
	require.Empty(t, old.shares, "the replaced object's registrations are closed")
	old.mu.Unlock()
	got, err := tb.rdma.GetToken(ctx, "x", 4096)
	require.NoError(t, err)
	require.Equal(t, "replaced", string(got))

	// One connection replaces the object while another GETs it.
	a, b := random(4096), random(4096)
	writer := tb.dial(t, "rdma")
	errs := make(chan error, 1)
	go func() {
		for i := range 20 {
			data := a
			if i%2 == 1 {
				data = b
			}
			if err := writer.PutToken(ctx, "y", data); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	require.NoError(t, tb.rdma.PutToken(ctx, "y", a))
	for range 20 {
		got, err := tb.rdma.GetToken(ctx, "y", 4096)
		require.NoError(t, err)
		require.True(t, bytes.Equal(a, got) || bytes.Equal(b, got), "a GET sees one object or the other, whole")
	}
	require.NoError(t, <-errs)
}
