package rdma

import "github.com/goverbs/rdma/internal/wire"

// holdDepth is how many unconsumed messages at the peer make small Writes
// gather (see ledger.hold): a burst of two Writes (a length, then the
// payload) goes out at once; in a longer one, the third may wait. A peer
// with fewer than four receives holds from the first (holdAt is at most
// half its window).
const holdDepth = 2

// ledger is a connection's credit accounting (see internal/wire): what
// this side may send, what it owes the peer, when a credit message is due,
// and when small Writes gather. It is plain arithmetic: no locks, no
// verbs; Conn.mu guards it.
type ledger struct {
	credits     int // data messages the peer has receives for
	ctrlCredits int // credit messages the peer has receives for
	unreported  int // data receives posted again, not yet reported to the peer
	ctrlOwed    int // control receives posted again, not yet acknowledged
	wantCredit  bool
	batch       int // receives reposted and reported at once

	peerCredits int // data messages the peer may still send us: granted, not yet used
	peerCtrl    int // credit messages likewise

	peerWindow int  // the peer's data receives: credits when none is in use
	ctrlWindow int  // the peer's control receives granted to us
	holdAt     int  // unconsumed messages at the peer from which hold holds
	noDelay    bool // SetNoDelay(true): hold never holds
	noMerge    bool // the peer reads messages: hold never holds
	streaming  bool // see hold
	short      bool // the latest Write (or ReadFrom's read) was smaller than a message may be (see header)
	told       bool // a data message's header had the wants flag, and no later header lacked it (see hold)
	peerWants  bool // the peer's latest header had the wants flag (see header)
}

// newLedger returns the ledger of a side with recvDepth data receives,
// all granted to the peer by the handshake: credits are reported in
// batches of a quarter of them, but never one by one: with a batch of one,
// a Read that consumed a request would send a credit message of its own
// just before the reply that could carry the credit (doubling the round
// trip of request-response traffic at RecvDepth 4 to 7). A reader that is
// about to wait returns whatever it has when the peer wants it (peerWants).
func newLedger(recvDepth int) ledger {
	return ledger{batch: max(2, recvDepth/4), peerCredits: recvDepth, peerCtrl: wire.CtrlDepth}
}

// arrived accounts for a message of type typ from the peer against what
// we granted it: a peer that sends more data or credit messages than it
// has credits for broke the protocol (it would otherwise land in a
// receive kept for something else, or find none: receiver not ready).
func (l *ledger) arrived(typ uint8) error {
	switch typ {
	case wire.MsgData, wire.MsgDataMore, wire.MsgRing:
		if l.peerCredits == 0 {
			return &protocolError{"peer overran its credits: a data message beyond those granted"}
		}
		l.peerCredits--
	case wire.MsgCredit, wire.MsgSwitched, wire.MsgDecline:
		if l.peerCtrl == 0 {
			return &protocolError{"peer overran its credits: a credit message beyond those granted"}
		}
		l.peerCtrl--
	}
	return nil
}

// open takes the peer's grant from its handshake.
func (l *ledger) open(peerRecv, peerCtrl int) {
	l.credits += peerRecv
	l.peerWindow = peerRecv
	l.holdAt = max(1, min(holdDepth, peerRecv/2))
	l.ctrlWindow = min(peerCtrl, wire.CtrlDepth)
	l.ctrlCredits += l.ctrlWindow
}

// received takes the credits a peer's header returns; it reports whether
// there were any (a writer waiting for them should be woken). It fails on
// a header that returns more than was ever spent: a peer that overruns
// its own grants.
func (l *ledger) received(h wire.Header) (bool, error) {
	l.peerWants = h.Wants
	if h.Credits == 0 && h.CtrlAck == 0 {
		return false, nil
	}
	if l.credits+int(h.Credits) > l.peerWindow || l.ctrlCredits+int(h.CtrlAck) > l.ctrlWindow {
		return false, &protocolError{"peer returned more credits than it was sent"}
	}
	l.credits += int(h.Credits)
	l.ctrlCredits += int(h.CtrlAck)
	return true, nil
}

// spend takes a data credit for a data message.
func (l *ledger) spend() { l.credits-- }

// header returns the header of the next message, typ, which piggybacks
// everything owed to the peer; the debt is then paid. The caller has
// spent the message's credit, if it takes one; tight says the send ring,
// once this message is in it, might not take a message of the largest
// size.
//
// The header's wants flag tells the peer that this side may come to wait
// for its credits before sending again: it is running out of them (a
// quarter of the window or less left), the ring is tight, or hold may
// hold small Writes (streaming, or holdAt messages outstanding, and the
// latest Write short: see short), which only returned credits end. (Cork
// needs no credits: it waits only while a signaled send is posted, whose
// completion posts what it corked; see cork.) Until this side sends again
// credits only come back, so each of these can only turn false; a header
// without the flag therefore promises that nothing will wait for the
// peer's credits before the next message, whose header says anew, but
// for credits its batches bring anyway (see creditDue: with no credit
// left, every message is unconsumed or in a batch on its way back, or
// the peer's unreported receives make a batch). The peer returns its
// credits before it waits for data only when the latest header it
// received has the flag (see peerWants); otherwise they go in batches,
// or ride on its next message.
//
// A stream of Writes of the largest message size or more therefore goes
// without the flag, unless its ring is tight or its credits low: a reader
// that drains it faster than it comes would otherwise return its credits
// before every wait, a credit message per data message (on siw, where
// each is a system call that transmits, 0.7 per data message in the test
// bed, 0.13 with this rule). Small Writes still set it, even when hold
// gathers them into full messages. The cost is at a change from large
// Writes to small ones: hold holds only once a data message's header with
// the flag went (told), so the first small Write after large ones goes at
// once, and its header says so.
func (l *ledger) header(typ uint8, tight bool) wire.Header {
	h := wire.Header{Type: typ, CtrlAck: uint8(l.ctrlOwed), Credits: uint16(l.unreported),
		Wants: tight || l.credits <= l.peerWindow/4 || (l.mayHold() && l.short && (l.streaming || l.outstanding() >= l.holdAt))}
	l.peerCredits += l.unreported
	l.peerCtrl += l.ctrlOwed
	l.unreported, l.ctrlOwed, l.wantCredit = 0, 0, false
	switch typ {
	case wire.MsgData, wire.MsgDataMore:
		l.told = h.Wants
	default:
		// Only a data message wakes a reader parked at the peer, which
		// then looks at the flag before it waits again: another
		// message's flag may withdraw the promise (the peer goes by the
		// latest header), never make it. (Its flag can be newly set
		// without data in between: a small Write made short true.)
		l.told = l.told && h.Wants
	}
	return h
}

