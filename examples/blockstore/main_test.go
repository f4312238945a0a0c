package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goverbs/rdma"
)

var testAddr = os.Getenv("RDMA_TEST_ADDR")

func needDevice(t testing.TB) {
	t.Helper()
	if testAddr == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test does, in the VM)")
	}
}

// TestMain checks, once the devices the tests used are let go, that no
// goroutine is left.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		for deadline := time.Now().Add(10 * time.Second); len(rdma.Devices()) > 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func startServer(t *testing.T, blocks int) string {
	t.Helper()
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go serve(ln, blocks)
	return ln.Addr().String()
}

// TestBlockStore: the store's size learned from its key, blocks written
// and read back by one-sided RDMA, an access past the store's end refused
// before anything is posted, and the server's own memory holding what the
// client wrote.
func TestBlockStore(t *testing.T) {
	needDevice(t)
	const blocks = 64
	bc, err := dialStore(startServer(t, blocks))
	require.NoError(t, err)
	defer bc.Close()
	require.Equal(t, blocks, bc.blocks())

	// The server's memory, as the client makes it: zeroed, then these.
	want := make([]byte, blocks*blockSize)
	for _, i := range []int{0, 7, blocks - 1} {
		block := want[i*blockSize : (i+1)*blockSize]
		copy(block, fmt.Sprintf("block %d", i))
		require.NoError(t, bc.writeBlock(i, block))
	}
	got := make([]byte, blockSize)
	for i := range blocks {
		require.NoError(t, bc.readBlock(i, got))
		require.True(t, bytes.Equal(want[i*blockSize:(i+1)*blockSize], got), "block %d", i)
	}

	err = bc.writeBlock(blocks, got)
	require.ErrorIs(t, err, rdma.ErrOutOfBounds, "a block past the store's end")
	require.NoError(t, bc.readBlock(7, got), "the connection after the refusal")
	require.Equal(t, "block 7", string(got[:7]))

	sum, err := bc.serverSum()
	require.NoError(t, err)
	mine := sha256.Sum256(want)
	require.Equal(t, mine[:], sum, "the server's memory holds the blocks written")
}

// TestRun: the program as go run runs it, server and client in one
// process.
func TestRun(t *testing.T) {
	needDevice(t)
	require.NoError(t, run(net.JoinHostPort(testAddr, "0"), false, false, 256))
}
