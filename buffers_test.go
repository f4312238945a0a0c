//go:build linux && cgo

package rdma

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLayout(t *testing.T) {
	defaults, err := Options{}.normalized()
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"small", Options{BufferSize: 4096, RecvDepth: 8, SendDepth: 4}},
		{"defaults", defaults},
		{"minimum", Options{BufferSize: minBufferSize, RecvDepth: 2, SendDepth: 2}},
		{"uneven", Options{BufferSize: 1000, RecvDepth: 3, SendDepth: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLayout(tc.o)
			require.Equal(t, tc.o.BufferSize, l.bufSize, "a buffer holds BufferSize bytes of payload, nothing else")
			require.Equal(t, tc.o.RecvDepth+ctrlDepth+finSlots, l.recvSlots)
			require.Equal(t, tc.o.SendDepth, l.sendSlots)
			require.Equal(t, ctrlDepth+finSlots, l.ctrlSlots)

			type region struct {
				kind     string
				i        int
				off, end int
			}
			var regions []region
			for i := range l.recvSlots {
				regions = append(regions, region{"recv", i, l.recvOff(i), l.recvOff(i) + l.bufSize})
			}
			for i := range l.sendSlots {
				regions = append(regions, region{"send", i, l.sendOff(i), l.sendOff(i) + l.bufSize})
			}
			// Listed in arena order: receives, then sends, each region
			// starting at or after the previous end.
			require.Zero(t, l.recvOff(0))
			require.True(t, sort.SliceIsSorted(regions, func(a, b int) bool { return regions[a].off < regions[b].off }),
				"regions are not ordered recv, send")
			for k := 1; k < len(regions); k++ {
				prev, cur := regions[k-1], regions[k]
				require.LessOrEqualf(t, prev.end, cur.off, "%s[%d] [%d,%d) overlaps %s[%d] [%d,%d)",
					prev.kind, prev.i, prev.off, prev.end, cur.kind, cur.i, cur.off, cur.end)
			}

			size := l.size()
			last := regions[len(regions)-1]
			require.Equal(t, "send", last.kind)
			require.Zero(t, size%4096, "size %d is not page-aligned", size)
			require.GreaterOrEqual(t, size, last.end, "size does not cover the last send buffer")
			require.Less(t, size-last.end, 4096, "size rounds up by more than a page")
			if tc.o.BufferSize%4096 == 0 {
				for _, r := range regions {
					require.Zerof(t, r.off%4096, "%s[%d] does not start on a page", r.kind, r.i)
				}
			}
		})
	}
}

func TestCompletionQueueEntries(t *testing.T) {
	n, err := Options{}.CompletionQueueEntries()
	require.NoError(t, err)
	require.Equal(t, DefaultRecvDepth+DefaultSendDepth+11, n, "receives (+4 control, +1 fin), sends, control sends (4 + fin), the drain marker")
	n, err = Options{SendDepth: 1024, RecvDepth: 1024}.CompletionQueueEntries()
	require.NoError(t, err)
	require.Equal(t, 2059, n)
	_, err = Options{SendDepth: -1}.CompletionQueueEntries()
	require.Error(t, err)
}
