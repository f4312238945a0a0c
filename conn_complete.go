package rdma

import "github.com/goverbs/rdma/internal/ibv"

// The completion side of a Conn: the poller (or a spinning Read or Write)
// hands each work completion to complete, which passes it to the path it
// belongs to (send.go, recv.go, onesided.go). Each path counts a failed one
// (countFailed, conn.go) and fails the connection with its error (wcError).

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
		c.heardFirst = true
		if c.awaitFirst {
			c.firstArrived(wc.Status == ibv.WCSuccess && c.life.werr == nil)
		}
	}
	if c.cr.wantCredit {
		c.returnCredits(true)
	}
	if c.life.phase == phaseDead {
		signal(c.drained)
	}
	return len(c.tx.sends) > 0 || c.pendingGoes() || c.ringDue()
}
