package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"
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
		{"defaults", 16, 16, ctrlDepth, 4, holdDepth, ctrlDepth},
		{"small window holds at one", 2, 2, ctrlDepth, 2, 1, ctrlDepth},
		{"three receives", 3, 3, 1, 2, 1, 1},
		{"a request is never reported on its own", 4, 4, ctrlDepth, 2, holdDepth, ctrlDepth},
		{"peer grants more control credits than we use", 64, 64, 200, 16, holdDepth, ctrlDepth},
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
	l := openLedger(16, 8, ctrlDepth)
	more, err := l.received(header{typ: msgData})
	require.NoError(t, err)
	require.False(t, more, "a header without credits wakes no writer")

	for range 5 {
		l.spend()
	}
	l.ctrlCredits -= 2
	more, err = l.received(header{typ: msgCredit, credits: 5, ctrlAck: 2})
	require.NoError(t, err)
	require.True(t, more)
	require.Equal(t, 8, l.credits)
	require.Equal(t, ctrlDepth, l.ctrlCredits)

	// A peer returning credits it was never sent breaks the protocol.
	_, err = l.received(header{typ: msgData, credits: 1})
	require.ErrorIs(t, err, ErrProtocol)
	require.ErrorContains(t, err, "more credits")
	_, err = l.received(header{typ: msgData, ctrlAck: 1})
	require.ErrorIs(t, err, ErrProtocol)
	require.Equal(t, 8, l.credits, "a refused header changes nothing")
}

func TestLedgerHeaderPiggybacksDebt(t *testing.T) {
	l := openLedger(16, 16, ctrlDepth)
	l.unreported, l.ctrlOwed, l.wantCredit = 7, 2, true
	require.Equal(t, header{typ: msgData, ctrlAck: 2, credits: 7}, l.header(msgData, false))
	require.Zero(t, l.unreported)
	require.Zero(t, l.ctrlOwed)
	require.False(t, l.wantCredit, "the debt travelled with the message")
	require.Equal(t, header{typ: msgFin}, l.header(msgFin, false))
}

// The wants flag: set whenever this side may come to wait for the
// peer's credits before it sends again, clear otherwise (request/response
// traffic), and what the peer's latest header said is what a reader about
// to wait goes by.
func TestLedgerHeaderWants(t *testing.T) {
	l := openLedger(16, 16, ctrlDepth) // holdAt 2
	l.short = true                     // small Writes
	l.spend()
	require.False(t, l.header(msgData, false).wants, "one message outstanding: nothing to wait for")
	require.True(t, l.header(msgData, true).wants, "the ring might not take the next message")
	l.spend()
	require.True(t, l.header(msgData, false).wants, "holdAt messages outstanding: hold may hold")

	// A message-oriented peer's writer never holds, and its cork waits
	// for a signaled send of its own: it wants credits only when it runs
	// low on them. So does a writer with SetNoDelay.
	for _, set := range []func(*ledger){func(l *ledger) { l.noMerge = true }, func(l *ledger) { l.noDelay = true }} {
		l := openLedger(16, 16, ctrlDepth)
		set(&l)
		for range 11 {
			l.spend()
		}
		require.False(t, l.header(msgData, false).wants, "5 credits left of 16")
		l.spend()
		require.True(t, l.header(msgData, false).wants, "a quarter of the window left")
	}

	l = openLedger(16, 16, ctrlDepth)
	l.spend()
	l.short = true
	l.streaming = true // it streamed small Writes, and one message is still unconsumed
	require.True(t, l.header(msgCredit, false).wants, "a streaming side holds small Writes")

	// Writes of the largest message size: hold never holds them, so a
	// stream of them wants credits only when the ring is tight or they
	// run low; so do the control messages between them.
	l = openLedger(16, 16, ctrlDepth)
	l.streaming = true
	for range 4 {
		l.spend()
		require.False(t, l.header(msgData, false).wants, "large Writes streaming")
	}
	require.False(t, l.header(msgCredit, false).wants, "the latest Write was large")
	require.True(t, l.header(msgData, true).wants, "large, but the ring is tight")
	l.short = true
	l.spend()
	require.True(t, l.header(msgData, false).wants, "a small Write after them")

	l = openLedger(16, 1, ctrlDepth) // a window of one: holdAt 1
	l.spend()
	require.True(t, l.header(msgData, false).wants, "out of credits")

	l = openLedger(16, 16, ctrlDepth)
	require.False(t, l.peerWants)
	_, err := l.received(header{typ: msgData, wants: true})
	require.NoError(t, err)
	require.True(t, l.peerWants)
	_, err = l.received(header{typ: msgCredit})
	require.NoError(t, err)
	require.False(t, l.peerWants, "the latest header counts")
}

