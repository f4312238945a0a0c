package rdma_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Deadlines over real connections.

func TestReadDeadline(t *testing.T) {
	c, s := pair(t, nil, nil)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err := c.Read(make([]byte, 10))
	oe := requireOpError(t, err, "read")
	require.True(t, oe.Timeout())
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	// Still usable after a timeout.
	require.NoError(t, c.SetReadDeadline(time.Time{}))
	transfer(t, s, c, "ok")
}
