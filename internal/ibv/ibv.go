//go:build linux && cgo

// Package ibv is a thin cgo layer over libibverbs: one Go type per C object,
// errors that name the verb and carry errno. The data-path calls are C shims
// that do a whole batch per cgo crossing (poll up to N completions, post a
// chain of receives) and take no Go pointers that escape.
package ibv

/*
#cgo LDFLAGS: -libverbs
#cgo noescape gv_poll
#cgo nocallback gv_poll
#cgo noescape gv_post_recvs
#cgo nocallback gv_post_recvs
#cgo noescape gv_post_sends
#cgo nocallback gv_post_sends
#cgo noescape gv_post_recvs_sends
#cgo nocallback gv_post_recvs_sends
#cgo nocallback gv_req_notify
#define _GNU_SOURCE // dup3
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <string.h>
#include <stdint.h>
#include <infiniband/verbs.h>

// The shims' batch limits; types.go declares the same numbers for Go and
// the checks below the import block keep the two equal.
#define GV_MAX_POLL 32
#define GV_MAX_SEND 32
#define GV_MAX_RECV 64
// Not ibv_send_flags bits: a zero-length RDMA WRITE instead of the SEND,
// and an RDMA WRITE with immediate data instead of the SEND.
#define GV_EMPTY_WRITE (1 << 30)
#define GV_WRITE_IMM (1 << 29)
// And one-sided operations of regions the caller registered: an RDMA READ
// of remote_addr into addr, an RDMA WRITE of addr to remote_addr.
#define GV_RDMA_READ (1 << 28)
#define GV_RDMA_WRITE (1 << 27)
// And a SEND whose payload is the header itself (for transports that carry
// no immediate data): 8 bytes, the immediate and the length, both in
// network order, sent inline.
#define GV_SEND_HEADER (1 << 26)
// And a SEND without immediate data of the payload at addr.
#define GV_SEND_PLAIN (1 << 25)
// With GV_SEND_HEADER: the length bytes at addr follow the header inline.
#define GV_HEADER_DATA (1 << 24)
// And remote atomics on the 8 bytes at remote_addr, whose old value lands
// in the 8 bytes at addr: a compare-and-swap (of compare for swap) and a
// fetch-and-add (of compare).
#define GV_ATOMIC_CAS (1 << 23)
#define GV_ATOMIC_FAA (1 << 22)
#define GV_HEADER_LEN 8
#define GV_HEADER_SLOT 80

// gv_wc is the part of ibv_wc the Go side reads; its layout is mirrored by
// the Go type WC.
struct gv_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t qp_num;
	uint32_t imm;      // host order; valid when wc_flags has IBV_WC_WITH_IMM
	uint32_t wc_flags;
	uint32_t src_qp;   // the sender's QP number: valid for a UD receive
};

// The data-path shims take the CQ or QP as an integer: cgo checks every
// pointer argument whose type may hold pointers (ibv_cq and ibv_qp do) for
// Go pointers, a cost per call that C memory does not need.

// gv_poll polls up to n completions and copies them into out.
static int gv_poll(uintptr_t cqp, int n, struct gv_wc *out) {
	struct ibv_cq *cq = (struct ibv_cq *)cqp;
	struct ibv_wc wc[GV_MAX_POLL];
	if (n > GV_MAX_POLL)
		n = GV_MAX_POLL;
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].qp_num = wc[i].qp_num;
		out[i].wc_flags = wc[i].wc_flags;
		out[i].src_qp = wc[i].src_qp;
		out[i].imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
	}
	return got;
}

#include "gv_ret.h"

// gv_recv mirrors the Go type RecvWR.
struct gv_recv {
	uint64_t wr_id;
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

// gv_post_recvs posts n receives as one chain (one doorbell).
static int gv_post_recvs(uintptr_t qpp, int n, const struct gv_recv *in) {
	struct ibv_qp *qp = (struct ibv_qp *)qpp;
	struct ibv_recv_wr wr[GV_MAX_RECV], *bad;
	struct ibv_sge sge[GV_MAX_RECV];
	if (n > GV_MAX_RECV)
		return EINVAL;
	for (int i = 0; i < n; i++) {
		sge[i].addr = in[i].addr;
		sge[i].length = in[i].length;
		sge[i].lkey = in[i].lkey;
		wr[i].wr_id = in[i].wr_id;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = in[i].length ? 1 : 0;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	errno = 0;
	return gv_ret(ibv_post_recv(qp, wr, &bad));
}

// gv_send mirrors the Go type SendWR.
struct gv_send {
	uint64_t wr_id;
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
	int32_t flags;
	uint32_t imm; // host order
	uint64_t remote_addr; // GV_WRITE_IMM: where in the peer's region of rkey
	uint32_t rkey;
	uint64_t compare; // GV_ATOMIC_CAS, GV_ATOMIC_FAA: the compared value, or the addend
	uint64_t swap;    // GV_ATOMIC_CAS: the value swapped in
};

// gv_post_sends posts n SENDs with immediate data as one chain (one
// doorbell, one system call on providers that need one); a zero length
// sends no payload. GV_RDMA_READ and GV_RDMA_WRITE make a send a plain
// RDMA READ or WRITE between addr and remote_addr under rkey, and
// GV_ATOMIC_CAS and GV_ATOMIC_FAA an atomic on the 8 bytes at remote_addr
// whose old value lands at addr. A send flagged GV_EMPTY_WRITE is a zero-length RDMA
// WRITE instead: no memory is read or written at either end, so it needs
// no rkey. One flagged GV_WRITE_IMM is an RDMA WRITE with immediate data
// to remote_addr under rkey: the payload lands there and the immediate
// consumes one of the peer's receives. Returns 0 or an errno value.
static int gv_post_sends(uintptr_t qpp, int n, const struct gv_send *in) {
	struct ibv_qp *qp = (struct ibv_qp *)qpp;
	struct ibv_send_wr wr[GV_MAX_SEND], *bad;
	struct ibv_sge sge[GV_MAX_SEND];
	unsigned char hdr[GV_MAX_SEND][GV_HEADER_SLOT];
	if (n > GV_MAX_SEND)
		return EINVAL;
	memset(wr, 0, n * sizeof(wr[0]));
	for (int i = 0; i < n; i++) {
		sge[i].addr = in[i].addr;
		sge[i].length = in[i].length;
		sge[i].lkey = in[i].lkey;
		wr[i].wr_id = in[i].wr_id;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = in[i].length ? 1 : 0;
		if (in[i].flags & GV_SEND_HEADER) {
			// Inline: the provider copies the bytes at post time, so
			// they may live on this stack and need no key.
			uint32_t h[2] = {htonl(in[i].imm), htonl(in[i].length)};
			memcpy(hdr[i], h, GV_HEADER_LEN);
			sge[i].length = GV_HEADER_LEN;
			if (in[i].flags & GV_HEADER_DATA) {
				if (in[i].length > GV_HEADER_SLOT - GV_HEADER_LEN)
					return EINVAL;
				// The payload is in registered memory outside
				// Go's heap (the send ring).
				memcpy(hdr[i] + GV_HEADER_LEN, (const void *)(uintptr_t)in[i].addr, in[i].length);
				sge[i].length += in[i].length;
			}
			sge[i].addr = (uintptr_t)hdr[i];
			sge[i].lkey = 0;
			wr[i].num_sge = 1;
			wr[i].opcode = IBV_WR_SEND;
			wr[i].send_flags = (in[i].flags & ~(GV_SEND_HEADER | GV_HEADER_DATA)) | IBV_SEND_INLINE;
		} else if (in[i].flags & GV_SEND_PLAIN) {
			wr[i].opcode = IBV_WR_SEND;
			wr[i].send_flags = in[i].flags & ~GV_SEND_PLAIN;
		} else if (in[i].flags & GV_EMPTY_WRITE) {
			wr[i].opcode = IBV_WR_RDMA_WRITE;
			wr[i].num_sge = 0;
			wr[i].send_flags = in[i].flags & ~GV_EMPTY_WRITE;
		} else if (in[i].flags & (GV_RDMA_READ | GV_RDMA_WRITE)) {
			wr[i].opcode = (in[i].flags & GV_RDMA_READ) ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
			wr[i].send_flags = in[i].flags & ~(GV_RDMA_READ | GV_RDMA_WRITE);
			wr[i].wr.rdma.remote_addr = in[i].remote_addr;
			wr[i].wr.rdma.rkey = in[i].rkey;
		} else if (in[i].flags & (GV_ATOMIC_CAS | GV_ATOMIC_FAA)) {
			wr[i].opcode = (in[i].flags & GV_ATOMIC_CAS) ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
			wr[i].send_flags = in[i].flags & ~(GV_ATOMIC_CAS | GV_ATOMIC_FAA);
			wr[i].wr.atomic.remote_addr = in[i].remote_addr;
			wr[i].wr.atomic.rkey = in[i].rkey;
			wr[i].wr.atomic.compare_add = in[i].compare;
			wr[i].wr.atomic.swap = in[i].swap;
		} else if (in[i].flags & GV_WRITE_IMM) {
			wr[i].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
			wr[i].imm_data = htonl(in[i].imm);
			wr[i].send_flags = in[i].flags & ~GV_WRITE_IMM;
			wr[i].wr.rdma.remote_addr = in[i].remote_addr;
			wr[i].wr.rdma.rkey = in[i].rkey;
		} else {
			wr[i].opcode = IBV_WR_SEND_WITH_IMM;
			wr[i].imm_data = htonl(in[i].imm);
			wr[i].send_flags = in[i].flags;
		}
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	errno = 0;
	return gv_ret(ibv_post_send(qp, wr, &bad));
}

// gv_post_recvs_sends posts nr receives, then ns sends (as gv_post_recvs
// and gv_post_sends), in one call from Go: receives a reader consumed go
// back with the next send, which costs one crossing instead of two. It
// returns 0, or an errno value with *sends_tried telling whose it is (0:
// the receives', and no send was posted).
static int gv_post_recvs_sends(uintptr_t qpp, int nr, const struct gv_recv *rin, int ns, const struct gv_send *sin, int *sends_tried) {
	*sends_tried = 0;
	int r = gv_post_recvs(qpp, nr, rin);
	if (r != 0)
		return r;
	*sends_tried = 1;
	return gv_post_sends(qpp, ns, sin);
}

// gv_post_rdma posts one RDMA operation of the peer's memory at raddr in
// its region of rkey: a WRITE of length bytes from addr (under lkey; a
// zero length writes nothing), a READ of length bytes into addr, or an
// atomic fetch-and-add of add to the 8 bytes there, whose old value lands
// in addr. Returns 0 or an errno value.
static int gv_post_rdma(uintptr_t qpp, int opcode, uint64_t wr_id, uint64_t addr, uint32_t length, uint32_t lkey,
                        uint64_t raddr, uint32_t rkey, int flags, uint64_t add) {
	struct ibv_qp *qp = (struct ibv_qp *)qpp;
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	memset(&wr, 0, sizeof(wr));
	sge.addr = addr;
	sge.length = length;
	sge.lkey = lkey;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = length ? 1 : 0;
	wr.opcode = opcode;
	wr.send_flags = flags;
	if (opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = add;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	errno = 0;
	return gv_ret(ibv_post_send(qp, &wr, &bad));
}

// gv_release_files points the context's command and event descriptors at
// /dev/null, closing what they were open on (see Context.ReleaseFiles).
static int gv_release_files(struct ibv_context *ctx) {
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0)
		return -1;
	int r = 0;
	if (dup3(null, ctx->cmd_fd, O_CLOEXEC) < 0 || dup3(null, ctx->async_fd, O_CLOEXEC) < 0)
		r = -1;
	close(null);
	return r;
}

// gv_async is the part of an ibv_async_event the Go side needs, copied out
// so that the event is acknowledged at once: destroying a QP or CQ waits
// for the acknowledgement of every event about it.
struct gv_async {
	int type;
	uint32_t qp_num;
	int port;
};

// gv_get_async reads, copies and acknowledges one asynchronous event.
// Returns 0, or -1 with errno (EAGAIN when there is none).
static int gv_get_async(struct ibv_context *ctx, struct gv_async *out) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev))
		return -1;
	memset(out, 0, sizeof(*out));
	out->type = ev.event_type;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp_num = ev.element.qp->qp_num;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

static int gv_async_fd(struct ibv_context *ctx) { return ctx->async_fd; }

static int gv_req_notify(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// gv_drain_events reads completion events until the channel is empty and
// acknowledges them. Returns the number read, or -1 with errno on failure
// other than EAGAIN.
static int gv_drain_events(struct ibv_comp_channel *ch) {
	int n = 0;
	struct ibv_cq *cq;
	void *ctx;
	for (;;) {
		if (ibv_get_cq_event(ch, &cq, &ctx)) {
			if (errno == EAGAIN)
				return n;
			return -1;
		}
		ibv_ack_cq_events(cq, 1);
		n++;
	}
}
*/
import "C"

