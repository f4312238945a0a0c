package rdma

import "github.com/goverbs/rdma/internal/ibv"

// The completion side of a Conn: the poller (or a spinning Read or Write)
// hands each work completion to complete, which passes it to the path it
// belongs to (send.go, recv.go, onesided.go). Each path fails the
// connection with a failed one's error (wcError); complete counts it.

// complete handles one work completion (see completer). It posts consumed
// receives again, but only queues the sends that must go out (a credit
// message, a pending buffer that credits now allow) and reports whether
// there are any.
func (c *Conn) complete(wc ibv.WC) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.completeLocked(wc)
}

// completeLocked is complete with mu held: by complete, or by a Read that
// polls the CQ with its connection's lock held (see spinReadHeld).
func (c *Conn) completeLocked(wc ibv.WC) bool {
	if wc.Status == ibv.WCSuccess {
		c.heard++ // the peer is alive: the keepalive starts over
	}
	ours := true
	if wc.WRID&wrSend != 0 {
		c.sendDone(wc)
	} else if wc.WRID&wrOneSided != 0 {
		ours = c.oneSidedDone(wc)
	} else {
		ours = c.recvDone(wc)
		c.heardFirst = true
		if c.awaitFirst {
			c.firstArrived(wc.Status == ibv.WCSuccess && c.life.werr == nil)
		}
	}
	if ours && wc.Status != ibv.WCSuccess && wc.Status != ibv.WCFlushErr {
		// A failure of work of ours (not another QP's stray completion,
		// see recvDone), but not the flushes of a teardown.
		c.st.CompletionErrors++
	}
	if c.cr.wantCredit {
		c.returnCredits(true)
	}
	c.wakeRelease()
	return len(c.tx.sends) > 0 || c.pendingGoes() || c.rs.due()
}
