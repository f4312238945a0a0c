package rdma

import (
	"context"
	"crypto/tls"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ContextWithConn and ConnFromContext: which connections go into the
// context, through which wrappers.

// fakeNetConn is a net.Conn that is none of this package's.
type fakeNetConn struct{ net.Conn }

// wrapped is a wrapper that gives back what it wraps, as *tls.Conn does.
type wrapped struct {
	fakeNetConn
	inner net.Conn
}

func (w *wrapped) NetConn() net.Conn { return w.inner }

// selfWrapped gives back itself: ContextWithConn must still return.
type selfWrapped struct{ fakeNetConn }

func (s *selfWrapped) NetConn() net.Conn { return s }

func TestContextWithConn(t *testing.T) {
	c := newConn(phaseEstablished)
	type other struct{}
	base := context.WithValue(context.Background(), other{}, 1)

	got, ok := ConnFromContext(ContextWithConn(base, c))
	require.True(t, ok)
	require.Same(t, c, got)

	// HTTPS: the *tls.Conn gives back the connection under it, before
	// and after its handshake alike.
	tc := tls.Server(c, &tls.Config{})
	got, ok = ConnFromContext(ContextWithConn(base, tc))
	require.True(t, ok, "through *tls.Conn")
	require.Same(t, c, got)
	got, ok = ConnFromContext(ContextWithConn(base, &wrapped{inner: tls.Client(&wrapped{inner: c}, &tls.Config{})}))
	require.True(t, ok, "through three wrappers")
	require.Same(t, c, got)

	// A request's context derives from its connection's.
	ctx, cancel := context.WithTimeout(ContextWithConn(base, c), time.Minute)
	defer cancel()
	got, ok = ConnFromContext(context.WithValue(ctx, other{}, 2))
	require.True(t, ok, "from a derived context")
	require.Same(t, c, got)

	var nilConn *Conn
	for name, nc := range map[string]net.Conn{
		"nil":              nil,
		"not this package": fakeNetConn{},
		"tls over another": tls.Server(fakeNetConn{}, &tls.Config{}),
		"wraps nothing":    &wrapped{},
		"wraps itself":     &selfWrapped{},
		"nil *Conn":        nilConn,
		"zero Conn":        &Conn{},
		"too deep":         deep(c, maxUnwrap),
	} {
		ctx := ContextWithConn(base, nc)
		require.Equal(t, base, ctx, "%s: ctx as it was", name)
		got, ok := ConnFromContext(ctx)
		require.False(t, ok, name)
		require.Nil(t, got, name)
	}
	got, ok = ConnFromContext(ContextWithConn(base, deep(c, maxUnwrap-1)))
	require.True(t, ok, "the deepest wrapping looked through")
	require.Same(t, c, got)

	got, ok = ConnFromContext(context.Background())
	require.False(t, ok)
	require.Nil(t, got)
}

// deep wraps c in n wrappers.
func deep(c net.Conn, n int) net.Conn {
	for range n {
		c = &wrapped{inner: c}
	}
	return c
}

// TestContextWithConnHTTP: the function is an http.Server's ConnContext as
// it is; over TCP (a fallback's connection) the handler finds no
// connection, and serves on.
func TestContextWithConnHTTP(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := ConnFromContext(r.Context())
		io.WriteString(w, strconv.FormatBool(ok))
	}))
	srv.Config.ConnContext = ContextWithConn
	srv.Start()
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, "false", string(b))
}

// TestCoreImportsNoHTTP: the helpers serve net/http without the package
// importing it (nor crypto/tls): a program that uses neither does not
// link them.
func TestCoreImportsNoHTTP(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if path == "net/http" || path == "crypto/tls" || strings.HasPrefix(path, "net/http/") {
				t.Errorf("%s imports %s", name, path)
			}
		}
	}
}
