package rdma_test

import (
	"fmt"
	"log"

	"github.com/goverbs/rdma"
)

// A datagram echo: a PacketConn answers each datagram to its sender, as a
// UDP server would.
func ExampleListenPacket() {
	srv, err := rdma.ListenPacket("rdma", "10.0.0.1:0") // an RDMA interface's address
	if err != nil {
		log.Fatal(err) // e.g. rdma.ErrNoDevice
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 65507)
		for {
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			srv.WriteTo(buf[:n], from)
		}
	}()

	c, err := rdma.ListenPacket("rdma", "10.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.WriteTo([]byte("ping"), srv.LocalAddr()); err != nil {
		log.Fatal(err) // the destination could not be resolved, say
	}
	buf := make([]byte, 100)
	n, from, err := c.ReadFrom(buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s from %v\n", buf[:n], from)
}