import (
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/goverbs/rdma/internal/pollfd"
)

// Compile-time checks that types.go agrees with libibverbs and the shims:
// each array length is zero only if the two numbers are equal, and a
// negative length does not compile.
var (
	_ [SendSignaled - C.IBV_SEND_SIGNALED]struct{}
	_ [C.IBV_SEND_SIGNALED - SendSignaled]struct{}
	_ [SendInline - C.IBV_SEND_INLINE]struct{}
	_ [C.IBV_SEND_INLINE - SendInline]struct{}
	_ [SendEmptyWrite - C.GV_EMPTY_WRITE]struct{}
	_ [C.GV_EMPTY_WRITE - SendEmptyWrite]struct{}
	_ [SendWriteImm - C.GV_WRITE_IMM]struct{}
	_ [C.GV_WRITE_IMM - SendWriteImm]struct{}
	_ [SendRead - C.GV_RDMA_READ]struct{}
	_ [C.GV_RDMA_READ - SendRead]struct{}
	_ [SendWrite - C.GV_RDMA_WRITE]struct{}
	_ [C.GV_RDMA_WRITE - SendWrite]struct{}
	_ [SendHeader - C.GV_SEND_HEADER]struct{}
	_ [C.GV_SEND_HEADER - SendHeader]struct{}
	_ [SendPlain - C.GV_SEND_PLAIN]struct{}
	_ [C.GV_SEND_PLAIN - SendPlain]struct{}
	_ [HeaderLen - C.GV_HEADER_LEN]struct{}
	_ [C.GV_HEADER_LEN - HeaderLen]struct{}
	_ [HeaderSlot - C.GV_HEADER_SLOT]struct{}
	_ [C.GV_HEADER_SLOT - HeaderSlot]struct{}
	_ [SendCompareSwap - C.GV_ATOMIC_CAS]struct{}
	_ [C.GV_ATOMIC_CAS - SendCompareSwap]struct{}
	_ [SendFetchAdd - C.GV_ATOMIC_FAA]struct{}
	_ [C.GV_ATOMIC_FAA - SendFetchAdd]struct{}
	_ [AtomicNone - C.IBV_ATOMIC_NONE]struct{}
	_ [C.IBV_ATOMIC_NONE - AtomicNone]struct{}
	_ [AtomicHCA - C.IBV_ATOMIC_HCA]struct{}
	_ [C.IBV_ATOMIC_HCA - AtomicHCA]struct{}
	_ [AtomicGlob - C.IBV_ATOMIC_GLOB]struct{}
	_ [C.IBV_ATOMIC_GLOB - AtomicGlob]struct{}
	_ [SendHeaderData - C.GV_HEADER_DATA]struct{}
	_ [C.GV_HEADER_DATA - SendHeaderData]struct{}
	_ [WCRemAccessErr - C.IBV_WC_REM_ACCESS_ERR]struct{}
	_ [C.IBV_WC_REM_ACCESS_ERR - WCRemAccessErr]struct{}
	_ [WCRemInvReqErr - C.IBV_WC_REM_INV_REQ_ERR]struct{}
	_ [C.IBV_WC_REM_INV_REQ_ERR - WCRemInvReqErr]struct{}
	_ [WCLocProtErr - C.IBV_WC_LOC_PROT_ERR]struct{}
	_ [C.IBV_WC_LOC_PROT_ERR - WCLocProtErr]struct{}
	_ [WCOpRecv - C.IBV_WC_RECV]struct{}
	_ [C.IBV_WC_RECV - WCOpRecv]struct{}
	_ [WCOpRecvWriteImm - C.IBV_WC_RECV_RDMA_WITH_IMM]struct{}
	_ [C.IBV_WC_RECV_RDMA_WITH_IMM - WCOpRecvWriteImm]struct{}
	_ [EventCQErr - C.IBV_EVENT_CQ_ERR]struct{}
	_ [C.IBV_EVENT_CQ_ERR - EventCQErr]struct{}
	_ [EventQPFatal - C.IBV_EVENT_QP_FATAL]struct{}
	_ [C.IBV_EVENT_QP_FATAL - EventQPFatal]struct{}
	_ [EventQPReqErr - C.IBV_EVENT_QP_REQ_ERR]struct{}
	_ [C.IBV_EVENT_QP_REQ_ERR - EventQPReqErr]struct{}
	_ [EventQPAccessErr - C.IBV_EVENT_QP_ACCESS_ERR]struct{}
	_ [C.IBV_EVENT_QP_ACCESS_ERR - EventQPAccessErr]struct{}
	_ [EventPathMigErr - C.IBV_EVENT_PATH_MIG_ERR]struct{}
	_ [C.IBV_EVENT_PATH_MIG_ERR - EventPathMigErr]struct{}
	_ [EventDeviceFatal - C.IBV_EVENT_DEVICE_FATAL]struct{}
	_ [C.IBV_EVENT_DEVICE_FATAL - EventDeviceFatal]struct{}
	_ [EventPortActive - C.IBV_EVENT_PORT_ACTIVE]struct{}
	_ [C.IBV_EVENT_PORT_ACTIVE - EventPortActive]struct{}
	_ [EventPortErr - C.IBV_EVENT_PORT_ERR]struct{}
	_ [C.IBV_EVENT_PORT_ERR - EventPortErr]struct{}
	_ [WCSuccess - C.IBV_WC_SUCCESS]struct{}
	_ [C.IBV_WC_SUCCESS - WCSuccess]struct{}
	_ [WCFlushErr - C.IBV_WC_WR_FLUSH_ERR]struct{}
	_ [C.IBV_WC_WR_FLUSH_ERR - WCFlushErr]struct{}
	_ [WCRetryExcErr - C.IBV_WC_RETRY_EXC_ERR]struct{}
	_ [C.IBV_WC_RETRY_EXC_ERR - WCRetryExcErr]struct{}
	_ [WCWithImm - C.IBV_WC_WITH_IMM]struct{}
	_ [C.IBV_WC_WITH_IMM - WCWithImm]struct{}
	_ [MaxPollBatch - C.GV_MAX_POLL]struct{}
	_ [C.GV_MAX_POLL - MaxPollBatch]struct{}
	_ [MaxSendBatch - C.GV_MAX_SEND]struct{}
	_ [C.GV_MAX_SEND - MaxSendBatch]struct{}
	_ [MaxRecvBatch - C.GV_MAX_RECV]struct{}
	_ [C.GV_MAX_RECV - MaxRecvBatch]struct{}
	_ [unsafe.Sizeof(WC{}) - C.sizeof_struct_gv_wc]struct{}
	_ [C.sizeof_struct_gv_wc - unsafe.Sizeof(WC{})]struct{}
	_ [unsafe.Sizeof(RecvWR{}) - C.sizeof_struct_gv_recv]struct{}
	_ [C.sizeof_struct_gv_recv - unsafe.Sizeof(RecvWR{})]struct{}
	_ [unsafe.Sizeof(SendWR{}) - C.sizeof_struct_gv_send]struct{}
	_ [C.sizeof_struct_gv_send - unsafe.Sizeof(SendWR{})]struct{}
)

