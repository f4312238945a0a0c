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
// The simple way, and the costly one: the registration and the copy cost
// more than the READ on a software device (see PutRegion).
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
	return cl.PutRegion(ctx, name, r, 0, len(data))
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
	n, err := cl.GetRegion(ctx, name, r, 0, capacity)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(r.Bytes()[:n]), nil
}

// PutRegion stores the n bytes at off of r as name, with no registration
// or copy of its own: r is a region of the client's connection that
// grants RemoteRead, registered by the caller and kept across requests.
//
// The token names exactly those bytes (r's key, narrowed to them), and the
// store takes each token once per connection: a second request naming the
// same off and n of r is refused with 409. A caller that reuses r moves
// off (or n, for a GET) from one request to the next, so a region a few
// bytes longer than its objects has a token for each spare byte; once
// they are used, it registers another. r's Close revokes them all. The
// store reads the bytes before it answers: r may change once PutRegion
// returns.
func (cl *client) PutRegion(ctx context.Context, name string, r *rdma.Region, off, n int) error {
	token, err := cl.subToken(r, rdma.RemoteRead, off, n)
	if err != nil {
		return err
	}
	_, _, err = cl.do(ctx, http.MethodPut, name, nil, token)
	return err
}

// GetRegion fetches name into the n bytes at off of r, a region of the
// client's connection that grants RemoteWrite, and returns the object's
// length: its bytes are r's at off, in place when GetRegion returns. The
// tokens are PutRegion's: each off and n of r once per connection.
func (cl *client) GetRegion(ctx context.Context, name string, r *rdma.Region, off, n int) (int, error) {
	token, err := cl.subToken(r, rdma.RemoteWrite, off, n)
	if err != nil {
		return 0, err
	}
	resp, _, err := cl.do(ctx, http.MethodGet, name, nil, token)
	if err != nil {
		return 0, err
	}
	got, err := strconv.Atoi(resp.Header.Get(lengthHeader))
	if err != nil || got < 0 || got > n {
		return 0, fmt.Errorf("objectstore: the store wrote %q bytes into a region of %d", resp.Header.Get(lengthHeader), n)
	}
	return got, nil
}

// subToken returns the token of the n bytes at off of r (n > 0).
func (cl *client) subToken(r *rdma.Region, need rdma.Access, off, n int) (string, error) {
	if cl.conn == nil {
		return "", errors.New("objectstore: tokens need an RDMA connection")
	}
	if r.Access()&need == 0 {
		return "", fmt.Errorf("objectstore: the region grants %v access, the request needs %v", r.Access(), need)
	}
	if off < 0 || n <= 0 || n > r.Len()-off {
		return "", fmt.Errorf("objectstore: %d bytes at %d of a region of %d", n, off, r.Len())
	}
	key := r.Key()
	key.Addr += uint64(off)
	key.Size = uint64(n)
	token, err := key.MarshalText()
	return string(token), err
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
