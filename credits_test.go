package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/wire"
)

func openLedger(recvDepth, peerRecv, peerCtrl int) ledger {
	l := newLedger(recvDepth)
	l.open(peerRecv, peerCtrl)
	return l
}

func TestLedgerOpen(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		recv, peerRecv, peerCtrl int
		batch, holdAt, ctrl      int
	}{
		{"defaults", 16, 16, wire.CtrlDepth, 4, holdDepth, wire.CtrlDepth},
		{"small window holds at one", 2, 2, wire.CtrlDepth, 2, 1, wire.CtrlDepth},
		{"three receives", 3, 3, 1, 2, 1, 1},
		{"a request is never reported on its own", 4, 4, wire.CtrlDepth, 2, holdDepth, wire.CtrlDepth},
		{"peer grants more control credits than we use", 64, 64, 200, 16, holdDepth, wire.CtrlDepth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := openLedger(tc.recv, tc.peerRecv, tc.peerCtrl)
			require.Equal(t, tc.batch, l.batch)
			require.Equal(t, tc.peerRecv, l.credits)
			require.Equal(t, tc.peerRecv, l.peerWindow)
			require.Equal(t, tc.holdAt, l.holdAt)
			require.Equal(t, tc.ctrl, l.ctrlCredits)
		})
	}
}

func TestLedgerReceived(t *testing.T) {
	l := openLedger(16, 8, wire.CtrlDepth)
	more, err := l.received(wire.Header{Type: wire.MsgData})
	require.NoError(t, err)
	require.False(t, more, "a header without credits wakes no writer")

	for range 5 {
		l.spend()
	}
	l.ctrlCredits -= 2
	more, err = l.received(wire.Header{Type: wire.MsgCredit, Credits: 5, CtrlAck: 2})
	require.NoError(t, err)
	require.True(t, more)
	require.Equal(t, 8, l.credits)
	require.Equal(t, wire.CtrlDepth, l.ctrlCredits)

	// A peer returning credits it was never sent breaks the protocol.
	_, err = l.received(wire.Header{Type: wire.MsgData, Credits: 1})
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, "more credits")
	_, err = l.received(wire.Header{Type: wire.MsgData, CtrlAck: 1})
	require.ErrorIs(t, err, ErrProtocol)
	require.Equal(t, 8, l.credits, "a refused header changes nothing")
}

func TestLedgerHeaderPiggybacksDebt(t *testing.T) {
	l := openLedger(16, 16, wire.CtrlDepth)
	l.unreported, l.ctrlOwed, l.wantCredit = 7, 2, true
	require.Equal(t, wire.Header{Type: wire.MsgData, CtrlAck: 2, Credits: 7}, l.header(wire.MsgData, false))
	require.Zero(t, l.unreported)
	require.Zero(t, l.ctrlOwed)
	require.False(t, l.wantCredit, "the debt travelled with the message")
	require.Equal(t, wire.Header{Type: wire.MsgFin}, l.header(wire.MsgFin, false))
}

