package main

import (
	"context"
	"testing"

	"github.com/goverbs/rdma"
)

// BenchmarkObjectStore: PUT and GET of each size by token (the bytes by
// RDMA READ and WRITE between registered regions, a region registered and
// closed by the client per request), by token into or out of a region the
// client registered once (token-region), by HTTP body over the same RDMA
// connection, and by HTTP body over Go TCP (loopback), in MB/s of object
// bytes. The token figures include the client's registration and its copy
// into or out of its region; the token-region ones, neither (the caller's
// bytes are in its region already); the body figures, the HTTP framing
// and the copies of the stream.
func BenchmarkObjectStore(b *testing.B) {
	needDevice(b)
	tb := startStore(b)
	ctx := context.Background()
	type mode struct {
		name string
		put  func(name string, data []byte) error
		get  func(name string, n int) ([]byte, error)
	}
	up := &spans{cl: tb.rdma, access: rdma.RemoteRead}
	down := &spans{cl: tb.rdma, access: rdma.RemoteWrite}
	b.Cleanup(func() { up.close(); down.close() })
	modes := []mode{
		{"token", func(name string, data []byte) error { return tb.rdma.PutToken(ctx, name, data) },
			func(name string, n int) ([]byte, error) { return tb.rdma.GetToken(ctx, name, n) }},
		{"token-region", func(name string, data []byte) error {
			// The object's bytes are the region's at off: a caller of
			// PutRegion makes them there (the tests check the bytes).
			r, off, err := up.take(len(data))
			if err != nil {
				return err
			}
			return tb.rdma.PutRegion(ctx, name, r, off, len(data))
		}, func(name string, n int) ([]byte, error) {
			r, off, err := down.take(n)
			if err != nil {
				return nil, err
			}
			got, err := tb.rdma.GetRegion(ctx, name, r, off, n)
			if err != nil {
				return nil, err
			}
			return r.Bytes()[off : off+got], nil
		}},
		{"body-rdma", func(name string, data []byte) error { return tb.rdma.PutBody(ctx, name, data) },
			func(name string, n int) ([]byte, error) { return tb.rdma.GetBody(ctx, name) }},
		{"body-tcp", func(name string, data []byte) error { return tb.tcp.PutBody(ctx, name, data) },
			func(name string, n int) ([]byte, error) { return tb.tcp.GetBody(ctx, name) }},
	}
	for _, op := range []string{"PUT", "GET"} {
		for _, sz := range sizes {
			obj := random(sz.n)
			for _, m := range modes {
				b.Run(op+"/"+sz.name+"/"+m.name, func(b *testing.B) {
					if op == "GET" {
						if err := tb.rdma.PutBody(ctx, sz.name, obj); err != nil {
							b.Fatal(err)
						}
					}
					// The region's registration, once per size, before
					// the timer (it is what token-region saves).
					if _, _, err := up.take(sz.n); err != nil {
						b.Fatal(err)
					}
					if _, _, err := down.take(sz.n); err != nil {
						b.Fatal(err)
					}
					b.SetBytes(int64(sz.n))
					for b.Loop() { // the timer starts here
						var err error
						var got []byte
						if op == "PUT" {
							err = m.put(sz.name, obj)
						} else {
							got, err = m.get(sz.name, sz.n)
							if err == nil && len(got) != sz.n {
								b.Fatalf("GET of %d bytes, want %d", len(got), sz.n)
							}
						}
						if err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// spans hands out the tokens of a region registered once: n bytes at each
// of slack+1 offsets, each once (the store takes a token once per
// connection), then a new region.
type spans struct {
	cl     *client
	access rdma.Access
	r      *rdma.Region
	n      int
	next   int
}

const slack = 4095

func (s *spans) take(n int) (*rdma.Region, int, error) {
	if s.r == nil || s.n != n || s.next > slack {
		s.close()
		r, err := s.cl.conn.RegisterRegion(n+slack, s.access)
		if err != nil {
			return nil, 0, err
		}
		s.r, s.n, s.next = r, n, 0
	}
	s.next++
	return s.r, s.next - 1, nil
}

func (s *spans) close() {
	if s.r != nil {
		s.r.Close()
		s.r = nil
	}
}
