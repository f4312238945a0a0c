package rdma

import (
	"errors"
	"net"
	"syscall"
)

// phase is where a connection is in its life as rdma_cm sees it; it
// decides where the connection's CM events go.
type phase uint8

const (
	phaseDialing     phase = iota // events go to the dialing goroutine
	phaseAccepting                // events go to the listener
	phaseEstablished              // only disconnects matter
	phaseDead                     // torn down or being torn down
)

// shut records which ends of a connection are shut and why: the local
// calls (CloseRead, CloseWrite, Close), the peer's fin and disconnect, and
// the teardown's ownership of the QP. Flags are only ever set.
type shut uint8

const (
	shutClosed   shut = 1 << iota // Close was called: every I/O call fails with net.ErrClosed
	shutRead                      // CloseRead: Reads return io.EOF, arrivals are discarded (recvRing.discarding)
	shutWrite                     // CloseWrite or Close: the fin is sent, Writes fail
	shutFinRcvd                   // the peer's fin arrived
	shutPeerGone                  // the peer disconnected
	shutQPGone                    // the teardown is destroying the QP
)

// lifecycle is a connection's state and its two sticky errors: the first
// failure of each direction wins and is what every later call of that
// direction returns. It has no lock of its own; Conn.mu guards it.
type lifecycle struct {
	phase phase
	shut  shut
	rerr  error // why Reads fail once nothing is queued
	werr  error // why Writes fail
	// cut is set when a deadline cut a Write to a message-oriented peer
	// short: the peer holds the first part of a message whose rest will
	// never come, so no Write, ReadFrom or fin may follow (the next bytes
	// would continue that message at the reader). It is not a failure of
	// the connection: Reads, credits, keepalive probes and one-sided
	// operations go on.
	cut bool
}

func (l *lifecycle) has(f shut) bool { return l.shut&f != 0 }
func (l *lifecycle) set(f shut)      { l.shut |= f }

// failRead records why Reads fail, unless an earlier failure did, or the
// peer's fin already ended the stream (what came before it stays readable
// and then io.EOF, not the error, ends it).
func (l *lifecycle) failRead(err error) {
	if replaces(l.rerr, err) && !l.has(shutFinRcvd) {
		l.rerr = err
	}
}

// failWrite records why Writes fail, unless an earlier failure did.
func (l *lifecycle) failWrite(err error) {
	if replaces(l.werr, err) {
		l.werr = err
	}
}

// replaces reports whether err becomes a direction's error in place of
// cur: the first failure wins, except that a bare reset (work flushed
// before the completion that says why arrived: the provider may flush the
// receives of a failed QP before it reports the failed send) yields to
// the cause.
func replaces(cur, err error) bool {
	return cur == nil || (cur == syscall.ECONNRESET && err != syscall.ECONNRESET)
}

// fail fails both directions (a broken connection).
func (l *lifecycle) fail(err error) {
	l.failRead(err)
	l.failWrite(err)
}

// readFailed is what a Read returns when nothing is queued: the recorded
// failure, a reset once the peer is gone and no receive is left to bring
// anything, or nil when waiting makes sense.
func (l *lifecycle) readFailed(recvPosted int) error {
	switch {
	case l.rerr != nil:
		return l.rerr
	case l.has(shutPeerGone) && recvPosted == 0:
		return syscall.ECONNRESET
	}
	return nil
}

// writeEnded is what a Write returns before copying anything: net.ErrClosed
// after Close, EPIPE after CloseWrite (as a TCP socket says after shutdown),
// the recorded failure, errMessageCut after a cut Write, or nil.
func (l *lifecycle) writeEnded() error {
	switch {
	case l.has(shutClosed):
		return net.ErrClosed
	case l.has(shutWrite):
		return syscall.EPIPE
	case l.werr != nil:
		return l.werr
	case l.cut:
		return errMessageCut
	}
	return nil
}

// finBlocked is why no fin may be sent: the send side failed, or a cut
// Write left a message unfinished at the peer (a fin would end it as if
// whole; without one the peer sees the connection reset instead).
func (l *lifecycle) finBlocked() error {
	if l.werr != nil {
		return l.werr
	}
	if l.cut {
		return errMessageCut
	}
	return nil
}

// errMessageCut fails the Writes (and ReadFrom) of a connection whose
// message-oriented peer got part of a Write only (its deadline passed
// midway); Reads and one-sided operations go on (see lifecycle.cut).
var errMessageCut = errors.New("a Write to a message-oriented peer was cut short by its deadline; the connection can send no more")
