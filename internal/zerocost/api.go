package zerocost

import (
	"errors"
	"unsafe"

	"github.com/goverbs/rdma/internal/ibv"
)

// ErrUnavailable is New's error in a build without cgo: the provider is C.
var ErrUnavailable = errors.New("zerocost: the provider needs cgo and the libibverbs headers")

// QP is an end's queue pair as the library posts to it (an *ibv.QP).
type QP interface {
	PostSends(wrs []ibv.SendWR) error
	PostRecvs(wrs []ibv.RecvWR) error
}

// CQ is an end's completion queue as the library's poller drains it (an
// *ibv.CQ).
type CQ interface {
	Poll(wcs []ibv.WC) (int, error)
	ReqNotify() error
}

// End is one side of a Wire: its QP and the CQ of both its queues.
type End struct {
	QP    QP
	QPNum uint32
	CQ    CQ
}

// Access is what a registration lets the peer do; the owner may always
// read and write.
type Access int

const (
	RemoteRead Access = 1 << iota
	RemoteWrite
	RemoteAtomic
)

// Addr is the address of buf's first byte, as the NIC names it: here, its
// address in the process.
func Addr(buf []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))) }

// Stats counts an end's calls into the provider.
type Stats struct {
	PostSend, SendWRs uint64 // ibv_post_send calls, and the work requests they carried
	PostRecv, RecvWRs uint64 // ibv_post_recv calls, and the receives they carried
	Polls, EmptyPolls uint64 // ibv_poll_cq calls, and those that found nothing
	CQEs              uint64 // completions polled
	Arms              uint64 // ibv_req_notify_cq calls
}

// Calls is the verbs calls the stats count.
func (s Stats) Calls() uint64 { return s.PostSend + s.PostRecv + s.Polls + s.Arms }

// Sub is s less an earlier snapshot.
func (s Stats) Sub(o Stats) Stats {
	return Stats{s.PostSend - o.PostSend, s.SendWRs - o.SendWRs, s.PostRecv - o.PostRecv, s.RecvWRs - o.RecvWRs,
		s.Polls - o.Polls, s.EmptyPolls - o.EmptyPolls, s.CQEs - o.CQEs, s.Arms - o.Arms}
}

// Add is s plus o.
func (s Stats) Add(o Stats) Stats {
	return Stats{s.PostSend + o.PostSend, s.SendWRs + o.SendWRs, s.PostRecv + o.PostRecv, s.RecvWRs + o.RecvWRs,
		s.Polls + o.Polls, s.EmptyPolls + o.EmptyPolls, s.CQEs + o.CQEs, s.Arms + o.Arms}
}

// Pattern is one of the C benchmarks' message patterns (see zc_bench.c).
type Pattern int

const (
	// PingPong: a 64 B message and its answer of the same size, each an
	// RDMA WRITE with immediate data into the peer's receive ring.
	PingPong Pattern = iota
	// Rate: one-way messages, one per post, credits coming back in SENDs.
	Rate
	// Stream: one-way messages of the given size, a writer and a reader
	// thread.
	Stream
	// Read: one-sided RDMA READs of the given size, each waited for.
	Read
)
