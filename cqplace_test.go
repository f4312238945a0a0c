package rdma

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPlaceCQ(t *testing.T) {
	const max, initial = 1000, 100
	for _, tc := range []struct {
		name  string
		loads []cqLoad
		cqe   int
		want  cqPlacement
	}{
		{"the first CQ", nil, 40, cqPlacement{-1, initial}},
		{"a big first connection", nil, 400, cqPlacement{-1, 400}},
		{"room in the first", []cqLoad{{100, 50}}, 40, cqPlacement{0, 100}},
		{"exactly full", []cqLoad{{100, 60}}, 40, cqPlacement{0, 100}},
		{"grow by doubling", []cqLoad{{100, 80}}, 40, cqPlacement{0, 200}},
		{"grow to what is needed", []cqLoad{{100, 80}}, 300, cqPlacement{0, 380}},
		{"grow only to the maximum", []cqLoad{{600, 590}}, 40, cqPlacement{0, max}},
		{"a later CQ has room", []cqLoad{{max, 990}, {100, 10}}, 40, cqPlacement{1, 100}},
		{"room before growth", []cqLoad{{200, 190}, {max, 10}}, 40, cqPlacement{1, max}},
		{"grow a later one", []cqLoad{{max, 990}, {100, 90}}, 40, cqPlacement{1, 200}},
		{"all full: a new CQ", []cqLoad{{max, 990}, {max, 970}}, 40, cqPlacement{-1, initial}},
		{"one connection alone at the maximum", []cqLoad{{max, 1}}, max, cqPlacement{-1, max}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := placeCQ(tc.loads, tc.cqe, max, initial, true)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			if got.index >= 0 {
				require.LessOrEqual(t, tc.loads[got.index].reserved+tc.cqe, got.size, "it fits")
			}
			require.LessOrEqual(t, got.size, max)
		})
	}
	_, err := placeCQ(nil, max+1, max, initial, true)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.ErrorContains(t, err, "takes 1001 completion queue entries")
}

// TestPlaceCQFills places connections one by one as a device would: the
// CQs never pass the maximum, and a new one starts only when no CQ can
// take the connection.
func TestPlaceCQFills(t *testing.T) {
	const max, initial, cqe = 32767, 8192, 43
	var loads []cqLoad
	for n := 0; n < 10000; n++ {
		p, err := placeCQ(loads, cqe, max, initial, true)
		require.NoError(t, err)
		if p.index < 0 {
			for _, l := range loads {
				require.Greater(t, l.reserved+cqe, max, "a new CQ while one had room")
			}
			loads = append(loads, cqLoad{cap: p.size})
			p.index = len(loads) - 1
		}
		loads[p.index].cap = p.size
		loads[p.index].reserved += cqe
		require.LessOrEqual(t, loads[p.index].reserved, p.size)
	}
	require.Len(t, loads, (10000+max/cqe-1)/(max/cqe), "%d connections per CQ", max/cqe)
}

// TestPlaceCQNoResize: a device that cannot resize CQs gets CQs of
// fixedCQE entries (its maximum if less), filled before another is made,
// and none is ever grown.
func TestPlaceCQNoResize(t *testing.T) {
	const max, initial, cqe = 1000, 100, 40
	var loads []cqLoad
	for n := 0; n < 100; n++ {
		p, err := placeCQ(loads, cqe, max, initial, false)
		require.NoError(t, err)
		if p.index < 0 {
			require.Equal(t, max, p.size)
			loads = append(loads, cqLoad{cap: p.size})
			p.index = len(loads) - 1
		}
		require.Equal(t, loads[p.index].cap, p.size, "never grown")
		loads[p.index].reserved += cqe
	}
	require.Len(t, loads, 4, "25 connections of 40 entries per CQ of 1,000")

	// A device whose maximum is huge (siw: 3,276,800) gets CQs of
	// fixedCQE, or of one connection's need if more.
	p, err := placeCQ(nil, cqe, 3276800, initial, false)
	require.NoError(t, err)
	require.Equal(t, cqPlacement{-1, fixedCQE}, p)
	p, err = placeCQ([]cqLoad{{fixedCQE, fixedCQE - 10}}, 2*fixedCQE, 3276800, initial, false)
	require.NoError(t, err)
	require.Equal(t, cqPlacement{-1, 2 * fixedCQE}, p)
}
