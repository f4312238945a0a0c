//go:build linux && cgo

package rdma

import (
	"syscall"
	"time"

	"github.com/goverbs/rdma/internal/ibv"
)

// verbsSys is the verbs side of a Conn: the device, the CQ, the QP and
// the arena that the setup creates (openPath) and the release gives back
// (the steps below, in the order conn_close.go's releaseAll gives).
// Nothing here knows the Conn: the steps are connSys's, and the Conn
// takes part only as the completer its CQ calls.
type verbsSys struct {
	dev *device
	cqs *cqShard // the device's CQ its QP uses
	vqp *ibv.QP
	ar  *arena
	cqe int // CQ entries reserved on dev
}

func wcStatusString(status uint32) string { return ibv.StatusString(status) }

func asyncEventString(t ibv.AsyncEventType) string { return t.String() }

// The QPs' local ACK timeout, how long the NIC waits for an
// acknowledgement before it retransmits, is 4.096 µs × 2^t. With the 7
// retries internal/rdmacm asks for, a hardware NIC gives a send up
// 8 × 1.07 s ≈ 8.6 s after the peer last answered with t = 18: a network
// partition of 5 s is survived, a vanished peer noticed. Soft-RoCE (rxe)
// takes 7 to mean "retry forever", so there the keepalive alone bounds
// how long a silent peer is waited for, and the timeout can be short:
// rxe repairs a loss in mid-message at once (a NAK), but a lost last
// packet, NAK or retransmission only when the timer fires, so at 1 % loss
// 67 ms (t = 14) instead of rdma_cm's default of 2.1 s (t = 19) is the
// difference between a stalled and a moving transfer.
const (
	ackTimeoutHW  = 18
	ackTimeoutRXE = 14
	rxeVendorID   = 0xffffff // RXE_VENDOR_ID
	siwVendorID   = 0x626d74 // SIW_VENDOR_ID ("bmt")
)

// openPath creates the verbs side of the data path on the id's device:
// device reference, arena and QP, whose completions go to comp.
func (s *connSys) openPath(opts Options, comp completer) (dataPath, error) {
	verbs := s.id.Verbs()
	if verbs == nil {
		// The address resolved, but to an interface without RDMA.
		return dataPath{}, &deviceError{syscall.ENODEV}
	}
	s.lay = newLayout(opts)
	if ibv.ContextFrom(verbs).IWARP() {
		// No immediate data: headers travel as SEND payloads.
		s.lay = s.lay.withHeaders()
	}
	s.cqe = s.lay.cqEntries()
	dev, cqs, ar, err := acquireDevice(verbs, s.cqe, s.lay, s.dialed)
	if err != nil {
		return dataPath{}, err
	}
	s.dev, s.cqs = dev, cqs
	if ar == nil {
		if ar, err = dev.newArena(s.lay); err != nil {
			return dataPath{}, err
		}
	}
	s.useArena(ar)
	s.adoptPooledQP()
	if s.vqp == nil {
		// In the arena's PD: its receive ring's rkey works for this QP only.
		qp, inline, err := s.id.CreateQP(s.ar.pd.Ptr(), cqs.cq.Ptr(), s.lay.sendQueue(), s.lay.recvSlots, 256)
		if err != nil {
			return dataPath{}, err
		}
		s.vqp, ar.inline = ibv.QPFrom(qp), inline
	}
	if err := checkInline(s.lay, ar.inline); err != nil {
		return dataPath{}, err
	}
	s.vqp.SerialPosts = dev.serialPosts
	cqs.add(s.vqp.Num, comp)
	return dataPath{qp: s.vqp, mem: s.ar.mem, sendBase: s.ar.base + uint64(s.lay.sendOff()), sendLKey: s.ar.sendMR.LKey,
		recvRKey: s.ar.recvMR.RKey, recvLKey: s.ar.recvMR.LKey, inline: ar.inline, sp: cqs,
		postAside: dev.postAside, kernelPosts: dev.kernelPosts, atomics: dev.atomics, rings: verbsRings{ar: s.ar, dev: dev}}, nil
}

// adoptPooledQP gives the id the QP the arena came from the pool with,
// on the arena's CQ, as it would take a new one; a dial told to create
// its QP (freshQP) destroys it instead.
func (s *connSys) adoptPooledQP() {
	qp := s.ar.qp
	if qp == nil {
		return
	}
	s.ar.qp, s.ar.qpShard = nil, nil
	if s.freshQP {
		destroyQP(qp)
	} else if err := s.id.AdoptQP(qp.Ptr()); err != nil {
		destroyQP(qp)
	} else {
		s.vqp = qp
	}
}

