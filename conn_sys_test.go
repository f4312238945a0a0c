package rdma

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// connSys's own steps over the fake connection manager (cm_test.go).

// A disconnect that librdmacm refuses (iWARP's, of a QP that never
// reached RTS) still moves the QP to the error state, so that its
// receives flush now.
func TestDisconnectFallsBackToErrorQP(t *testing.T) {
	f := useFakeCM(t)
	c, err := fakeDial(t, 5*time.Second)
	require.NoError(t, err)
	id := f.ids[0]
	f.on("Disconnect", func(*fakeID, []byte) error { return syscall.EINVAL })
	c.connSys.disconnect()
	// The disconnect's event may start the release meanwhile, whose
	// drain moves the QP to the error state again: look for the
	// disconnect's own fallback, not at the list's end.
	calls := id.callList()
	i := slices.Index(calls, "Disconnect")
	require.GreaterOrEqual(t, i, 0, "%v", calls)
	require.Less(t, i+1, len(calls), "%v", calls)
	require.Equal(t, "ErrorQP", calls[i+1], "%v", calls)
	f.on("Disconnect", nil)
	require.NoError(t, c.Close())
	f.waitReleased(t)
}

// A Conn built on fakes for the data path has no id: its steps do
// nothing.
func TestConnSysWithoutID(t *testing.T) {
	var s connSys
	s.disconnect()
	s.errorQP()
	require.False(t, s.wasDialed())
}