// StatusString describes a completion status (ibv_wc_status_str).
func StatusString(s uint32) string {
	return C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(s)))
}

// Context is an ibv_context owned by librdmacm (one per device, shared by
// every id on it); it is never closed here.
type Context struct{ c *C.struct_ibv_context }

// ContextFrom wraps an ibv_context pointer from rdmacm.ID.Verbs.
func ContextFrom(p unsafe.Pointer) *Context { return &Context{c: (*C.struct_ibv_context)(p)} }

// Ptr is the C pointer, used as the device's identity.
func (c *Context) Ptr() unsafe.Pointer { return unsafe.Pointer(c.c) }

// Name is the device name (e.g. "rxe0").
func (c *Context) Name() string { return C.GoString(C.ibv_get_device_name(c.c.device)) }

// IWARP reports whether the device speaks iWARP (siw, Chelsio T6, Intel
// E810 in iWARP mode): no immediate data on any work request, and an RDMA
// READ's sink must allow remote writes (its response is a tagged write).
func (c *Context) IWARP() bool { return c.c.device.transport_type == C.IBV_TRANSPORT_IWARP }

// DeviceAttr is what the library needs of a device's attributes.
type DeviceAttr struct {
	VendorID uint32 // IEEE vendor id
	MaxCQE   int    // the most entries a CQ may have
	// MaxQPRdAtom is the most RDMA READs (and atomics) a QP may serve
	// for its peer at once; MaxQPInitRdAtom the most it may have
	// outstanding itself.
	MaxQPRdAtom, MaxQPInitRdAtom int
	// AtomicCap says how atomic the device's remote atomics are
	// (AtomicNone: it has none).
	AtomicCap    int
	VendorPartID uint32 // the vendor's part number of the device
}

