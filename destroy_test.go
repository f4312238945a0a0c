package rdma

import (
	"errors"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// retryDestroy retries a failing destroy, stops at the first success,
// and gives up after destroyTries calls with the last error.
func TestRetryDestroy(t *testing.T) {
	calls := 0
	failing := func(n int) func() error {
		calls = 0
		return func() error {
			calls++
			if calls <= n {
				return syscall.EBUSY
			}
			return nil
		}
	}
	require.NoError(t, retryDestroy(failing(0)))
	require.Equal(t, 1, calls, "a success is not repeated")
	require.NoError(t, retryDestroy(failing(3)), "a transient failure is retried")
	require.Equal(t, 4, calls)

	last := errors.New("still busy")
	calls = 0
	err := retryDestroy(func() error {
		calls++
		if calls == destroyTries {
			return last
		}
		return syscall.EBUSY
	})
	require.Equal(t, last, err, "the last failure is returned")
	require.Equal(t, destroyTries, calls, "bounded")
}
