//go:build faultinject && linux && cgo

package faults

/*
#cgo LDFLAGS: -rdynamic
#include "faults.h"
*/
import "C"

import (
	"fmt"
	"syscall"
)

// Kinds of counted calls: the top byte of a Call's code.
const (
	KindUCMA   = C.GVF_UCMA   // a librdmacm command (a write to rdma_cm)
	KindUVerbs = C.GVF_UVERBS // a libibverbs command written to uverbsN
	KindIoctl  = C.GVF_IOCTL  // a libibverbs command as an ioctl on uverbsN
	KindEvent  = C.GVF_EVENT  // a read of a completion or asynchronous event
)

// Call is one counted call: its kind and its command.
type Call uint32

// Kind is the call's kind (KindUCMA, ...).
func (c Call) Kind() int { return int(c >> 24) }

// Arm starts counting calls afresh; the calls numbered at to at+n-1
// (1-based) fail with errno. at 0 only counts. only, when not zero,
// restricts counting (and failing) to the calls of that kind, or of that
// exact code.
func Arm(at, n int, errno syscall.Errno, only Call) {
	C.gvf_arm(C.long(at), C.long(n), C.int(errno), C.int(only))
}

// Disarm stops counting and failing; it returns the calls counted.
func Disarm() int { return int(C.gvf_disarm()) }

// Calls is how many calls were counted since Arm.
func Calls() int { return int(C.gvf_calls()) }

// Failed is how many calls were made to fail since Arm.
func Failed() int { return int(C.gvf_failed()) }

// Trace returns the first calls counted since Arm, in order (at most
// 65,536 of them).
func Trace() []Call {
	n := min(Calls(), C.GVF_TRACE)
	t := make([]Call, n)
	for i := range t {
		t[i] = Call(C.gvf_trace(C.long(i)))
	}
	return t
}

// UCMA is the code of a librdmacm command, for Arm's only.
func UCMA(cmd int) Call { return Call(KindUCMA<<24 | cmd) }

// Event is the code of an event read, for Arm's only.
func Event() Call { return Call(KindEvent << 24) }

// UVerbs is the code of a libibverbs command written, for Arm's only.
func UVerbs(cmd int) Call { return Call(KindUVerbs<<24 | cmd) }

// String names the call as the kernel interface does.
func (c Call) String() string {
	switch c.Kind() {
	case KindUCMA:
		return "rdma_cm " + name(ucmaCmds, int(c&0xffff))
	case KindUVerbs:
		return "uverbs " + name(uverbsCmds, int(c&0xff))
	case KindIoctl:
		obj, method := int(c>>8&0xff), int(c&0xff)
		return fmt.Sprintf("uverbs ioctl %s.%d", name(ioctlObjects, obj), method)
	case KindEvent:
		return "event read"
	}
	return fmt.Sprintf("call %#x", uint32(c))
}

func name(names []string, i int) string {
	if i < len(names) && names[i] != "" {
		return names[i]
	}
	return fmt.Sprint(i)
}

// The command numbers of rdma/rdma_user_cm.h and rdma/ib_user_verbs.h.
var ucmaCmds = []string{"CREATE_ID", "DESTROY_ID", "BIND_IP", "RESOLVE_IP", "RESOLVE_ROUTE", "QUERY_ROUTE",
	"CONNECT", "LISTEN", "ACCEPT", "REJECT", "DISCONNECT", "INIT_QP_ATTR", "GET_EVENT", "GET_OPTION",
	"SET_OPTION", "NOTIFY", "JOIN_IP_MCAST", "LEAVE_MCAST", "MIGRATE_ID", "QUERY", "BIND", "RESOLVE_ADDR",
	"JOIN_MCAST"}

var uverbsCmds = []string{"GET_CONTEXT", "QUERY_DEVICE", "QUERY_PORT", "ALLOC_PD", "DEALLOC_PD", "CREATE_AH",
	"MODIFY_AH", "QUERY_AH", "DESTROY_AH", "REG_MR", "REG_SMR", "REREG_MR", "QUERY_MR", "DEREG_MR",
	"ALLOC_MW", "BIND_MW", "DEALLOC_MW", "CREATE_COMP_CHANNEL", "CREATE_CQ", "RESIZE_CQ", "DESTROY_CQ",
	"POLL_CQ", "PEEK_CQ", "REQ_NOTIFY_CQ", "CREATE_QP", "QUERY_QP", "MODIFY_QP", "DESTROY_QP",
	"POST_SEND", "POST_RECV", "ATTACH_MCAST", "DETACH_MCAST", "CREATE_SRQ", "MODIFY_SRQ", "QUERY_SRQ",
	"DESTROY_SRQ", "POST_SRQ_RECV", "OPEN_XRCD", "CLOSE_XRCD", "CREATE_XSRQ", "OPEN_QP"}

var ioctlObjects = []string{"DEVICE", "PD", "COMP_CHANNEL", "CQ", "QP", "SRQ", "AH", "MR", "MW", "FLOW",
	"XRCD", "RWQ_IND_TBL", "WQ", "FLOW_ACTION", "DM", "COUNTERS", "ASYNC_EVENT"}
