package rdma

import (
	"syscall"

	"github.com/goverbs/rdma/internal/ibv"
)

// The completion side of a Conn: the poller (or a spinning Read or Write)
// hands each work completion to complete, which passes it to the path it
// belongs to (send.go, recv.go, onesided.go), and a failed one's error.

// complete handles one work completion (see completer). It posts consumed
// receives again, but only queues the sends that must go out (a credit
// message, a pending buffer that credits now allow) and reports whether
// there are any.
func (c *Conn) complete(wc ibv.WC) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if wc.Status == ibv.WCSuccess {
		c.heard++ // the peer is alive: the keepalive starts over
	}
	if wc.WRID&wrSend != 0 {
		c.sendDone(wc)
	} else if wc.WRID&wrOneSided != 0 {
		c.oneSidedDone(wc)
	} else {
		c.recvDone(wc)
	}
	if c.cr.wantCredit {
		c.returnCredits(true)
	}
	if c.life.phase == phaseDead {
		signal(c.drained)
	}
	return len(c.tx.sends) > 0 || c.pendingGoes() || c.ringDue()
}

// wcError is a failed work completion: the connection is broken.
type wcError struct{ status uint32 }

func (e *wcError) Error() string { return "work request failed: " + wcStatusString(e.status) }

// Unwrap says what the failure means to a caller: a connection whose
// peer's NIC stopped acknowledging (the retries ran out: the peer host
// vanished, or the network between is down) timed out, as a TCP
// connection whose retransmissions go unanswered; any other failure broke
// it.
func (e *wcError) Unwrap() error {
	if e.status == ibv.WCRetryExcErr {
		return syscall.ETIMEDOUT
	}
	return syscall.ECONNRESET
}

// countFailed counts a failed completion, but not the flushes of a
// teardown.
func (c *Conn) countFailed(status uint32) {
	if status != ibv.WCFlushErr {
		c.st.CompletionErrors++
	}
}
