// Command echo runs an RDMA echo server and client in one process and
// prints round-trip latency and throughput for a few message sizes.
//
//	go run ./examples/echo -addr 10.77.0.1:0
//
// The address must belong to an interface with an RDMA device (a RoCE or
// IPoIB netdev, or one with a Soft-RoCE device on it); port 0 picks a free
// port.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"

	"github.com/goverbs/rdma"
)

func main() {
	addr := flag.String("addr", os.Getenv("RDMA_TEST_ADDR")+":0", "listen address (an RDMA interface's IP and a port)")
	rounds := flag.Int("n", 2000, "round trips per size")
	spin := flag.Duration("spin", 0, "how long a waiting Read polls before it parks (0: the default; negative: never)")
	flag.Parse()
	if err := run(*addr, *rounds, rdma.Options{SpinTime: *spin}); err != nil {
		log.Fatal(err)
	}
}

func run(addr string, rounds int, opts rdma.Options) error {
	lc := rdma.ListenConfig{Options: opts}
	ln, err := lc.Listen(context.Background(), "rdma", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	go serve(ln)

	d := rdma.Dialer{Options: opts}
	c, err := d.Dial("rdma", ln.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("connected %s -> %s\n", c.LocalAddr(), c.RemoteAddr())
	fmt.Printf("%10s %8s %12s %12s\n", "size", "rounds", "rtt", "MB/s")
	for _, size := range []int{64, 4 << 10, 64 << 10, 1 << 20} {
		n := rounds
		if size >= 64<<10 {
			n = max(10, rounds/20)
		}
		msg := make([]byte, size)
		rand.Read(msg)
		back := make([]byte, size)
		start := time.Now()
		for i := 0; i < n; i++ {
			if _, err := c.Write(msg); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, back); err != nil {
				return err
			}
		}
		el := time.Since(start)
		if !bytes.Equal(msg, back) {
			return fmt.Errorf("echo of %d bytes came back different", size)
		}
		rtt := el / time.Duration(n)
		mbs := float64(2*size*n) / el.Seconds() / 1e6
		fmt.Printf("%10d %8d %12v %12.1f\n", size, n, rtt.Round(100*time.Nanosecond), mbs)
	}
	return nil
}

func serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
}
