package rdma_test

import (
	"fmt"
	"io"
	"strconv"
	"testing"

	"github.com/goverbs/rdma"
)

// BenchmarkRoundTrip measures a Write and its echo, in the default and the
// busy poll mode (make microbench runs it in the VM).
func BenchmarkRoundTrip(b *testing.B) {
	for _, m := range []rdma.PollMode{rdma.PollAdaptive, rdma.PollBusy} {
		for _, size := range []int{64, 4096} {
			b.Run(fmt.Sprintf("%s/%d", m, size), func(b *testing.B) {
				opts := rdma.Options{Poll: m}
				c, s := pair(b, &rdma.ListenConfig{Options: opts}, &rdma.Dialer{Options: opts})
				go io.Copy(s, s)
				buf := make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkStream measures one-way streaming of Writes of a given size; the
// clock covers delivery, not just queuing: it stops when the reader has
// every byte.
func BenchmarkStream(b *testing.B) {
	for _, size := range []int{64, 4096, 65536} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			c, s := pair(b, nil, nil)
			done := make(chan int64, 1)
			go func() {
				n, _ := io.Copy(io.Discard, s)
				done <- n
			}()
			buf := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			var sent int64
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				sent += int64(size)
			}
			if err := c.CloseWrite(); err != nil {
				b.Fatal(err)
			}
			if got := <-done; got != sent {
				b.Fatalf("reader got %d bytes, %d were written", got, sent)
			}
		})
	}
}