// mayHold reports whether hold may ever hold: the peer reads a byte
// stream and SetNoDelay is off.
func (l *ledger) mayHold() bool { return !l.noDelay && !l.noMerge }

// repostNow reports whether n consumed receives should be posted
// again now: once a batch is ready, or at once when force is set (the
// reader is about to wait).
func (l *ledger) repostNow(n int, force bool) bool {
	return n >= l.batch || (force && n > 0)
}

// creditDue reports whether a credit message should be queued now, and if
// so spends the control credit it takes. One is due once a batch of
// reposted receives is unreported, or any is when force is set. It cannot
// go while the peer has no control receive for it or wire.CtrlDepth control
// messages of ours are in flight (ctrlInFlight): then wantCredit records
// the debt for the completion that frees one. open is false once the
// connection can no longer send (the peer left, or sending failed).
func (l *ledger) creditDue(force, open bool, ctrlInFlight int) bool {
	l.wantCredit = false
	if l.unreported == 0 || (!force && l.unreported < l.batch) || !open {
		return false
	}
	if l.ctrlCredits == 0 || ctrlInFlight >= wire.CtrlDepth {
		l.wantCredit = true
		return false
	}
	l.ctrlCredits--
	return true
}

// ctrlFree reports whether a control message other than a credit message
// (the answer to a ring offer) may go now, and if so spends its control
// credit; otherwise it waits for the completion or acknowledgement that
// frees one.
func (l *ledger) ctrlFree(ctrlInFlight int) bool {
	if l.ctrlCredits == 0 || ctrlInFlight >= wire.CtrlDepth {
		return false
	}
	l.ctrlCredits--
	return true
}

// hold reports whether a pending message holding n of at most maxMsg bytes
// should wait for more Writes rather than go out now. A buffer that is not
// full waits while the connection streams: from the moment holdAt earlier
// messages are unconsumed at the peer until the peer has consumed all of
// them. The peer is behind, so its credits (and with them the flush) will
// come, and meanwhile small Writes gather into one message instead of
// costing a post each. A peer that drains everything and waits for more
// returns its credits at once, so a held buffer costs at most that
// exchange, and bursts of fewer than holdAt Writes (a request in a few
// pieces) never wait. This is Nagle's rule with credits for
// acknowledgements; SetNoDelay turns it off, and a fin queued behind the
// buffer ends it. It never holds once half the peer's control credits
// await our acknowledgement (ctrlOwed): the peer may need them to return
// the very credits that would end the hold. Nor does it hold unless the
// peer was told (told: a data message's header had the wants flag, and no
// header since lacked it): only then does the peer return its credits
// before it waits.
func (l *ledger) hold(n, maxMsg int, finQueued bool) bool {
	out := l.peerWindow - l.credits
	switch {
	case out == 0:
		l.streaming = false
	case out >= l.holdAt:
		l.streaming = true
	}
	return l.streaming && l.told && n < maxMsg && l.mayHold() && !finQueued && l.ctrlOwed < wire.CtrlDepth/2
}

// corkMax bounds the messages a Write leaves queued unposted (see cork):
// one chain of work requests.
const corkMax = 16

// outstanding is how many data messages the peer has not given a credit
// back for: unconsumed, or queued here and not yet posted.
func (l *ledger) outstanding() int { return l.peerWindow - l.credits }

// cork reports whether the messages a Write queued, queued in all, may
// wait unposted for the next completion instead of being posted by that
// Write. It is hold's rule for a message-oriented peer, whose Writes never
// gather: when the Write began, at least holdAt messages were
// outstanding at the peer, all of them posted, so the peer is behind;
// meanwhile back-to-back Writes share one ibv_post_send (one system call
// on rxe), each still a message of its own. The completion that posts the
// queue is that of a signaled send already posted (sendRing.sigOut), which
// the caller checks: corking never waits for the peer, so the peer need
// not return credits for it (see header). Without one, the caller signals
// the send it posts now, and the Writes after it cork. carries says the
// queued headers return credits or acknowledgements to the peer: those
// never wait, since the peer may need them to send what would end the
// wait. SetNoDelay turns it off, and a Write that must wait for credits or
// room posts everything first.
func (l *ledger) cork(before, queued int, carries bool) bool {
	return l.noMerge && !l.noDelay && !carries && before >= l.holdAt && queued < corkMax
}
