//go:build linux && cgo

package rdma

import (
	"testing"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/stretchr/testify/require"
)

// An arena in whose PD a registration could not be undone (a region's, a
// big ring's, or the receive ring's own when it is rekeyed) serves no
// other connection, whose peer could use that registration's key; nor
// does one whose receive ring lost its registration.
func TestArenaReusable(t *testing.T) {
	a := &arena{recvMR: &ibv.MR{}}
	require.True(t, a.reusable())
	a.stuck.Add(1)
	require.False(t, a.reusable(), "a registration in its PD stayed")
	require.False(t, (&arena{recvMR: &ibv.MR{}, stale: true}).reusable(), "a past peer's key still works on its receive ring")
	require.False(t, (&arena{}).reusable(), "its receive ring is not registered")
}
