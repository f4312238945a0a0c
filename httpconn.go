package rdma

import (
	"context"
	"net"
)

// The connection a request came on, for servers whose protocol carries
// RemoteKeys (the token pattern: an HTTP request names the client's
// region, and the handler reads or writes it with one-sided RDMA on the
// request's own connection, the only one the key is good on). net/http
// hands its handlers no connection, only a context made per connection
// (http.Server.ConnContext); these put the *Conn there and take it out.

// connKey is the context key of the connection.
type connKey struct{}

// maxUnwrap bounds how many wrappers ContextWithConn looks through, in
// case one returns itself (or a cycle of them).
const maxUnwrap = 8

// ContextWithConn returns ctx with c's connection in it when c is this
// package's connection over RDMA, or a wrapper of one that gives it back
// with a NetConn method (a *tls.Conn, for HTTPS); otherwise (a TCP
// connection from a fallback, say) it returns ctx as it is. Its signature
// is http.Server.ConnContext's:
//
//	srv := &http.Server{Handler: h, ConnContext: rdma.ContextWithConn}
//
// and a handler then finds the connection with ConnFromContext of its
// request's context. ctx must not be nil.
func ContextWithConn(ctx context.Context, c net.Conn) context.Context {
	for range maxUnwrap {
		switch v := c.(type) {
		case *Conn:
			if !v.ok() {
				return ctx
			}
			return context.WithValue(ctx, connKey{}, v)
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return ctx
		}
	}
	return ctx
}

// ConnFromContext returns the connection ContextWithConn put in ctx (or
// in a context ctx derives from, as a request's does from its
// connection's), and whether there was one.
func ConnFromContext(ctx context.Context) (*Conn, bool) {
	c, ok := ctx.Value(connKey{}).(*Conn)
	return c, ok
}
