package main

import (
	"crypto/sha256"
	"io"
	"log"
	"net"

	"github.com/goverbs/rdma"
)

// serve gives each client of ln a store of its own, until ln is closed.
func serve(ln net.Listener, blocks int) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			if err := serveConn(c.(*rdma.Conn), blocks); err != nil {
				log.Print(err)
			}
		}()
	}
}

func serveConn(c *rdma.Conn, blocks int) error {
	defer c.Close()
	store, err := c.RegisterRegion(blocks*blockSize, rdma.RemoteRead|rdma.RemoteWrite)
	if err != nil {
		return err
	}
	defer store.Close() // revokes the key: the client is done with it
	key, err := store.Key().MarshalBinary()
	if err != nil {
		return err
	}
	if _, err := c.Write(key); err != nil {
		return err
	}
	// The client's READs and WRITEs need nothing of this side until it
	// says it is done: end of file.
	if _, err := io.Copy(io.Discard, c); err != nil {
		return err
	}
	sum := sha256.Sum256(store.Bytes())
	_, err = c.Write(sum[:])
	return err
}