// Query returns the device's attributes (ibv_query_device).
func (c *Context) Query() (DeviceAttr, error) {
	var a C.struct_ibv_device_attr
	if r := C.ibv_query_device(c.c, &a); r != 0 {
		return DeviceAttr{}, os.NewSyscallError("ibv_query_device", syscall.Errno(r))
	}
	return DeviceAttr{VendorID: uint32(a.vendor_id), MaxCQE: int(a.max_cqe),
		MaxQPRdAtom: int(a.max_qp_rd_atom), MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		AtomicCap: int(a.atomic_cap), VendorPartID: uint32(a.vendor_part_id)}, nil
}

// AsyncChannel reads a context's asynchronous events (QP and CQ errors,
// port state, a fatal device error) through the netpoller.
type AsyncChannel struct {
	ctx *C.struct_ibv_context
	fd  *pollfd.FD
	ev  C.struct_gv_async
}

// OpenAsync makes the context's event descriptor nonblocking and registers
// it with the netpoller.
func (c *Context) OpenAsync() (*AsyncChannel, error) {
	fd, err := pollfd.New(int(C.gv_async_fd(c.c)), "ibv_async")
	if err != nil {
		return nil, err
	}
	return &AsyncChannel{ctx: c.c, fd: fd}, nil
}

// Run parks until events arrive and passes each to handle, acknowledged,
// until Interrupt is called; then it returns. Only one goroutine may Run.
func (a *AsyncChannel) Run(handle func(AsyncEvent)) error {
	return a.fd.Drain(func() error {
		if r, err := C.gv_get_async(a.ctx, &a.ev); r != 0 {
			if err == syscall.EAGAIN || err == syscall.EINTR {
				return err
			}
			return os.NewSyscallError("ibv_get_async_event", err)
		}
		handle(AsyncEvent{Type: AsyncEventType(a.ev._type), QPNum: uint32(a.ev.qp_num), Port: int(a.ev.port)})
		return nil
	})
}

