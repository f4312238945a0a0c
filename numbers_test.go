package rdma

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// The numbers the docs quote (README, docs/, godoc, error messages),
// pinned: a change of one of them fails here, where the docs that quote
// it are named (README sections by their headings).
func TestDocumentedNumbers(t *testing.T) {
	opts, err := Options{}.normalized()
	require.NoError(t, err)
	// README "Sizing", docs/operations.md and rdmainfo's header: buffer
	// 64 KiB, send depth 16, recv depth 64.
	require.Equal(t, 64<<10, opts.BufferSize)
	require.Equal(t, 16, opts.SendDepth)
	require.Equal(t, 64, opts.RecvDepth)

	// README "Sizing" (and "How it differs from TCP" for the 32 KiB): 32
	// KiB registered by an idle connection end, 2,080 KiB by one grown,
	// and 108 CQ entries per connection end; resources.go's message:
	// RecvDepth + SendDepth + 28.
	lay := newLayout(opts)
	require.Equal(t, 32<<10, lay.size())
	require.Equal(t, 2080<<10, lay.size()+2*lay.bigRing)
	mem, err := Options{}.RegisteredMemory()
	require.NoError(t, err)
	require.Equal(t, 32<<10, mem)
	require.Equal(t, 108, lay.cqEntries())
	require.Equal(t, 28, cqFixed)
	require.Equal(t, opts.RecvDepth+opts.SendDepth+cqFixed, lay.cqEntries())
	require.Contains(t, (&cqLimitError{need: 108, max: 100}).Error(), "RecvDepth + SendDepth + 28")

	// README "Sizing" and docs/operations.md (F3): a listener keeps at
	// most 32 MiB of half-open connections, 1,024 of 32 KiB with the
	// defaults (and at least 32), and never more than its backlog; a new
	// request evicts the oldest one once stale (a second without
	// progress, at most 30 s), and is refused as busy otherwise; the
	// Dialer's doc and the CHANGELOG: a busy dial tries again after 5 ms
	// doubling to 1 s, at most 128 dials to one address are in their
	// handshake at once, each turn held 2 s at most, and at least 4 setups
	// run at once.
	require.Equal(t, 32<<20, halfOpenMemory)
	require.Equal(t, 128, halfOpenLimit(opts, 128))
	require.Equal(t, 1024, halfOpenLimit(opts, 4096))
	require.Equal(t, 32<<20, halfOpenLimit(opts, 4096)*lay.size())
	require.Equal(t, 32, minHalfOpen)
	require.Equal(t, time.Second, halfOpenGrace)
	require.Equal(t, 30*time.Second, halfOpenStale)
	require.Equal(t, 5*time.Millisecond, busyPause)
	require.Equal(t, time.Second, busyPauseMax)
	require.Equal(t, 128, maxDialsInFlight)
	require.Equal(t, 2*time.Second, turnHold)
	require.GreaterOrEqual(t, cap(setupSlots), 4)

	// README "How it differs from TCP" and Close's godoc: the linger for
	// a peer that leaves no receive free, 3 s.
	require.Equal(t, 3*time.Second, lingerTimeout)
	// docs/operations.md "Failures": a peer's first 8 ring offers are
	// followed, then one a second.
	require.Equal(t, 8, ringBurst)
	require.Equal(t, time.Second, ringRefill)
	// ListenConfig.Refused: past 256 refusals waiting, the CM goroutine
	// makes them.
	require.Equal(t, 256, maxQueuedRefusals)
	// bench/history.md: a Read or Write of at most 512 bytes copies with
	// the lock held; CONTRIBUTING.md's table of tests: on a NIC a post of
	// at most 2 KiB is made with it held; poller.go, beside the siw CQ
	// size in docs/providers.md: a destroyed QP's number is held for at
	// most 32,768 completions.
	require.Equal(t, 512, smallCopy)
	require.Equal(t, 2048, heldPostBytes)
	require.Equal(t, 32768, staleBatches*ibv.MaxPollBatch)
	// docs/datagrams.md and PacketConn's godoc: a destination not heard
	// from for 5 s is resolved again; datagrams from another QP start at
	// most one resolution a second.
	require.Equal(t, 5*time.Second, peerRefreshAfter)
	require.Equal(t, time.Second, peerVerifyEvery)
	// README "How it differs from TCP" and "Failures": a Dial without a
	// timeout gives up after 2 min.
	require.Equal(t, 2*time.Minute, DefaultDialTimeout)
	// README "Failures": a port down for over 10 s fails its connections.
	require.Equal(t, 10*time.Second, portDownGrace)
	// README "Sizing": a 64 B message takes 64 B of the peer's ring.
	require.Equal(t, 64, wire.RingAlign)
	// README "How it differs from TCP": a request written in two pieces
	// never waits when the peer has at least 4 receives (hold begins at
	// two unconsumed messages, half the peer's receives at most).
	l := newLedger(opts.RecvDepth)
	l.open(4, wire.CtrlDepth)
	require.Equal(t, 2, l.holdAt)
	l.open(3, wire.CtrlDepth)
	require.Equal(t, 1, l.holdAt)
}
