package rdma

import (
	"sync"

	"github.com/goverbs/rdma/internal/rdmacm"
)

// connSys is the floor below a Conn: its rdma_cm id and what the
// connection manager's steps need, and (verbsSys, conn_verbs.go) the verbs
// objects the handshake sets up and the release gives back. Its methods
// are the steps; the sequences over them (conn_dial.go's dial and setup,
// conn_cm.go's reactions to events, conn_close.go's release) are the
// Conn's. A Conn built on fakes for the data path's host tests has no id:
// disconnect and errorQP do nothing then, and the release stops before
// the other steps (see releaseAll).
type connSys struct {
	verbsSys

	cm     *cmLoop
	handle uintptr
	id     cmID
	lay    layout
	lst    *Listener // while accepting
	// reqInit and reqResp are the RDMA READ depths a connect request
	// offered (see rdmacm.Event): an accept grants no more.
	reqInit, reqResp uint8
	cmEv             chan rdmacm.Event
	// abandoned: the dial gave up while rdma_connect was still running
	// (see connect), and the call's goroutine tears the connection down
	// when it returns. Only the dialing goroutine touches it.
	abandoned bool
	// freshQP: the dial creates its QP (an earlier try's pooled one was
	// refused as stale).
	freshQP bool
	// dialed: the connection is the active side; only a dial's QP is
	// kept and only a dial adopts one (see reusableQP).
	dialed bool
	inbox  inbox[rdmacm.Event] // see inbox.go
	// qpMu is held across a librdmacm call made off the CM goroutine that
	// moves the QP through its states (rdma_accept on the listener's
	// setup goroutine) and across the QP's destruction, which must not
	// free it under such a call.
	qpMu   sync.Mutex
	qpGone bool // under qpMu: the release has destroyed the QP; the id goes next
}

// dataPath is what setting up the verbs side gives the data path: the
// QP, the arena's memory and keys, and what the device says about posting.
type dataPath struct {
	qp          queuePair
	mem         []byte
	sendBase    uint64 // NIC address of the send ring
	sendLKey    uint32
	recvRKey    uint32 // the receive ring's keys
	recvLKey    uint32
	inline      int
	sp          spinner
	postAside   bool // see waiter.postAside
	kernelPosts bool // see device.kernelPosts
	atomics     atomicCaps
	rings       ringAllocator
}

// wasDialed reports whether the connection is the active side.
func (s *connSys) wasDialed() bool { return s.dialed }

// The connSys steps below need nothing of the device's verbs objects:
// the connection manager's side of a disconnect and of the id's end.

// disconnect moves the QP to the error state and tells the peer. A Conn
// built on fakes (host tests of the data path) has no id.
//
// While the device's port is down the peer is not told: the message could
// not arrive, and on Soft-RoCE (Linux 6.1) a connection manager message
// sent then can be lost without its send ever completing, after which the
// id's destroy waits for it in the kernel for good (seen as rdma_destroy_id
// hanging in cm_destroy_id after a port that stayed down). The QP still
// moves to the error state, so its work requests flush; the release's
// disconnect, or the id's destroy, tells the peer once the port is back.
func (s *connSys) disconnect() {
	if s.id == nil {
		return
	}
	if s.portDown() {
		s.id.ErrorQP()
		return
	}
	if s.id.Disconnect() != nil {
		// On iWARP rdma_disconnect first moves the QP to SQD (closing),
		// which fails for a QP that never reached RTS (a dial given up
		// during its setup), and then does nothing more: the QP's
		// receives stayed posted until its destroy flushed them into the
		// device's shared CQ, where the next QP given the same number
		// (siw hands numbers out again at once) took them for its own
		// and failed. Moved to the error state they flush now, and the
		// release's drain sees them.
		s.id.ErrorQP()
	}
}

// errorQP moves the QP to the error state, for a drain whose work
// requests did not all flush after the disconnect (see drainDroppingLock).
func (s *connSys) errorQP() {
	if s.id != nil {
		s.id.ErrorQP()
	}
}

// closeID ends the id: no more events are delivered, the inbox's last
// ones are handled, the id is destroyed and the CM loop let go. It comes
// last in the release: librdmacm may close the device's context with its
// last id.
func (s *connSys) closeID() {
	// Unregister first: it waits out an event being delivered, and then
	// the inbox's goroutine finishes the events it holds, which may still
	// use the id.
	s.cm.unregister(s.handle)
	s.inbox.wait()
	retryDestroy(s.id.Destroy)
	s.cm.release()
}
