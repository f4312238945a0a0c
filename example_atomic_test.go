package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"time"

	"github.com/goverbs/rdma"
)

// A lock service without a server thread: the server owns one 8-byte
// word, shared with every client's connection (Conn.ShareRegion), and the
// clients take and release the lock with compare-and-swap on it, which the
// server's NIC performs. The server's CPU only hands out the key.

// serveLock shares one lock word with every client of ln, until ln is
// closed.
func serveLock(ln net.Listener) error {
	var word *rdma.Region // registered on the first client's connection
	defer func() {
		if word != nil {
			word.Close()
		}
	}()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return err
		}
		c := nc.(*rdma.Conn)
		var r *rdma.Region
		if word == nil {
			r, err = c.RegisterRegion(rdma.AtomicSize, rdma.RemoteAtomic)
			word = r
		} else {
			r, err = c.ShareRegion(word, rdma.RemoteAtomic)
		}
		if err != nil {
			c.Close()
			return err
		}
		go func() {
			defer c.Close()
			if r != word {
				defer r.Close() // the word stays mapped while others share it
			}
			key, _ := r.Key().MarshalBinary()
			if _, err := c.Write(key); err != nil {
				return
			}
			io.Copy(io.Discard, c) // until the client hangs up
		}()
	}
}

// lockClient takes and releases the server's lock.
type lockClient struct {
	c    *rdma.Conn
	word *rdma.RemoteRegion
	id   uint64 // nonzero: what the word holds while this client has the lock
}

func dialLock(addr string, id uint64) (*lockClient, error) {
	c, word, err := dialRegion(addr) // see example_region_test.go
	if err != nil {
		return nil, err
	}
	return &lockClient{c: c, word: word, id: id}, nil
}

// lock spins until the word goes from 0 (free) to the client's id, or ctx
// ends.
func (lc *lockClient) lock(ctx context.Context) error {
	for {
		prev, err := lc.word.CompareAndSwap(ctx, 0, 0, lc.id)
		if err != nil || prev == 0 {
			return err
		}
		time.Sleep(10 * time.Microsecond) // held by client prev: back off a little
	}
}

// unlock frees the lock, which the client must hold.
func (lc *lockClient) unlock(ctx context.Context) error {
	prev, err := lc.word.CompareAndSwap(ctx, 0, lc.id, 0)
	if err == nil && prev != lc.id {
		err = fmt.Errorf("lock held by %d, not by %d", prev, lc.id)
	}
	return err
}

func (lc *lockClient) Close() error { return lc.c.Close() }

// Two clients take turns holding the lock. (Needs an RDMA device at
// 10.0.0.1 with remote atomics, as Soft-RoCE and RoCE/InfiniBand NICs have
// and soft-iWARP has not; TestAtomicLockService runs the same code.)
func ExampleRemoteRegion_CompareAndSwap() {
	ln, err := rdma.Listen("rdma", "10.0.0.1:7474")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go serveLock(ln)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := dialLock(ln.Addr().String(), 1)
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := dialLock(ln.Addr().String(), 2)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	if err := a.lock(ctx); err != nil {
		log.Fatal(err)
	}
	// b cannot take it while a holds it.
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	fmt.Println("b while a holds it:", errors.Is(b.lock(short), context.DeadlineExceeded))
	if err := a.unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("b once a released it:", b.lock(ctx) == nil)
}

// A distributed counter: each FetchAdd returns a ticket no other caller
// gets, whichever connection it comes from. (Needs an RDMA device, as the
// example before it.)
func ExampleRemoteRegion_FetchAdd() {
	ln, err := rdma.Listen("rdma", "10.0.0.1:7475")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go serveLock(ln) // any shared word will do: here, the lock service's

	c, err := dialLock(ln.Addr().String(), 0)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		ticket, err := c.word.FetchAdd(context.Background(), 0, 1)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("ticket", ticket)
	}
}
