package rdma_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

func TestDialRefused(t *testing.T) {
	needDevice(t)
	// A port that was just free: listen, note it, close.
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	d := rdma.Dialer{Timeout: 20 * time.Second}
	_, err = d.Dial("rdma", addr)
	require.Error(t, err)
	requireOpError(t, err, "dial")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Contains(t, err.Error(), "refused: no RDMA listener on that port")
	var re *rdma.RefusedError
	require.ErrorAs(t, err, &re)
	require.Equal(t, rdma.RefusedNoListener, re.Reason)
}

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

// TestSentinelErrorsSayRDMA: each error the package exports for errors.Is
// names the package, as the errors it formats do, so that a message
// relayed far from its caller still says where it came from.
func TestSentinelErrorsSayRDMA(t *testing.T) {
	for _, err := range []error{rdma.ErrNoDevice, rdma.ErrProtocol, rdma.ErrUnsupported, rdma.ErrRemoteAccess, rdma.ErrOutOfBounds} {
		require.True(t, strings.HasPrefix(err.Error(), "rdma: "), "%q", err)
	}
}

// TestForeignClientRejected: a perftest client dialing our listener is
// refused, and the listener keeps serving.
func TestForeignClientRejected(t *testing.T) {
	needDevice(t)
	path, err := exec.LookPath("ib_send_lat")
	if err != nil {
		t.Skip("ib_send_lat (perftest) not installed")
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	port := ln.Addr().(*rdma.Addr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "-R", "-p", strconv.Itoa(port), "-n", "5", testAddr).CombinedOutput()
	require.Error(t, err, "ib_send_lat should fail against a foreign listener: %s", out)
	require.NoError(t, ctx.Err(), "ib_send_lat hung")

	go func() {
		if c, err := ln.Accept(); err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	c, err := rdma.Dial("rdma", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("still serving"))
	require.NoError(t, err)
	b := make([]byte, 13)
	_, err = io.ReadFull(c, b)
	require.NoError(t, err)
}

// TestForeignServer: dialing a perftest server fails with ErrProtocol (or
// is refused), never hangs.
func TestForeignServer(t *testing.T) {
	needDevice(t)
	path, err := exec.LookPath("ib_send_lat")
	if err != nil {
		t.Skip("ib_send_lat (perftest) not installed")
	}
	const port = 18515
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, path, "-R", "-p", strconv.Itoa(port), "-n", "5")
	require.NoError(t, srv.Start())
	defer srv.Wait()
	defer srv.Process.Kill()
	addr := net.JoinHostPort(testAddr, strconv.Itoa(port))
	var derr error
	for i := 0; i < 50; i++ { // until the server listens
		d := rdma.Dialer{Timeout: 10 * time.Second}
		var c net.Conn
		c, derr = d.Dial("rdma", addr)
		if c != nil {
			c.Close()
		}
		if !errors.Is(derr, syscall.ECONNREFUSED) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.Error(t, derr)
	requireOpError(t, derr, "dial")
	require.ErrorIs(t, derr, rdma.ErrProtocol)
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
