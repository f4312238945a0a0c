//go:build linux && cgo

package rdma

import (
	"testing"

	"golang.org/x/sys/unix"

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

// A pooled arena's memory is cleared before another connection has it
// (keepArena scrubs it): the receive ring, the send ring and the header
// slots alike.
func TestArenaClear(t *testing.T) {
	lay := testLayout(t)
	mem, err := mapMemory(lay.size())
	require.NoError(t, err)
	defer unix.Munmap(mem)
	for i := range mem {
		mem[i] = 0x5a
	}
	a := &arena{mem: mem, recv: mem[lay.recvOff() : lay.recvOff()+lay.ring]}
	a.clear()
	require.Equal(t, make([]byte, len(mem)), mem)
}

// What scrubbing a pooled arena costs (its memset; the rekey is one
// deregistration and registration, which the setup it saves also makes,
// twice), beside what setting the same memory up anew costs without a
// device: mapping and faulting it in, then unmapping it.
func BenchmarkScrubArena(b *testing.B) {
	lay := testLayout(b)
	b.Run("clear", func(b *testing.B) {
		mem, err := mapMemory(lay.size())
		require.NoError(b, err)
		defer unix.Munmap(mem)
		a := &arena{mem: mem}
		b.SetBytes(int64(len(mem)))
		for b.Loop() {
			a.clear()
		}
	})
	b.Run("map", func(b *testing.B) {
		b.SetBytes(int64(lay.size()))
		for b.Loop() {
			mem, err := mapMemory(lay.size())
			if err != nil {
				b.Fatal(err)
			}
			unix.Munmap(mem)
		}
	})
}

// testLayout is the layout of a connection with the default Options.
func testLayout(t testing.TB) layout {
	o, err := Options{}.normalized()
	require.NoError(t, err)
	return newLayout(o)
}
