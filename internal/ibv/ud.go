//go:build linux && cgo

package ibv

/*
#cgo noescape gv_post_ud_sends
#cgo nocallback gv_post_ud_sends
#include <errno.h>
#include <string.h>
#include <stdint.h>
#include <infiniband/verbs.h>
#include "gv_ret.h"

// gv_ud_send mirrors the Go type UDSendWR.
struct gv_ud_send {
	uint64_t wr_id;
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
	uint64_t ah; // struct ibv_ah *
	uint32_t qpn;
	uint32_t qkey;
	int32_t flags;
	uint32_t pad;
};

#define GV_MAX_UD_SEND 32

// gv_post_ud_sends posts n datagram SENDs as one chain (one doorbell).
static int gv_post_ud_sends(uintptr_t qpp, int n, const struct gv_ud_send *in) {
	struct ibv_qp *qp = (struct ibv_qp *)qpp;
	struct ibv_send_wr wr[GV_MAX_UD_SEND], *bad;
	struct ibv_sge sge[GV_MAX_UD_SEND];
	if (n > GV_MAX_UD_SEND)
		return EINVAL;
	memset(wr, 0, n * sizeof(wr[0]));
	for (int i = 0; i < n; i++) {
		sge[i].addr = in[i].addr;
		sge[i].length = in[i].length;
		sge[i].lkey = in[i].lkey;
		wr[i].wr_id = in[i].wr_id;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = 1;
		wr[i].opcode = IBV_WR_SEND;
		wr[i].send_flags = in[i].flags;
		wr[i].wr.ud.ah = (struct ibv_ah *)(uintptr_t)in[i].ah;
		wr[i].wr.ud.remote_qpn = in[i].qpn;
		wr[i].wr.ud.remote_qkey = in[i].qkey;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	errno = 0;
	return gv_ret(ibv_post_send(qp, wr, &bad));
}

// gv_create_ud_qp creates a UD QP on pd with cq for both directions and
// moves it to RTS: INIT on port with pkey index 0 and qkey, RTR, RTS.
// Returns NULL with *err set on failure; *max_inline is what the provider
// granted.
static struct ibv_qp *gv_create_ud_qp(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t send_wr, uint32_t recv_wr,
                                      uint32_t inline_, uint8_t port, uint32_t qkey, uint32_t *max_inline, int *err) {
	struct ibv_qp_init_attr ia;
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_UD;
	ia.cap.max_send_wr = send_wr;
	ia.cap.max_recv_wr = recv_wr;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	ia.cap.max_inline_data = inline_;
	ia.sq_sig_all = 0;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp && inline_) {
		ia.cap.max_inline_data = 0;
		qp = ibv_create_qp(pd, &ia);
	}
	if (!qp) {
		*err = errno ? errno : ENOMEM;
		return NULL;
	}
	*max_inline = ia.cap.max_inline_data;
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qkey = qkey;
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	if (!r) {
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTR;
		r = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	}
	if (!r) {
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	}
	if (r) {
		ibv_destroy_qp(qp);
		*err = r > 0 ? r : (errno ? errno : EINVAL);
		return NULL;
	}
	return qp;
}


// gv_mcast attaches qp to (or detaches it from) the multicast group whose
// address handle attributes are attr.
static int gv_mcast(struct ibv_qp *qp, const struct ibv_ah_attr *attr, int detach) {
	if (detach)
		return ibv_detach_mcast(qp, &attr->grh.dgid, attr->dlid);
	return ibv_attach_mcast(qp, &attr->grh.dgid, attr->dlid);
}
*/
import "C"

import (
	"os"
	"syscall"
	"unsafe"
)

var (
	_ [unsafe.Sizeof(UDSendWR{}) - C.sizeof_struct_gv_ud_send]struct{}
	_ [C.sizeof_struct_gv_ud_send - unsafe.Sizeof(UDSendWR{})]struct{}
	_ [MaxUDSendBatch - C.GV_MAX_UD_SEND]struct{}
	_ [C.GV_MAX_UD_SEND - MaxUDSendBatch]struct{}
	_ [WCGRH - C.IBV_WC_GRH]struct{}
	_ [C.IBV_WC_GRH - WCGRH]struct{}
	_ [UDQKey - C.uint(0x01234567)]struct{}
)

