package rdma

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The device and protocol error types: what they say and what they wrap.

func TestDeviceError(t *testing.T) {
	errNoDev := errors.New("no such device")
	var err error = &deviceError{os.NewSyscallError("rdma_resolve_addr", errNoDev)}

	require.ErrorIs(t, err, ErrNoDevice)
	require.ErrorIs(t, err, errNoDev)
	require.NotErrorIs(t, err, ErrProtocol)
	var se *os.SyscallError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "rdma_resolve_addr", se.Syscall)
	require.ErrorContains(t, err, "no RDMA device")
	require.ErrorContains(t, err, "rdma_resolve_addr")
	require.ErrorContains(t, err, "no such device")

	// Still reachable once wrapped the way Dial and Listen return it.
	op := &net.OpError{Op: "dial", Net: "rdma", Err: err}
	require.ErrorIs(t, op, ErrNoDevice)
	require.ErrorAs(t, op, &se)
	require.ErrorContains(t, op, "no RDMA device")
}

func TestProtocolError(t *testing.T) {
	var err error = &protocolError{"bad magic 0x1"}

	require.ErrorIs(t, err, ErrProtocol)
	require.NotErrorIs(t, err, ErrNoDevice)
	require.Equal(t, ErrProtocol.Error()+": bad magic 0x1", err.Error())

	wrapped := &net.OpError{Op: "read", Net: "rdma", Err: err}
	require.ErrorIs(t, wrapped, ErrProtocol)
	var pe *protocolError
	require.ErrorAs(t, wrapped, &pe)
	require.Equal(t, "bad magic 0x1", pe.detail)
}

// TestSentinelErrorsSayRDMA: each error the package exports for errors.Is
// names the package, as the errors it formats do, so that a message
// relayed far from its caller still says where it came from.
func TestSentinelErrorsSayRDMA(t *testing.T) {
	for _, err := range []error{ErrNoDevice, ErrProtocol, ErrUnsupported, ErrRemoteAccess, ErrOutOfBounds} {
		require.True(t, strings.HasPrefix(err.Error(), "rdma: "), "%q", err)
	}
}