// The wants flag: set whenever this side may come to wait for the
// peer's credits before it sends again, clear otherwise (request/response
// traffic), and what the peer's latest header said is what a reader about
// to wait goes by.
func TestLedgerHeaderWants(t *testing.T) {
	l := openLedger(16, 16, wire.CtrlDepth) // holdAt 2
	l.short = true                          // small Writes
	l.spend()
	require.False(t, l.header(wire.MsgData, false).Wants, "one message outstanding: nothing to wait for")
	require.True(t, l.header(wire.MsgData, true).Wants, "the ring might not take the next message")
	l.spend()
	require.True(t, l.header(wire.MsgData, false).Wants, "holdAt messages outstanding: hold may hold")

	// A message-oriented peer's writer never holds, and its cork waits
	// for a signaled send of its own: it wants credits only when it runs
	// low on them. So does a writer with SetNoDelay.
	for _, set := range []func(*ledger){func(l *ledger) { l.noMerge = true }, func(l *ledger) { l.noDelay = true }} {
		l := openLedger(16, 16, wire.CtrlDepth)
		set(&l)
		for range 11 {
			l.spend()
		}
		require.False(t, l.header(wire.MsgData, false).Wants, "5 credits left of 16")
		l.spend()
		require.True(t, l.header(wire.MsgData, false).Wants, "a quarter of the window left")
	}

	l = openLedger(16, 16, wire.CtrlDepth)
	l.spend()
	l.short = true
	l.streaming = true // it streamed small Writes, and one message is still unconsumed
	require.True(t, l.header(wire.MsgCredit, false).Wants, "a streaming side holds small Writes")

	// Writes of the largest message size: hold never holds them, so a
	// stream of them wants credits only when the ring is tight or they
	// run low; so do the control messages between them.
	l = openLedger(16, 16, wire.CtrlDepth)
	l.streaming = true
	for range 4 {
		l.spend()
		require.False(t, l.header(wire.MsgData, false).Wants, "large Writes streaming")
	}
	require.False(t, l.header(wire.MsgCredit, false).Wants, "the latest Write was large")
	require.True(t, l.header(wire.MsgData, true).Wants, "large, but the ring is tight")
	l.short = true
	l.spend()
	require.True(t, l.header(wire.MsgData, false).Wants, "a small Write after them")

	l = openLedger(16, 1, wire.CtrlDepth) // a window of one: holdAt 1
	l.spend()
	require.True(t, l.header(wire.MsgData, false).Wants, "out of credits")

	l = openLedger(16, 16, wire.CtrlDepth)
	require.False(t, l.peerWants)
	_, err := l.received(wire.Header{Type: wire.MsgData, Wants: true})
	require.NoError(t, err)
	require.True(t, l.peerWants)
	_, err = l.received(wire.Header{Type: wire.MsgCredit})
	require.NoError(t, err)
	require.False(t, l.peerWants, "the latest header counts")
}

func TestLedgerRepostNow(t *testing.T) {
	l := openLedger(16, 16, wire.CtrlDepth) // batch 4
	for _, tc := range []struct {
		n     int
		force bool
		want  bool
	}{
		{0, false, false}, {0, true, false}, {3, false, false}, {1, true, true}, {4, false, true}, {9, false, true},
	} {
		require.Equal(t, tc.want, l.repostNow(tc.n, tc.force), "n=%d force=%v", tc.n, tc.force)
	}
}

func TestLedgerCreditDue(t *testing.T) {
	for _, tc := range []struct {
		name         string
		unreported   int
		ctrlCredits  int
		force, open  bool
		ctrlInFlight int
		due, want    bool // a credit message now; the debt remembered
	}{
		{"nothing to report", 0, 4, true, true, 0, false, false},
		{"less than a batch waits", 3, 4, false, true, 0, false, false},
		{"a batch goes", 4, 4, false, true, 0, true, false},
		{"a waiting reader forces it", 1, 4, true, true, 0, true, false},
		{"credits at zero: owed until one comes back", 4, 0, false, true, 0, false, true},
		{"every control send in flight: owed", 4, 4, false, true, wire.CtrlDepth, false, true},
		{"a dead connection owes nothing", 8, 4, true, false, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := openLedger(16, 16, wire.CtrlDepth)
			l.unreported, l.ctrlCredits = tc.unreported, tc.ctrlCredits
			l.wantCredit = true
			require.Equal(t, tc.due, l.creditDue(tc.force, tc.open, tc.ctrlInFlight))
			require.Equal(t, tc.want, l.wantCredit)
			spent := 0
			if tc.due {
				spent = 1
			}
			require.Equal(t, tc.ctrlCredits-spent, l.ctrlCredits)
		})
	}
}

