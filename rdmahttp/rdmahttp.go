// Package rdmahttp ties net/http's client tracing to package rdma's
// dials. It lives apart from package rdma so that a program which dials
// RDMA without net/http does not link net/http/httptrace and crypto/tls,
// which package rdma never imports.
//
// An http.Transport that dials with rdmahttp.DialContext(d) instead of
// d.DialContext reports each dial to the request's
// httptrace.ClientTrace: ConnectStart and ConnectDone with network "rdma"
// for the RDMA attempt, as net.Dialer reports its TCP dials (and, when the
// Dialer's FallbackTCP takes the dial to TCP, net.Dialer then reports its
// TCP attempt with network "tcp").
package rdmahttp

import (
	"context"
	"net"
	"net/http/httptrace"

	"github.com/goverbs/rdma"
)

// DialContext returns d's DialContext for an http.Transport, reporting
// each dial to the ClientTrace the request's context carries (see
// httptrace.WithClientTrace). Without a ClientTrace, or one with neither
// ConnectStart nor ConnectDone, it is d.DialContext. d's own Tracer is
// called as before.
func DialContext(d *rdma.Dialer) func(ctx context.Context, network, address string) (net.Conn, error) {
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		ct := httptrace.ContextClientTrace(ctx)
		if ct == nil || ct.ConnectStart == nil && ct.ConnectDone == nil {
			return d.DialContext(ctx, network, address)
		}
		traced := *d // a copy per dial: d is shared by the Transport's dials
		traced.Tracer = withConnectTrace(d.Tracer, ct)
		return traced.DialContext(ctx, network, address)
	}
}

// withConnectTrace is tr (nil: none) with the dial's start and its RDMA
// attempt's end also reported to ct.
func withConnectTrace(tr *rdma.Tracer, ct *httptrace.ClientTrace) *rdma.Tracer {
	var t rdma.Tracer
	if tr != nil {
		t = *tr
	}
	start, fallback, done := t.DialStart, t.Fallback, t.DialDone
	connectDone := func(address string, err error) {
		if ct.ConnectDone != nil {
			ct.ConnectDone("rdma", address, err)
		}
	}
	t.DialStart = func(i rdma.DialStartInfo) {
		if ct.ConnectStart != nil {
			ct.ConnectStart("rdma", i.Address)
		}
		if start != nil {
			start(i)
		}
	}
	t.Fallback = func(i rdma.FallbackInfo) {
		// The RDMA attempt ended here; net.Dialer reports the TCP one.
		connectDone(i.Address, i.Reason)
		if fallback != nil {
			fallback(i)
		}
	}
	t.DialDone = func(i rdma.DialDoneInfo) {
		if i.Network == "rdma" {
			connectDone(i.Address, i.Err)
		}
		if done != nil {
			done(i)
		}
	}
	return &t
}
