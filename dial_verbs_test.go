//go:build linux && cgo

package rdma_test

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
	"github.com/goverbs/rdma/internal/rdmacm"
)

// Device tests that need the rdma_cm layer itself (a server that does not
// follow this package's handshake): cgo builds only.

// TestDialServerNeverAnswers: a listener that receives the request and
// never answers it (its process stopped reading CM events) does not hold a
// Dial without a timeout forever: DefaultDialTimeout bounds it (shortened
// here).
func TestDialServerNeverAnswers(t *testing.T) {
	needDevice(t)
	ch, err := rdmacm.NewEventChannel()
	require.NoError(t, err)
	defer func() {
		ch.Interrupt()
		ch.Destroy()
	}()
	id, err := rdmacm.NewID(ch, 1)
	require.NoError(t, err)
	defer id.Destroy()
	require.NoError(t, id.Bind(netip.AddrPortFrom(netip.MustParseAddr(testAddr), 0)))
	require.NoError(t, id.Listen(8))

	defer rdma.SetDefaultDialTimeout(2 * time.Second)()
	start := time.Now()
	_, err = rdma.Dial("rdma", id.LocalAddr().String())
	took := time.Since(start)
	oe := requireOpError(t, err, "dial")
	require.True(t, oe.Timeout(), "%v", err)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Less(t, took, 10*time.Second)
	t.Logf("a dial to a server that never answers gave up after %v: %v", took.Round(time.Millisecond), err)
}