func TestLedgerHold(t *testing.T) {
	const maxMsg = 1024
	l := openLedger(16, 16, wire.CtrlDepth) // holdAt 2
	l.short = true
	send := func() {
		l.spend()
		l.header(wire.MsgData, false)
	}
	require.False(t, l.hold(10, maxMsg, false), "the peer has consumed everything")
	send()
	require.False(t, l.hold(10, maxMsg, false), "one message out: a request in two pieces never waits")
	send()
	require.True(t, l.hold(10, maxMsg, false), "two out: the connection streams")
	require.False(t, l.hold(maxMsg, maxMsg, false), "a full buffer never waits")
	require.False(t, l.hold(10, maxMsg, true), "a queued fin ends the hold")

	// The latch: one credit back does not end streaming; all of them do.
	_, err := l.received(wire.Header{Type: wire.MsgData, Credits: 1})
	require.NoError(t, err)
	require.True(t, l.hold(10, maxMsg, false), "still streaming while anything is unconsumed")
	_, err = l.received(wire.Header{Type: wire.MsgData, Credits: 1})
	require.NoError(t, err)
	require.False(t, l.hold(10, maxMsg, false), "the returned credits released the hold")

	send()
	send()
	l.noDelay = true
	require.False(t, l.hold(10, maxMsg, false), "SetNoDelay")
	l.noDelay = false
	l.ctrlOwed = wire.CtrlDepth / 2
	require.False(t, l.hold(10, maxMsg, false), "the peer may need its control credits back to end the hold")

	// It holds only once the peer was told: after large Writes, whose
	// headers did not ask for credits, the first small one goes at once,
	// and its header asks.
	l = openLedger(16, 16, wire.CtrlDepth)
	for range 3 {
		send()
	}
	l.short = true
	require.False(t, l.hold(10, maxMsg, false), "the peer was not told: it may keep its credits")
	// A credit message now carries the flag, but it does not wake a reader
	// parked at the peer, which went by the data before it: not told yet.
	require.True(t, l.header(wire.MsgCredit, false).Wants)
	require.False(t, l.hold(10, maxMsg, false), "a control message's flag does not tell")
	send()
	require.True(t, l.hold(10, maxMsg, false), "told")
	// A later header without the flag withdraws it.
	l.short = false
	require.False(t, l.header(wire.MsgCredit, false).Wants)
	l.short = true
	require.False(t, l.hold(10, maxMsg, false), "the latest header said no")
}

func TestLedgerArrived(t *testing.T) {
	l := newLedger(2)
	require.NoError(t, l.arrived(wire.MsgData))
	require.NoError(t, l.arrived(wire.MsgDataMore))
	require.ErrorIs(t, l.arrived(wire.MsgData), ErrProtocol, "both data credits used")
	// Reporting reposted receives grants them again.
	l.unreported = 1
	l.header(wire.MsgCredit, false)
	require.NoError(t, l.arrived(wire.MsgData))
	require.ErrorIs(t, l.arrived(wire.MsgData), ErrProtocol)

	for range wire.CtrlDepth {
		require.NoError(t, l.arrived(wire.MsgCredit))
	}
	require.ErrorIs(t, l.arrived(wire.MsgCredit), ErrProtocol)
	l.ctrlOwed = 1
	l.header(wire.MsgData, false)
	require.NoError(t, l.arrived(wire.MsgCredit))
	require.NoError(t, l.arrived(wire.MsgFin), "the fin has a receive of its own")
}

// cork: only toward a message-oriented peer that is behind, never with
// SetNoDelay, for headers that carry nothing, and below corkMax. (The
// signaled send whose completion posts what waits is the caller's to
// check: TestConnMessagesCork.)
func TestLedgerCork(t *testing.T) {
	l := openLedger(16, 16, wire.CtrlDepth) // holdAt 2
	require.False(t, l.cork(2, 1, false), "a byte-stream peer: hold gathers instead")
	l.noMerge = true
	require.True(t, l.cork(2, 1, false))
	require.False(t, l.cork(1, 1, false), "the peer keeps up")
	require.False(t, l.cork(2, 1, true), "the queue returns credits")
	require.False(t, l.cork(2, corkMax, false), "a full chain goes")
	l.noDelay = true
	require.False(t, l.cork(2, 1, false))
}
