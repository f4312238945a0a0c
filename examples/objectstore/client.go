package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/goverbs/rdma"
)

// The client's side: an http.Client over exactly one connection, and the
// regions its tokens name.

// client talks to a store over one connection: an *rdma.Conn, on which it
// can pass tokens, or a TCP one (bodies only).
type client struct {
	conn *rdma.Conn // nil over TCP
	tr   *http.Transport
	http *http.Client
	base string // http://host:port/objects/
}

// errConnGone is what the client's transport gets when it asks for a
// second connection: the client's regions are registered on the first,
// and their keys are good on it alone.
var errConnGone = errors.New("objectstore: the client's connection is closed")

// dialClient connects to the store at addr over network ("rdma" or
// "tcp").
func dialClient(ctx context.Context, network, addr string) (*client, error) {
	var nc net.Conn
	var err error
	if network == "rdma" {
		nc, err = (&rdma.Dialer{}).DialContext(ctx, "rdma", addr)
	} else {
		nc, err = (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	if err != nil {
		return nil, err
	}
	cl := &client{base: "http://" + addr + "/objects/"}
	cl.conn, _ = nc.(*rdma.Conn)
	var dialed atomic.Bool
	cl.tr = &http.Transport{
		// The transport's one connection is the one dialed here. Once
		// that is closed (the store hung up, say), there is no other.
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			if dialed.Swap(true) {
				return nil, errConnGone
			}
			return nc, nil
		},
		MaxConnsPerHost:     1, // a second request at once waits for the connection
		MaxIdleConnsPerHost: 1,
		DisableCompression:  true,
	}
	cl.http = &http.Client{Transport: cl.tr}
	return cl, nil
}

// Close closes the connection, which revokes any region still open on it.
func (cl *client) Close() error {
	cl.tr.CloseIdleConnections()
	if cl.conn == nil {
		return nil
	}
	// In case the transport never used it; closed twice otherwise.
	if err := cl.conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// statusError is a store's answer other than success.
type statusError struct {
	Code int
	Msg  string
}

func (e *statusError) Error() string {
	return fmt.Sprintf("objectstore: %d %s: %s", e.Code, http.StatusText(e.Code), e.Msg)
}

// do sends a request and reads its answer whole; body and token may be
// empty.
func (cl *client) do(ctx context.Context, method, name string, body []byte, token string) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, cl.base+url.PathEscape(name), rd)
	if err != nil {
		return nil, nil, err
	}
	if token != "" {
		req.Header.Set(tokenHeader, token)
	}
	resp, err := cl.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	var got []byte
	if resp.ContentLength >= 0 {
		got = make([]byte, resp.ContentLength)
		_, err = io.ReadFull(resp.Body, got)
	} else {
		got, err = io.ReadAll(resp.Body)
	}
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode >= 300 {
		return resp, nil, &statusError{Code: resp.StatusCode, Msg: strings.TrimSpace(string(got))}
	}
	return resp, got, nil
}

// PutToken stores data as name: it registers a region the store may read,
// copies data there and names it in the request; the store RDMA-READs it.
// The region is closed once the answer is in, which revokes the token.
func (cl *client) PutToken(ctx context.Context, name string, data []byte) error {
	if cl.conn == nil {
		return errors.New("objectstore: tokens need an RDMA connection")
	}
	if len(data) == 0 {
		return errors.New("objectstore: an empty object has no region to name: put it by body")
	}
	r, err := cl.conn.RegisterRegion(len(data), rdma.RemoteRead)
	if err != nil {
		return err
	}
	defer r.Close()
	copy(r.Bytes(), data)
	token, err := r.Key().MarshalText()
	if err != nil {
		return err
	}
	_, _, err = cl.do(ctx, http.MethodPut, name, nil, string(token))
	return err
}

// GetToken fetches name, of up to capacity bytes: it registers a region of
// that size the store may write, names it in the request, and returns a
// copy of what the store RDMA-WROTE there. The region is closed once the
// answer is in.
func (cl *client) GetToken(ctx context.Context, name string, capacity int) ([]byte, error) {
	if cl.conn == nil {
		return nil, errors.New("objectstore: tokens need an RDMA connection")
	}
	r, err := cl.conn.RegisterRegion(capacity, rdma.RemoteWrite)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	token, err := r.Key().MarshalText()
	if err != nil {
		return nil, err
	}
	resp, _, err := cl.do(ctx, http.MethodGet, name, nil, string(token))
	if err != nil {
		return nil, err
	}
	n, err := strconv.Atoi(resp.Header.Get(lengthHeader))
	if err != nil || n < 0 || n > capacity {
		return nil, fmt.Errorf("objectstore: the store wrote %q bytes into a region of %d", resp.Header.Get(lengthHeader), capacity)
	}
	return bytes.Clone(r.Bytes()[:n]), nil
}

// PutBody stores data as name, in the request's body.
func (cl *client) PutBody(ctx context.Context, name string, data []byte) error {
	_, _, err := cl.do(ctx, http.MethodPut, name, data, "")
	return err
}

// GetBody fetches name, in the answer's body.
func (cl *client) GetBody(ctx context.Context, name string) ([]byte, error) {
	_, got, err := cl.do(ctx, http.MethodGet, name, nil, "")
	return got, err
}
