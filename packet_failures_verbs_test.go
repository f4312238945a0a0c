//go:build linux && cgo

package rdma

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

// releaseRuns: the build's release frees what it holds (the peer cache
// closes), as the fake fabric lets the verbs side's release run.
const releaseRuns = true

// cutShortResolution writes to ap, a new destination, once the release
// has begun (no resolution starts then: the one asked for ends at once
// with the error the release gives), and requires ErrNoDevice.
func cutShortResolution(t *testing.T, c *PacketConn, ap netip.AddrPort) {
	c.resMu.Lock()
	c.resClosed = true
	c.resMu.Unlock()
	_, err := c.WriteToAddrPort([]byte("x"), ap)
	require.ErrorIs(t, err, ErrNoDevice)
	require.NotContains(t, err.Error(), "closed")
}