// Interrupt makes Run return and releases the registered descriptor (a
// duplicate: the context keeps its own).
func (a *AsyncChannel) Interrupt() { a.fd.Close() }

// String names the event type (ibv_event_type_str).
func (t AsyncEventType) String() string {
	return C.GoString(C.ibv_event_type_str(C.enum_ibv_event_type(t)))
}

// ReleaseFiles lets the kernel finish removing the context's device
// while the context stays open: the device's files (its command and event
// descriptors) are closed, and the descriptor numbers now refer to
// /dev/null, so that whoever closes the context later closes those
// instead. It is for a device that is gone, whose context its opener
// (librdmacm) cannot close, once nothing of this process uses the context.
func (c *Context) ReleaseFiles() error {
	if r, err := C.gv_release_files(c.c); r != 0 {
		return os.NewSyscallError("dup3", err)
	}
	return nil
}

// PD is a protection domain.
type PD struct{ p *C.struct_ibv_pd }

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (c *Context) AllocPD() (*PD, error) {
	p, err := C.ibv_alloc_pd(c.c)
	if p == nil {
		return nil, os.NewSyscallError("ibv_alloc_pd", errnoOr(err))
	}
	return &PD{p: p}, nil
}

// Ptr is the C pointer, for rdmacm.ID.CreateQP.
func (pd *PD) Ptr() unsafe.Pointer { return unsafe.Pointer(pd.p) }

