// Command quic runs quic-go over RDMA datagrams: each side's
// quic.Transport reads and writes an rdma.PacketConn instead of a UDP
// socket, and QUIC brings what UD lacks (ordering, retransmission,
// streams, TLS 1.3). The server echoes every stream; the client echoes
// several at once and checks the bytes.
//
//	go run . -addr 10.0.0.1:0
//
// The address must belong to an interface with an RDMA device. -server
// only serves (until interrupted); -client only runs the client against
// the server at -addr (it skips verifying the server's certificate, which
// the server makes up when it starts).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/goverbs/rdma"
)

const alpn = "rdma-example-echo"

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR")+":0", "the server's address: an RDMA interface's IP and a port (0 picks one)")
	local := flag.String("local", "", "with -client, the client's IP (empty: the host's one RDMA device)")
	serverOnly := flag.Bool("server", false, "only serve, until interrupted")
	clientOnly := flag.Bool("client", false, "only run the client, against the server at -addr")
	streams := flag.Int("streams", 4, "streams echoed at once")
	size := flag.Int("size", 256<<10, "bytes echoed on each stream")
	flag.Parse()
	if err := run(*addr, *local, *serverOnly, *clientOnly, *streams, *size); err != nil {
		log.Fatal(err)
	}
}

func run(addr, local string, serverOnly, clientOnly bool, streams, size int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if clientOnly {
		server, err := rdma.ResolveAddr("rdma", addr)
		if err != nil {
			return err
		}
		return runClient(ctx, local, server, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpn}}, streams, size)
	}
	s, err := startServer(addr, host)
	if err != nil {
		return err
	}
	if serverOnly {
		fmt.Println("serving on", s.pc.LocalAddr())
		<-ctx.Done()
		return s.close()
	}
	// quic-go infers the server's name from a *net.UDPAddr only.
	tlsConf := &tls.Config{RootCAs: s.roots, ServerName: host, NextProtos: []string{alpn}}
	return errors.Join(runClient(ctx, host, s.pc.LocalAddr(), tlsConf, streams, size), s.close())
}

// runClient dials server from a PacketConn on local and echoes size random
// bytes on each of streams streams at once.
func runClient(ctx context.Context, local string, server net.Addr, tlsConf *tls.Config, streams, size int) error {
	pc, err := rdma.ListenPacket("rdma", net.JoinHostPort(local, "0"))
	if err != nil {
		return err
	}
	defer pc.Close()
	tr := &quic.Transport{Conn: pc}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	start := time.Now()
	conn, err := tr.Dial(ctx, server, tlsConf, nil)
	if err != nil {
		return err
	}
	defer conn.CloseWithError(0, "done")
	fmt.Printf("QUIC handshake with %s in %v\n", conn.RemoteAddr(), time.Since(start).Round(time.Microsecond))

	start = time.Now()
	errs := make([]error, streams)
	var wg sync.WaitGroup
	for i := range streams {
		wg.Go(func() { errs[i] = echo(ctx, conn, size) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("%d streams of %d bytes echoed in %v\n", streams, size, time.Since(start).Round(time.Microsecond))
	return nil
}

// echo sends size random bytes on a new stream, ends it, and checks that
// what comes back is the same.
func echo(ctx context.Context, conn *quic.Conn, size int) error {
	s, err := conn.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl) // a stream's reads and writes know no context
	}
	data := make([]byte, size)
	rand.Read(data)
	sent := make(chan error, 1)
	go func() { // the echo comes back while this writes
		_, err := s.Write(data)
		sent <- errors.Join(err, s.Close())
	}()
	got, err := io.ReadAll(s)
	if err = errors.Join(err, <-sent); err != nil {
		return fmt.Errorf("stream %d: %w", s.StreamID(), err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("stream %d: %d bytes came back of %d, or others", s.StreamID(), len(got), size)
	}
	return nil
}