func TestLedgerRepostNow(t *testing.T) {
	l := openLedger(16, 16, ctrlDepth) // batch 4
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
		{"every control send in flight: owed", 4, 4, false, true, ctrlDepth, false, true},
		{"a dead connection owes nothing", 8, 4, true, false, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := openLedger(16, 16, ctrlDepth)
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
	l := openLedger(16, 16, ctrlDepth) // holdAt 2
	l.short = true
	send := func() {
		l.spend()
		l.header(msgData, false)
	}
	require.False(t, l.hold(10, maxMsg, false), "the peer has consumed everything")
	send()
	require.False(t, l.hold(10, maxMsg, false), "one message out: a request in two pieces never waits")
	send()
	require.True(t, l.hold(10, maxMsg, false), "two out: the connection streams")
	require.False(t, l.hold(maxMsg, maxMsg, false), "a full buffer never waits")
	require.False(t, l.hold(10, maxMsg, true), "a queued fin ends the hold")

	// The latch: one credit back does not end streaming; all of them do.
	_, err := l.received(header{typ: msgData, credits: 1})
	require.NoError(t, err)
	require.True(t, l.hold(10, maxMsg, false), "still streaming while anything is unconsumed")
	_, err = l.received(header{typ: msgData, credits: 1})
	require.NoError(t, err)
	require.False(t, l.hold(10, maxMsg, false), "the returned credits released the hold")

	send()
	send()
	l.noDelay = true
	require.False(t, l.hold(10, maxMsg, false), "SetNoDelay")
	l.noDelay = false
	l.ctrlOwed = ctrlDepth / 2
	require.False(t, l.hold(10, maxMsg, false), "the peer may need its control credits back to end the hold")

	// It holds only once the peer was told: after large Writes, whose
	// headers did not ask for credits, the first small one goes at once,
	// and its header asks.
	l = openLedger(16, 16, ctrlDepth)
	for range 3 {
		send()
	}
	l.short = true
	require.False(t, l.hold(10, maxMsg, false), "the peer was not told: it may keep its credits")
	// A credit message now carries the flag, but it does not wake a reader
	// parked at the peer, which went by the data before it: not told yet.
	require.True(t, l.header(msgCredit, false).wants)
	require.False(t, l.hold(10, maxMsg, false), "a control message's flag does not tell")
	send()
	require.True(t, l.hold(10, maxMsg, false), "told")
	// A later header without the flag withdraws it.
	l.short = false
	require.False(t, l.header(msgCredit, false).wants)
	l.short = true
	require.False(t, l.hold(10, maxMsg, false), "the latest header said no")
}

func TestLedgerArrived(t *testing.T) {
	l := newLedger(2)
	require.NoError(t, l.arrived(msgData))
	require.NoError(t, l.arrived(msgDataMore))
	require.ErrorIs(t, l.arrived(msgData), ErrProtocol, "both data credits used")
	// Reporting reposted receives grants them again.
	l.unreported = 1
	l.header(msgCredit, false)
	require.NoError(t, l.arrived(msgData))
	require.ErrorIs(t, l.arrived(msgData), ErrProtocol)

	for range ctrlDepth {
		require.NoError(t, l.arrived(msgCredit))
	}
	require.ErrorIs(t, l.arrived(msgCredit), ErrProtocol)
	l.ctrlOwed = 1
	l.header(msgData, false)
	require.NoError(t, l.arrived(msgCredit))
	require.NoError(t, l.arrived(msgFin), "the fin has a receive of its own")
}

// cork: only toward a message-oriented peer that is behind, never with
// SetNoDelay, for headers that carry nothing, and below corkMax. (The
// signaled send whose completion posts what waits is the caller's to
// check: TestConnMessagesCork.)
func TestLedgerCork(t *testing.T) {
	l := openLedger(16, 16, ctrlDepth) // holdAt 2
	require.False(t, l.cork(2, 1, false), "a byte-stream peer: hold gathers instead")
	l.noMerge = true
	require.True(t, l.cork(2, 1, false))
	require.False(t, l.cork(1, 1, false), "the peer keeps up")
	require.False(t, l.cork(2, 1, true), "the queue returns credits")
	require.False(t, l.cork(2, corkMax, false), "a full chain goes")
	l.noDelay = true
	require.False(t, l.cork(2, 1, false))
}
