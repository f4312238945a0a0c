package main

import (
	"context"
	"testing"
)

// BenchmarkObjectStore: PUT and GET of each size by token (the bytes by
// RDMA READ and WRITE between registered regions, a region registered and
// closed by the client per request), by HTTP body over the same RDMA
// connection, and by HTTP body over Go TCP (loopback), in MB/s of object
// bytes. The token figures include the client's registration and its copy
// into or out of its region; the body figures, the HTTP framing and the
// copies of the stream.
func BenchmarkObjectStore(b *testing.B) {
	needDevice(b)
	tb := startStore(b)
	ctx := context.Background()
	type mode struct {
		name string
		put  func(name string, data []byte) error
		get  func(name string, n int) ([]byte, error)
	}
	modes := []mode{
		{"token", func(name string, data []byte) error { return tb.rdma.PutToken(ctx, name, data) },
			func(name string, n int) ([]byte, error) { return tb.rdma.GetToken(ctx, name, n) }},
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
