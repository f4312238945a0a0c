//go:build linux && cgo

package rdma

import (
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPortTaken: only rdma_connect's EADDRNOTAVAIL (TCP still holds the
// port rdma_cm chose, on iWARP) makes a dial try again with a new id.
func TestPortTaken(t *testing.T) {
	require.True(t, portTaken(os.NewSyscallError("rdma_connect", syscall.EADDRNOTAVAIL)))
	require.True(t, portTaken(fmt.Errorf("dial: %w", os.NewSyscallError("rdma_connect", syscall.EADDRNOTAVAIL))))
	require.False(t, portTaken(os.NewSyscallError("rdma_resolve_addr", syscall.EADDRNOTAVAIL)))
	require.False(t, portTaken(os.NewSyscallError("rdma_connect", syscall.ECONNREFUSED)))
	require.False(t, portTaken(syscall.EADDRNOTAVAIL))
	require.False(t, portTaken(nil))
}