// Dealloc frees the PD (ibv_dealloc_pd).
func (pd *PD) Dealloc() error {
	if r := C.ibv_dealloc_pd(pd.p); r != 0 {
		return os.NewSyscallError("ibv_dealloc_pd", syscall.Errno(r))
	}
	return nil
}

// MR is a registered memory region: for local access only (RegMR), or
// writable by the peers of QPs in the same PD too (RegMRRemoteWrite).
type MR struct {
	m    *C.struct_ibv_mr
	LKey uint32
	RKey uint32 // the key a peer names the region by; useless to it without remote access
}

// RegMR registers mem, which must not be Go heap memory (C keeps pointers
// into it), with IBV_ACCESS_LOCAL_WRITE only: no peer can read or write it.
func (pd *PD) RegMR(mem []byte) (*MR, error) {
	return pd.regMR(mem, C.IBV_ACCESS_LOCAL_WRITE)
}

// RegMRRemoteWrite registers mem like RegMR, and lets the peers of QPs in
// this PD write it with RDMA WRITE (never read it: no remote read or
// atomic access).
func (pd *PD) RegMRRemoteWrite(mem []byte) (*MR, error) {
	return pd.regMR(mem, C.IBV_ACCESS_LOCAL_WRITE|C.IBV_ACCESS_REMOTE_WRITE)
}

// RegMRAccess registers mem like RegMR, and lets the peers of QPs in this
// PD read it (remoteRead) and write it (remoteWrite) with RDMA READ and
// WRITE, and apply atomics to it (remoteAtomic).
func (pd *PD) RegMRAccess(mem []byte, remoteRead, remoteWrite, remoteAtomic bool) (*MR, error) {
	access := C.int(C.IBV_ACCESS_LOCAL_WRITE)
	if remoteRead {
		access |= C.IBV_ACCESS_REMOTE_READ
	}
	if remoteWrite {
		access |= C.IBV_ACCESS_REMOTE_WRITE
	}
	if remoteAtomic {
		access |= C.IBV_ACCESS_REMOTE_ATOMIC
	}
	return pd.regMR(mem, access)
}

func (pd *PD) regMR(mem []byte, access C.int) (*MR, error) {
	m, err := C.ibv_reg_mr(pd.p, unsafe.Pointer(unsafe.SliceData(mem)), C.size_t(len(mem)), access)
	if m == nil {
		return nil, os.NewSyscallError("ibv_reg_mr", errnoOr(err))
	}
	return &MR{m: m, LKey: uint32(m.lkey), RKey: uint32(m.rkey)}, nil
}

// Len is the bytes the region registers.
func (mr *MR) Len() int { return int(mr.m.length) }

// Dereg deregisters the region (ibv_dereg_mr).
func (mr *MR) Dereg() error {
	if r := C.ibv_dereg_mr(mr.m); r != 0 {
		return os.NewSyscallError("ibv_dereg_mr", syscall.Errno(r))
	}
	return nil
}

// CompChannel is a completion channel whose fd sits in the netpoller.
type CompChannel struct {
	ch     *C.struct_ibv_comp_channel
	fd     *pollfd.FD
	drain  func(uintptr) bool // built once: Wait must not allocate
	failed error
}

// CreateCompChannel creates a completion channel (ibv_create_comp_channel).
func (c *Context) CreateCompChannel() (*CompChannel, error) {
	ch, err := C.ibv_create_comp_channel(c.c)
	if ch == nil {
		return nil, os.NewSyscallError("ibv_create_comp_channel", errnoOr(err))
	}
	fd, err := pollfd.New(int(ch.fd), "ibv_comp_channel")
	if err != nil {
		C.ibv_destroy_comp_channel(ch)
		return nil, err
	}
	cc := &CompChannel{ch: ch, fd: fd}
	cc.drain = func(uintptr) bool {
		n, err := C.gv_drain_events(cc.ch)
		if n < 0 {
			cc.failed = os.NewSyscallError("ibv_get_cq_event", err)
			return true
		}
		return n > 0
	}
	return cc, nil
}

// Wait parks until at least one completion event arrives, reads and
// acknowledges every pending event, and returns. After Interrupt it returns
// an error.
func (ch *CompChannel) Wait() error {
	ch.failed = nil // a failed read is reported once; the next Wait tries again
	if err := ch.fd.Wait(ch.drain); err != nil {
		return err
	}
	return ch.failed
}

// Interrupt wakes a parked Wait for shutdown; Wait fails from then on.
func (ch *CompChannel) Interrupt() { ch.fd.Close() }

