// Command objectstore is an object store whose PUT and GET move the
// objects' bytes by one-sided RDMA, with HTTP for the rest: the "token
// pattern" of S3 over RDMA. It runs a store and a client against it, and
// moves a few objects both ways: by token and, for comparison, in ordinary
// HTTP bodies, on the same connection.
//
//	go run ./examples/objectstore -addr 10.77.0.1:0
//
// The address must belong to an interface with an RDMA device.
//
// # The flow
//
// The client dials one *rdma.Conn and speaks HTTP/1.1 on it: its
// http.Client's transport dials exactly that connection, since the
// regions the client registers are good on it alone. On the server,
// http.Server.ConnContext is rdma.ContextWithConn, so each handler finds
// its request's connection with rdma.ConnFromContext.
//
// A PUT by token: the client registers a region of the object's size that
// the store may read (rdma.RemoteRead), copies the object there, and
// sends PUT /objects/{name} with no body and the region's key as text in
// the Rdma-Token header (rdma.RemoteKey.MarshalText). The store checks
// the token, RDMA-READs the object straight into a region of the object's
// own on that connection (local access only; the region of an object the
// connection replaced, or a new one), stores it, and answers 204 No
// Content. The client then closes its region, which revokes the token.
// The object's region outlives the connection: its memory stays mapped
// until the object is replaced.
//
// A GET by token: the client registers a region it may receive into
// (rdma.RemoteWrite) and sends GET /objects/{name} with its token; the
// store RDMA-WRITEs the object into the client's region straight from
// the object's memory: its own region on the connection it came by, or on
// any other a registration of the same memory (rdma.Conn.ShareRegion),
// made at the first GET there and kept until the object is replaced or
// the connection ends; then it answers 204 with the object's length in the
// Rdma-Length header. When the answer arrives the bytes are in place: the
// WRITE completed before the answer was sent, on the same connection.
//
// Registering a region costs more than moving its bytes on a software
// RDMA device, so the client has a second way: PutRegion and GetRegion
// name bytes of a region the caller registered once and keeps. Each
// request names another sub-range of it (another token), since a token
// is used once.
//
// Without the header, the same paths take and give the object in the
// HTTP body, over RDMA or over TCP alike (a body that came over RDMA is
// stored in a region too; one that came over TCP is copied into a
// staging region for a GET by token).
//
// A token is used once. The store remembers every token it has been shown
// on a connection and refuses one it has seen before without touching the
// memory: the client closes a region after its answer, and an RDMA access
// to a closed region does not fail the request alone but the whole
// connection, on both sides. (A key is refused if it is the same as one
// seen before: same address, size, access and NIC key. A NIC that reuses
// a freed region's key for a region at the same address would have its
// new token refused too, with 409; the client registers another. The set
// lives as long as the connection: a store for long-lived clients would
// bound it, say by answering with "Connection: close" after so many
// requests.)
//
// The answers: 204 for a stored or delivered object, 200 with the body for
// a GET without a token; 400 for a malformed token, one that lacks the
// access the request needs, or a token on a TCP connection; 409 for a
// token already used on the connection; 413 for an object over the
// store's limit or larger than the token's region; 404 for an object the
// store does not have; 502 for a transfer that failed.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/goverbs/rdma"
)

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR")+":0", "listen address (an RDMA interface's IP and a port)")
	size := flag.Int("size", 1<<20, "the objects' size in bytes")
	flag.Parse()
	if err := run(*addr, *size); err != nil {
		log.Fatal(err)
	}
}

func run(addr string, size int) error {
	ln, err := rdma.Listen("rdma", addr)
	if err != nil {
		return err
	}
	st := newStore(64 << 20)
	srv := st.server()
	go srv.Serve(ln)
	defer st.close()
	defer st.wait()
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl, err := dialClient(ctx, "rdma", ln.Addr().String())
	if err != nil {
		return err
	}
	defer cl.Close()

	obj := make([]byte, size)
	rand.Read(obj)
	type step struct {
		what string
		do   func() ([]byte, error)
	}
	for _, s := range []step{
		{"PUT by token", func() ([]byte, error) { return obj, cl.PutToken(ctx, "a", obj) }},
		{"GET by token", func() ([]byte, error) { return cl.GetToken(ctx, "a", size) }},
		{"PUT by body", func() ([]byte, error) { return obj, cl.PutBody(ctx, "b", obj) }},
		{"GET by body", func() ([]byte, error) { return cl.GetBody(ctx, "b") }},
	} {
		start := time.Now()
		got, err := s.do()
		d := time.Since(start)
		if err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
		if !bytes.Equal(got, obj) {
			return fmt.Errorf("%s: the bytes differ", s.what)
		}
		fmt.Printf("%-13s %d bytes in %v (%.0f MB/s)\n", s.what, size, d.Round(time.Microsecond), float64(size)/d.Seconds()/1e6)
	}
	return nil
}
