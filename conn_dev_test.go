package rdma_test

import (
	"errors"
	"net"
	"testing"

	"golang.org/x/net/nettest"

	"github.com/goverbs/rdma"
)

// TestNetTestConn runs golang.org/x/net/nettest's net.Conn conformance
// suite over connection pairs made with Listen and Dial.
func TestNetTestConn(t *testing.T) {
	needDevice(t)
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		acc := make(chan net.Conn, 1)
		go func() {
			c, _ := ln.Accept()
			acc <- c
		}()
		c1, err = rdma.Dial("rdma", ln.Addr().String())
		if err != nil {
			return nil, nil, nil, err
		}
		c2 = <-acc
		if c2 == nil {
			c1.Close()
			return nil, nil, nil, errors.New("accept failed")
		}
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}