// ackTimeout is the device's local ACK timeout for the QP.
func (s *connSys) ackTimeout() uint8 {
	if s.dev == nil {
		return 0
	}
	return s.dev.ackTimeout
}

// readDepths are the RDMA READs the device lets a QP issue and serve.
func (s *connSys) readDepths() (initiator, responder uint8) {
	if s.dev == nil {
		return 0, 0
	}
	return s.dev.initDepth, s.dev.respDepth
}

// blockingConnect reports whether rdma_connect blocks until the
// transport's own connection is up (siw's TCP: see Conn.connect).
func (s *connSys) blockingConnect() bool { return s.dev != nil && s.dev.iwarp }

// portDown reports whether the device's port is down.
func (s *connSys) portDown() bool { return s.dev != nil && s.dev.events.portBack() != nil }

// markIDRemoved marks the id's device removed, as its DEVICE_REMOVAL
// event says: nothing new is set up on it.
func (s *connSys) markIDRemoved() { markRemoved(s.id.Verbs()) }

// markDeviceRemoved marks the connection's device removed: nothing new
// is set up on it.
func (s *connSys) markDeviceRemoved() {
	if s.dev != nil {
		markRemoved(s.dev.ctx.Ptr())
	}
}

// destroyQP destroys the id's QP while no CM event is being processed.
func (s *connSys) destroyQP() error {
	var err error
	s.cm.ch.Quiet(func() { err = s.id.DestroyQP() })
	return err
}

// qpKeepable reports whether the verbs side lets the QP serve another
// connection (see Conn.reusableQP for the rest): it was dialed, and its
// device is neither iWARP nor gone.
func (s *connSys) qpKeepable() bool {
	return s.vqp != nil && s.dialed && s.ar != nil && s.dev.keepQPs && !s.dev.isRemoved()
}

// retireQP keeps the drained QP for the pool (keep) or destroys it, and
// takes it off its CQ; qpMu is held.
func (s *connSys) retireQP(keep bool) {
	if s.vqp == nil {
		return
	}
	if keep {
		// Drained: nothing of it is left to complete.
		s.cqs.remove(s.vqp.Num)
		s.keepQP()
		return
	}
	s.cqs.retire(s.vqp.Num)
	retryDestroy(s.destroyQP)
	s.cqs.forget(s.vqp.Num)
}

// keepQP takes the QP from the id, reset, for the arena to keep in the
// pool (which rekeys the arena: see keepArena), or destroys it when the
// reset fails.
func (s *connSys) keepQP() {
	var err error
	s.cm.ch.Quiet(func() { err = s.id.ReleaseQP() })
	if err != nil {
		destroyQP(s.vqp)
		return
	}
	s.ar.qp, s.ar.qpShard = s.vqp, s.cqs
}

// useArena makes ar the connection's arena and counts its memory in the
// device's registered bytes; dropArena, on every path from here on
// (setup's failures too, before the data path has the memory), takes the
// same count back.
func (s *connSys) useArena(ar *arena) {
	s.ar = ar
	s.dev.addRegistered(len(ar.mem))
}

// dropArena takes back what useArena counted and gives the arena to the
// device's pool (or frees it).
func (s *connSys) dropArena() {
	if s.ar == nil {
		return
	}
	s.dev.addRegistered(-len(s.ar.mem))
	s.dev.keepArena(s.ar)
}

// portBackWait bounds how long a release waits for its device's port to
// come back before it destroys the id anyway.
const portBackWait = time.Minute

// waitPortBack waits, while the device's port is down, until it is back
// (or the device goes away, or portBackWait passes), when the connection
// manager still holds the connection as established: the id's destroy
// then sends the peer a disconnect request, which must not go while the
// port is down (see connSys.disconnect). A Close after an outage's
// ENETDOWN, as an application would do at once, otherwise sent it: on
// Soft-RoCE the device then answered no connection request after the
// outage, and the destroy could hang. It runs on the release's goroutine,
// not in Close.
func (s *connSys) waitPortBack(established bool) {
	if s.dev == nil || !established {
		return
	}
	back := s.dev.events.portBack()
	if back == nil {
		return
	}
	t := time.NewTimer(portBackWait)
	defer t.Stop()
	select {
	case <-back:
	case <-t.C:
	}
}

// releaseDevice gives the device's shared objects back: the CQ entries
// the QP reserved and the reference.
func (s *connSys) releaseDevice() {
	if s.dev != nil {
		s.dev.release(s.cqs, s.cqe)
	}
}
