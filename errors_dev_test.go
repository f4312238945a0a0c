package rdma_test

import (
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// The errors a Conn and Dial report over real devices, and without one.

func TestNoDevice(t *testing.T) {
	needDevice(t)
	_, err := rdma.Dial("rdma", "127.0.0.1:7471")
	require.Error(t, err)
	requireOpError(t, err, "dial")
	require.ErrorIs(t, err, rdma.ErrNoDevice)
	require.Contains(t, err.Error(), "rdma: no RDMA device serves this address")

	_, err = rdma.Listen("rdma", "127.0.0.1:0")
	require.Error(t, err)
	requireOpError(t, err, "listen")
	require.ErrorIs(t, err, rdma.ErrNoDevice)
}

// TestErrors pins the error contract in the spirit of net/error_test.go:
// what each failing call returns, its type and what it wraps.
func TestErrors(t *testing.T) {
	needDevice(t)
	c, s := pair(t, nil, nil)
	require.NoError(t, c.Close())
	for _, tc := range []struct {
		name string
		op   string
		err  func() error
		is   error
	}{
		{"read after close", "read", func() error { _, err := c.Read(make([]byte, 1)); return err }, net.ErrClosed},
		{"write after close", "write", func() error { _, err := c.Write([]byte("x")); return err }, net.ErrClosed},
		{"close twice", "close", c.Close, net.ErrClosed},
		{"close write after close", "close", c.CloseWrite, net.ErrClosed},
		{"set deadline after close", "set", func() error { return c.SetDeadline(time.Now()) }, net.ErrClosed},
		{"dial unknown network", "dial", func() error { _, err := rdma.Dial("udp", "10.0.0.1:1"); return err }, nil},
		{"dial bad address", "dial", func() error { _, err := rdma.Dial("rdma", "no-port"); return err }, nil},
		{"listen bad address", "listen", func() error { _, err := rdma.Listen("rdma", "no-port"); return err }, nil},
		{"dial no device", "dial", func() error { _, err := rdma.Dial("rdma", "127.0.0.1:1"); return err }, rdma.ErrNoDevice},
		{"listen no device", "listen", func() error { _, err := rdma.Listen("rdma", "127.0.0.1:0"); return err }, rdma.ErrNoDevice},
		{"dial bad options", "dial", func() error {
			d := rdma.Dialer{Options: rdma.Options{BufferSize: 1}}
			_, err := d.Dial("rdma", net.JoinHostPort(testAddr, "1"))
			return err
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			oe := requireOpError(t, err, tc.op)
			require.NotNil(t, oe.Err)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			}
		})
	}
	// The peer of a closed connection reads EOF, bare.
	_, err := s.Read(make([]byte, 1))
	require.Equal(t, io.EOF, err)
	// A timeout is a net.Error with Timeout() true that stays usable.
	require.NoError(t, s.SetReadDeadline(time.Now().Add(-time.Second)))
	_, err = s.Read(make([]byte, 1))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}
