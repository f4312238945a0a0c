package rdma

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

// The resource errors, and the inline room that headers sent as SENDs
// need.

// A QP whose inline room cannot take a header fails the setup of a
// connection whose headers go as SENDs (posted inline), with an error
// that says why; where immediate data carries the headers, any inline
// room, none included, will do.
func TestCheckInline(t *testing.T) {
	o, err := Options{}.normalized()
	require.NoError(t, err)
	imm, hdrs := newLayout(o), newLayout(o).withHeaders()
	for _, n := range []int{0, 1, ibv.HeaderLen - 1, ibv.HeaderLen, 64, 256} {
		require.NoError(t, checkInline(imm, n), "immediate data, %d bytes inline", n)
		err := checkInline(hdrs, n)
		if n >= ibv.HeaderLen {
			require.NoError(t, err, "headers as SENDs, %d bytes inline", n)
			continue
		}
		require.ErrorIs(t, err, syscall.EOPNOTSUPP, "headers as SENDs, %d bytes inline", n)
		require.Contains(t, err.Error(), "inline")
	}
}

func TestResourceErrorsSayWhatToDo(t *testing.T) {
	me := &memlockError{need: 2368 << 10, limit: 64 << 10, err: syscall.ENOMEM}
	for _, want := range []string{"2368 KiB", "RLIMIT_MEMLOCK 64 KiB", "ulimit -l", "LimitMEMLOCK=infinity", "Options.BufferSize"} {
		require.Contains(t, me.Error(), want)
	}
	require.ErrorIs(t, me, syscall.ENOMEM)

	mm := &mmapError{need: 4 << 20, err: syscall.ENOMEM}
	require.Contains(t, mm.Error(), "4096 KiB")
	require.ErrorIs(t, mm, syscall.ENOMEM)

	cq := &cqLimitError{need: 32790, max: 32767}
	for _, want := range []string{"takes 32790", "32767 per completion queue (max_cqe)", "SendDepth and RecvDepth"} {
		require.Contains(t, cq.Error(), want)
	}
	require.ErrorIs(t, cq, syscall.ENOSPC)
}
