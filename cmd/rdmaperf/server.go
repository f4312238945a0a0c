package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"sync/atomic"
)

// serve accepts connections until the listener is closed. Each connection
// gets its own goroutine, so a multi-connection rate test is served in
// parallel. The HTTP server of http tests, if one was started, is shut
// down on the way out.
func serve(ln net.Listener, verbose bool) error {
	web := &httpFront{addr: ln.Addr(), verbose: verbose}
	defer web.close()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			kept, err := handle(c, verbose, web)
			if !kept {
				c.Close()
			}
			if err != nil && verbose {
				log.Printf("%s: %v", c.RemoteAddr(), err)
			}
		}()
	}
}

// handle serves one connection the way its header asks. kept says that
// the connection went on to the HTTP server, which closes it; otherwise
// the caller does.
func handle(c net.Conn, verbose bool, web *httpFront) (kept bool, err error) {
	h, err := readHeader(c)
	if err != nil {
		return false, err
	}
	if verbose {
		log.Printf("%s: %s, %d bytes", c.RemoteAddr(), h.kind, h.size)
	}
	if _, err := c.Write([]byte{readyByte}); err != nil {
		return false, err
	}
	switch h.kind {
	case kindSink:
		return false, sink(c)
	case kindCopy, kindCopyPlain:
		return false, copySink(c, h.kind == kindCopyPlain)
	case kindSource:
		return false, source(c, h.size, h.count)
	case kindHTTP:
		if !web.serve(c, h.size) {
			return false, errors.New("the server is shutting down")
		}
		return true, nil
	case kindRegion, kindRegionPong:
		return false, serveRegion(c, h.size, h.kind == kindRegionPong)
	case kindDgramEcho, kindDgramSink:
		return false, serveDgram(c, h.size, h.kind == kindDgramEcho)
	default:
		return false, echo(c, h.size)
	}
}

// echo answers each message of size bytes with the same bytes. It reads
// whole messages before answering, so the client's round trip covers the
// full message each way even when the transport splits it.
func echo(c net.Conn, size int) error {
	buf := make([]byte, size)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
}

// sink discards everything until EOF and then reports how many bytes it
// got: the client stops its clock on this reply, so the figure counts only
// data that really arrived, not data still queued at the sender.
func sink(c net.Conn) error {
	// Large enough for many TCP segments, or many rdma messages, per read.
	buf := make([]byte, 1<<20)
	var total uint64
	for {
		n, err := c.Read(buf)
		total += uint64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	var reply [countLen]byte
	binary.BigEndian.PutUint64(reply[:], total)
	_, err := c.Write(reply[:])
	return err
}

// copySink is sink through io.Copy: to io.Discard straight from the
// connection (its WriteTo, for rdma), or, plain, through io.Discard's own
// buffer, as io.Copy goes for a source without WriteTo.
func copySink(c net.Conn, plain bool) error {
	var src io.Reader = c
	if plain {
		src = struct{ io.Reader }{c}
	}
	n, err := io.Copy(io.Discard, src)
	if err != nil {
		return err
	}
	var reply [countLen]byte
	binary.BigEndian.PutUint64(reply[:], uint64(n))
	_, err = c.Write(reply[:])
	return err
}

// source is the server's side of a reverse test (-R): once the client says
// start, write size-byte messages, count of them or, with count 0, until
// the client half-closes, then half-close. The client counts what arrives.
func source(c net.Conn, size int, count uint64) error {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return fmt.Errorf("waiting for the start: %w", err)
	}
	if b[0] != startByte {
		return fmt.Errorf("unexpected byte %#x instead of the start", b[0])
	}
	// A reader waits for the client's half-close (its stop) while the
	// writer sends; it ends at the latest when handle closes c.
	var stop atomic.Bool
	stopped := make(chan error, 1)
	go func() {
		_, err := c.Read(b[:])
		if err == nil {
			err = errors.New("data from the client during a reverse test")
		} else if err == io.EOF {
			err = nil
		}
		stop.Store(true)
		stopped <- err
	}()
	msg := make([]byte, size)
	for i := uint64(0); (count == 0 || i < count) && !stop.Load(); i++ {
		if _, err := c.Write(msg); err != nil {
			return err
		}
	}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return fmt.Errorf("%T cannot close its writing side", c)
	}
	if err := cw.CloseWrite(); err != nil {
		return err
	}
	// Done when the client is: with a count it closes once it has read
	// everything (without one, its half-close came already).
	return <-stopped
}
