package rdmacm

import (
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// A failed call's error names the call and keeps its errno; without one
// it is EIO, not ENODEV ("no device").
func TestCallError(t *testing.T) {
	for _, tc := range []struct {
		errno error
		want  syscall.Errno
	}{
		{syscall.ENODEV, syscall.ENODEV},
		{syscall.ENOMEM, syscall.ENOMEM},
		{syscall.EIO, syscall.EIO},
		{nil, syscall.EIO},
	} {
		err := callError("rdma_create_event_channel", tc.errno)
		var se *os.SyscallError
		require.ErrorAs(t, err, &se)
		require.Equal(t, "rdma_create_event_channel", se.Syscall)
		require.Equal(t, tc.want, se.Err, "errno %v", tc.errno)
	}
}