// CreateUDQP creates a UD QP on pd whose sends and receives complete on
// cq, ready to send and receive (RTS) on port with Q_Key qkey, and returns
// it with the inline size the provider granted.
func (pd *PD) CreateUDQP(cq *CQ, sendWR, recvWR, inline int, port uint8, qkey uint32) (*QP, int, error) {
	var maxInline C.uint32_t
	var e C.int
	qp := C.gv_create_ud_qp(pd.p, cq.cq, C.uint32_t(sendWR), C.uint32_t(recvWR), C.uint32_t(inline),
		C.uint8_t(port), C.uint32_t(qkey), &maxInline, &e)
	if qp == nil {
		return nil, 0, os.NewSyscallError("ibv_create_qp", syscall.Errno(e))
	}
	return QPFrom(unsafe.Pointer(qp)), int(maxInline), nil
}

// PostUDSends posts datagram SENDs as one chain.
func (qp *QP) PostUDSends(wrs []UDSendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	r := C.gv_post_ud_sends(C.uintptr_t(uintptr(unsafe.Pointer(qp.qp))), C.int(len(wrs)), (*C.struct_gv_ud_send)(unsafe.Pointer(unsafe.SliceData(wrs))))
	if r != 0 {
		return os.NewSyscallError("ibv_post_send", errno(r))
	}
	return nil
}

// DestroyUD destroys a QP of CreateUDQP.
func (qp *QP) DestroyUD() error {
	if r := C.ibv_destroy_qp(qp.qp); r != 0 {
		return os.NewSyscallError("ibv_destroy_qp", syscall.Errno(r))
	}
	return nil
}

// AH is an address handle: where a datagram goes.
type AH struct{ ah *C.struct_ibv_ah }

// CreateAH creates an address handle on pd from attr, the bytes of a
// struct ibv_ah_attr (as rdma_cm's service ID resolution returns it, see
// rdmacm.UDParam).
func (pd *PD) CreateAH(attr []byte) (*AH, error) {
	if len(attr) != C.sizeof_struct_ibv_ah_attr {
		return nil, os.NewSyscallError("ibv_create_ah", syscall.EINVAL)
	}
	ah, err := C.ibv_create_ah(pd.p, (*C.struct_ibv_ah_attr)(unsafe.Pointer(&attr[0])))
	if ah == nil {
		if err == nil {
			err = syscall.ENOMEM
		}
		return nil, os.NewSyscallError("ibv_create_ah", err)
	}
	return &AH{ah: ah}, nil
}

// Handle is what a UDSendWR names the address handle by.
func (ah *AH) Handle() uintptr { return uintptr(unsafe.Pointer(ah.ah)) }

// Destroy destroys the address handle; no send that uses it may be
// outstanding.
func (ah *AH) Destroy() error {
	if r := C.ibv_destroy_ah(ah.ah); r != 0 {
		return os.NewSyscallError("ibv_destroy_ah", syscall.Errno(r))
	}
	return nil
}

// AttachMcast attaches the QP to the multicast group whose address handle
// attributes (a struct ibv_ah_attr, as a multicast join returns it) are
// attr: datagrams to the group reach it. detach undoes it.
func (qp *QP) AttachMcast(attr []byte, detach bool) error {
	name, d := "ibv_attach_mcast", C.int(0)
	if detach {
		name, d = "ibv_detach_mcast", 1
	}
	if len(attr) != C.sizeof_struct_ibv_ah_attr {
		return os.NewSyscallError(name, syscall.EINVAL)
	}
	if r := C.gv_mcast(qp.qp, (*C.struct_ibv_ah_attr)(unsafe.Pointer(&attr[0])), d); r != 0 {
		return os.NewSyscallError(name, syscall.Errno(r))
	}
	return nil
}
