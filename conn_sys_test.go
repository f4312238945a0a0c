package rdma

import (
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
	calls := id.callList()
	require.Equal(t, []string{"Disconnect", "ErrorQP"}, calls[len(calls)-2:])
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