// Destroy destroys the channel (ibv_destroy_comp_channel); its CQs go first.
func (ch *CompChannel) Destroy() error {
	if r := C.ibv_destroy_comp_channel(ch.ch); r != 0 {
		return os.NewSyscallError("ibv_destroy_comp_channel", syscall.Errno(r))
	}
	return nil
}

// CQ is a completion queue.
type CQ struct {
	cq  *C.struct_ibv_cq
	Cap int
}

// CreateCQ creates a CQ with at least cqe entries bound to ch.
func (c *Context) CreateCQ(cqe int, ch *CompChannel) (*CQ, error) {
	cq, err := C.ibv_create_cq(c.c, C.int(cqe), nil, ch.ch, 0)
	if cq == nil {
		return nil, os.NewSyscallError("ibv_create_cq", errnoOr(err))
	}
	return &CQ{cq: cq, Cap: int(cq.cqe)}, nil
}

// CreatePolledCQ creates a CQ with at least cqe entries and no completion
// channel: it raises no events, and its owner only polls it.
func (c *Context) CreatePolledCQ(cqe int) (*CQ, error) {
	cq, err := C.ibv_create_cq(c.c, C.int(cqe), nil, nil, 0)
	if cq == nil {
		return nil, os.NewSyscallError("ibv_create_cq", errnoOr(err))
	}
	return &CQ{cq: cq, Cap: int(cq.cqe)}, nil
}

// CQFrom wraps an ibv_cq pointer made elsewhere (a provider's own, in
// benchmarks); it is never destroyed here.
func CQFrom(p unsafe.Pointer) *CQ {
	cq := (*C.struct_ibv_cq)(p)
	return &CQ{cq: cq, Cap: int(cq.cqe)}
}

// Ptr is the C pointer, for rdmacm.ID.CreateQP.
func (cq *CQ) Ptr() unsafe.Pointer { return unsafe.Pointer(cq.cq) }

// Poll fills wcs with up to len(wcs) (at most MaxPollBatch) completions.
func (cq *CQ) Poll(wcs []WC) (int, error) {
	n := C.gv_poll(C.uintptr_t(uintptr(unsafe.Pointer(cq.cq))), C.int(len(wcs)), (*C.struct_gv_wc)(unsafe.Pointer(unsafe.SliceData(wcs))))
	if n < 0 {
		// ibv_poll_cq reports failure without an errno: EIO stands in.
		return 0, os.NewSyscallError("ibv_poll_cq", syscall.EIO)
	}
	return int(n), nil
}

// ReqNotify arms the CQ for one completion event (ibv_req_notify_cq).
func (cq *CQ) ReqNotify() error {
	if r := C.gv_req_notify(cq.cq); r != 0 {
		return os.NewSyscallError("ibv_req_notify_cq", syscall.Errno(r))
	}
	return nil
}

// Resize grows the CQ to at least cqe entries (ibv_resize_cq).
func (cq *CQ) Resize(cqe int) error {
	if r := C.ibv_resize_cq(cq.cq, C.int(cqe)); r != 0 {
		return os.NewSyscallError("ibv_resize_cq", syscall.Errno(r))
	}
	cq.Cap = int(cq.cq.cqe)
	return nil
}

// Destroy destroys the CQ (ibv_destroy_cq); its QPs go first.
func (cq *CQ) Destroy() error {
	if r := C.ibv_destroy_cq(cq.cq); r != 0 {
		return os.NewSyscallError("ibv_destroy_cq", syscall.Errno(r))
	}
	return nil
}

// QP is a queue pair created (and destroyed) through rdmacm.
type QP struct {
	qp *C.struct_ibv_qp
	// Num is the QP number completions carry.
	Num uint32
	// SerialPosts, set before the QP's first post, makes its posts take
	// turns in Go. Providers guard the send queue with a spin lock, and
	// siw holds it across the system call that transmits the data: a
	// second goroutine posting meanwhile spun in C for as long as the
	// first was in the kernel and, its CPU shared with the holder, for
	// whole time slices (85 % of a process's CPU in pthread_spin_lock, and
	// 9 ms per 64 KiB one-sided WRITE, with a few in flight on
	// soft-iWARP). A goroutine waiting for postMu parks instead. Where the
	// lock is not held across the system call (rxe, where posts in turn
	// cost a stream of 4 KiB messages 5 % in an interleaved run) or the
	// post is a few stores (a hardware NIC), posts are left to the
	// provider.
	SerialPosts bool
	postMu      sync.Mutex
}

// QPFrom wraps an ibv_qp pointer from rdmacm.ID.CreateQP.
func QPFrom(p unsafe.Pointer) *QP {
	q := (*C.struct_ibv_qp)(p)
	return &QP{qp: q, Num: uint32(q.qp_num)}
}

// Ptr is the C pointer, for rdmacm.ID.AdoptQP.
func (qp *QP) Ptr() unsafe.Pointer { return unsafe.Pointer(qp.qp) }

// Destroy destroys a QP that no id holds (ibv_destroy_qp).
func (qp *QP) Destroy() error {
	if r := C.ibv_destroy_qp(qp.qp); r != 0 {
		return os.NewSyscallError("ibv_destroy_qp", syscall.Errno(r))
	}
	return nil
}

// PostSends posts up to MaxSendBatch SENDs (or RDMA WRITEs, see SendWR)
// as one chain (ibv_post_send).
func (qp *QP) PostSends(wrs []SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if qp.SerialPosts {
		qp.postMu.Lock()
		defer qp.postMu.Unlock()
	}
	r := C.gv_post_sends(C.uintptr_t(uintptr(unsafe.Pointer(qp.qp))), C.int(len(wrs)), (*C.struct_gv_send)(unsafe.Pointer(unsafe.SliceData(wrs))))
	if r != 0 {
		return os.NewSyscallError("ibv_post_send", errno(r))
	}
	return nil
}

// PostWrite posts one RDMA WRITE (ibv_post_send). The peer's region must
// allow remote writes, or the peer's NIC refuses it (a remote access
// error; see RegMRRemoteWrite).
func (qp *QP) PostWrite(wr WriteWR) error { return qp.postRDMA(C.IBV_WR_RDMA_WRITE, wr, 0) }

// PostRead posts one RDMA READ of Len bytes at RemoteAddr into Addr. The
// peer's region must allow remote reads; this package registers none
// that do.
func (qp *QP) PostRead(wr WriteWR) error { return qp.postRDMA(C.IBV_WR_RDMA_READ, wr, 0) }

// PostFetchAdd posts one atomic fetch-and-add of add to the 8 bytes at
// RemoteAddr (8-byte aligned), their old value landing at Addr (Len 8).
// The peer's region must allow remote atomics. For tests: the library
// posts its atomics with PostSends.
func (qp *QP) PostFetchAdd(wr WriteWR, add uint64) error {
	return qp.postRDMA(C.IBV_WR_ATOMIC_FETCH_AND_ADD, wr, add)
}

func (qp *QP) postRDMA(op C.int, wr WriteWR, add uint64) error {
	if qp.SerialPosts {
		qp.postMu.Lock()
		defer qp.postMu.Unlock()
	}
	r := C.gv_post_rdma(C.uintptr_t(uintptr(unsafe.Pointer(qp.qp))), op, C.uint64_t(wr.ID), C.uint64_t(wr.Addr),
		C.uint32_t(wr.Len), C.uint32_t(wr.LKey), C.uint64_t(wr.RemoteAddr), C.uint32_t(wr.RKey), C.int(wr.Flags), C.uint64_t(add))
	if r != 0 {
		return os.NewSyscallError("ibv_post_send", errno(r))
	}
	return nil
}

// PostRecvsSends posts up to MaxRecvBatch receives (ibv_post_recv), then
// up to MaxSendBatch sends (ibv_post_send), in one call into C. It returns
// the receives' error, having posted no send, or the sends'.
func (qp *QP) PostRecvsSends(recvs []RecvWR, sends []SendWR) (recvErr, sendErr error) {
	if len(recvs) == 0 {
		return nil, qp.PostSends(sends)
	}
	if len(sends) == 0 {
		return qp.PostRecvs(recvs), nil
	}
	if qp.SerialPosts {
		qp.postMu.Lock()
		defer qp.postMu.Unlock()
	}
	var tried C.int
	r := C.gv_post_recvs_sends(C.uintptr_t(uintptr(unsafe.Pointer(qp.qp))),
		C.int(len(recvs)), (*C.struct_gv_recv)(unsafe.Pointer(unsafe.SliceData(recvs))),
		C.int(len(sends)), (*C.struct_gv_send)(unsafe.Pointer(unsafe.SliceData(sends))), &tried)
	switch {
	case r == 0:
		return nil, nil
	case tried == 0:
		return os.NewSyscallError("ibv_post_recv", errno(r)), nil
	}
	return nil, os.NewSyscallError("ibv_post_send", errno(r))
}

// PostRecvs posts up to MaxRecvBatch receives as one chain (ibv_post_recv).
func (qp *QP) PostRecvs(wrs []RecvWR) error {
	if len(wrs) == 0 {
		return nil
	}
	r := C.gv_post_recvs(C.uintptr_t(uintptr(unsafe.Pointer(qp.qp))), C.int(len(wrs)), (*C.struct_gv_recv)(unsafe.Pointer(unsafe.SliceData(wrs))))
	if r != 0 {
		return os.NewSyscallError("ibv_post_recv", errno(r))
	}
	return nil
}

// errno is the errno value a post verb returned, as gv_ret made it
// positive (a provider may return it negated, or -1 with errno set); it
// also takes a negated value from the other shims.
func errno(r C.int) syscall.Errno {
	if r < 0 {
		r = -r
	}
	return syscall.Errno(r)
}

func errnoOr(err error) error {
	if err == nil {
		return syscall.ENOMEM
	}
	return err
}
