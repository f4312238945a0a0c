//go:build linux && cgo

// Package rdmacm is a thin cgo layer over librdmacm: one Go type per C
// object, errors that name the call and carry errno. Policy (what to do with
// an event, when to tear down) lives in the root package.
package rdmacm

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

// gv_event is the part of an rdma_cm_event the Go side needs, copied out so
// the event can be acknowledged before it is dispatched: rdma_destroy_id
// blocks until every event of its id is acknowledged, so holding events
// while running Go handlers would invite deadlocks.
struct gv_event {
	int type;
	int status;
	struct rdma_cm_id *id;
	uintptr_t handle;        // id->context
	uintptr_t listen_handle; // listen_id->context, for connect requests
	uint8_t private_len;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t private_data[64];
	// For an established UD id (rdma_cm's service ID resolution): where
	// its datagrams go.
	int ud;
	uint32_t ud_qp_num;
	uint32_t ud_qkey;
	struct ibv_ah_attr ah_attr;
};

// gv_get_event fetches one event, copies it and acknowledges it.
// Returns 0, or -1 with errno (EAGAIN when the channel is empty).
static int gv_get_event(struct rdma_event_channel *ch, struct gv_event *out) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		return -1;
	memset(out, 0, sizeof(*out));
	out->type = ev->event;
	out->status = ev->status;
	out->id = ev->id;
	out->handle = (uintptr_t)ev->id->context;
	if (ev->listen_id)
		out->listen_handle = (uintptr_t)ev->listen_id->context;
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ||
	    ev->event == RDMA_CM_EVENT_ESTABLISHED ||
	    ev->event == RDMA_CM_EVENT_REJECTED ||
	    ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE) {
		uint8_t n = ev->param.conn.private_data_len;
		if (n > sizeof(out->private_data))
			n = sizeof(out->private_data);
		if (ev->param.conn.private_data && n)
			memcpy(out->private_data, ev->param.conn.private_data, n);
		else
			n = 0;
		out->private_len = n;
		out->responder_resources = ev->param.conn.responder_resources;
		out->initiator_depth = ev->param.conn.initiator_depth;
	}
	if ((ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id->ps == RDMA_PS_UDP) || ev->event == RDMA_CM_EVENT_MULTICAST_JOIN) {
		out->ud = 1;
		out->ud_qp_num = ev->param.ud.qp_num;
		out->ud_qkey = ev->param.ud.qkey;
		out->ah_attr = ev->param.ud.ah_attr;
	}
	rdma_ack_cm_event(ev);
	return 0;
}

static int gv_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, uintptr_t handle, int udp) {
	return rdma_create_id(ch, id, (void *)handle, udp ? RDMA_PS_UDP : RDMA_PS_TCP);
}

static uint8_t gv_port_num(struct rdma_cm_id *id) { return id->port_num; }

static void gv_set_handle(struct rdma_cm_id *id, uintptr_t handle) { id->context = (void *)handle; }

static void gv_sockaddr(struct sockaddr_storage *ss, int family, const uint8_t *ip, uint16_t port) {
	memset(ss, 0, sizeof(*ss));
	if (family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		s->sin6_port = htons(port);
		memcpy(&s->sin6_addr, ip, 16);
	} else {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip, 4);
	}
}

static int gv_bind(struct rdma_cm_id *id, int family, const uint8_t *ip, uint16_t port) {
	struct sockaddr_storage ss;
	gv_sockaddr(&ss, family, ip, port);
	return rdma_bind_addr(id, (struct sockaddr *)&ss);
}

static int gv_join_multicast(struct rdma_cm_id *id, int family, const uint8_t *ip, int leave) {
	struct sockaddr_storage ss;
	gv_sockaddr(&ss, family, ip, 0);
	if (leave)
		return rdma_leave_multicast(id, (struct sockaddr *)&ss);
	return rdma_join_multicast(id, (struct sockaddr *)&ss, NULL);
}

static int gv_resolve_addr(struct rdma_cm_id *id, int sfamily, const uint8_t *sip,
                           int dfamily, const uint8_t *dip, uint16_t dport, int timeout_ms) {
	struct sockaddr_storage src, dst;
	gv_sockaddr(&dst, dfamily, dip, dport);
	if (sfamily) {
		gv_sockaddr(&src, sfamily, sip, 0);
		return rdma_resolve_addr(id, (struct sockaddr *)&src, (struct sockaddr *)&dst, timeout_ms);
	}
	return rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, timeout_ms);
}

// gv_addr reads the local (which == 0) or peer address of id.
static int gv_addr(struct rdma_cm_id *id, int which, uint8_t *ip, uint16_t *port) {
	struct sockaddr *sa = which ? rdma_get_peer_addr(id) : rdma_get_local_addr(id);
	if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)sa;
		memcpy(ip, &s->sin6_addr, 16);
		*port = ntohs(s->sin6_port);
		return AF_INET6;
	}
	if (sa->sa_family == AF_INET) {
		struct sockaddr_in *s = (struct sockaddr_in *)sa;
		memcpy(ip, &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
		return AF_INET;
	}
	return 0;
}

// gv_connect connects (or, with accept, accepts). qp_num names the QP of
// an id that has none (0 otherwise): librdmacm completes the handshake
// (the RTU) from rdma_get_cm_event only for ids with a QP, so such a
// request stays half-open unless the caller calls rdma_establish.
// initiator is the RDMA READs and atomics the QP may have outstanding,
// responder how many of the peer's it serves at once.
static int gv_connect(struct rdma_cm_id *id, const void *pd, uint8_t pdlen, int accept, uint32_t qp_num,
                      uint8_t initiator, uint8_t responder) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = pd;
	p.private_data_len = pdlen;
	p.qp_num = qp_num;
	// With no responder resources the QP refuses a peer's READ or atomic
	// whatever memory it names; with some, the memory regions decide
	// (rdma_cm grants the QP remote read and atomic access then).
	p.responder_resources = responder;
	p.initiator_depth = initiator;
	// Both QPs take the dialer's retry count: the most a hardware NIC
	// allows, so that a partition of several ACK timeouts (see
	// SetAckTimeout) is survived. Soft-RoCE (rxe) takes 7 to mean "retry
	// forever"; the library's keepalive bounds the wait there.
	p.retry_count = 7;
	// Credits guarantee a posted receive for every SEND, so RNR should never
	// happen; retry anyway rather than fail hard if a peer is slow to post,
	// but never forever (7 is infinite).
	p.rnr_retry_count = 6;
	return accept ? rdma_accept(id, &p) : rdma_connect(id, &p);
}

// gv_rc_attr is the attributes of an RC QP on cq with send_wr and recv_wr
// work requests of one scatter entry each, no inline data.
static struct ibv_qp_init_attr gv_rc_attr(void *cq, uint32_t send_wr, uint32_t recv_wr) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = send_wr;
	a.cap.max_recv_wr = recv_wr;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	return a;
}

static int gv_create_qp(struct rdma_cm_id *id, void *pd, void *cq, uint32_t send_wr,
                        uint32_t recv_wr, uint32_t inline_data, uint32_t *max_inline) {
	// Some providers refuse an inline size they cannot honour (siw takes
	// at most 80 bytes): retry with less, then without, rather than fail
	// the connection. The sizes tried are fixed: a failed attempt may
	// have written the provider's own figures into the attributes (when
	// the QP was created and librdmacm then failed to set it up). 8 is
	// the message header that a transport without immediate data (iWARP)
	// sends inline: the least such a connection can work with.
	const uint32_t sizes[] = {inline_data, 80, 64, 8, 0};
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		if (i > 0 && sizes[i] >= inline_data)
			continue;
		struct ibv_qp_init_attr a = gv_rc_attr(cq, send_wr, recv_wr);
		a.cap.max_inline_data = sizes[i];
		if (rdma_create_qp(id, pd, &a) == 0) {
			*max_inline = a.cap.max_inline_data;
			return 0;
		}
		if (errno != EINVAL)
			return -1;
	}
	return -1;
}

// gv_create_own_qp creates an RC QP that is not the id's, so librdmacm
// leaves its states to the caller, and moves it to INIT. Returns NULL with
// errno on failure.
static struct ibv_qp *gv_create_own_qp(struct rdma_cm_id *id, void *pd, void *cq, uint32_t send_wr, uint32_t recv_wr) {
	struct ibv_qp_init_attr a = gv_rc_attr(cq, send_wr, recv_wr);
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	if (!qp)
		return NULL;
	struct ibv_qp_attr attr;
	int mask, r;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	if (rdma_init_qp_attr(id, &attr, &mask)) {
		r = errno;
	} else {
		// Before the request, the CM's INIT attributes grant no remote
		// access; the peer's RDMA WRITEs need it.
		attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
		r = ibv_modify_qp(qp, &attr, mask | IBV_QP_ACCESS_FLAGS);
	}
	if (r) {
		ibv_destroy_qp(qp);
		errno = r;
		return NULL;
	}
	return qp;
}

// gv_move_qp moves qp to state with the attributes rdma_cm gives for the
// id. Returns 0, or -1 with errno.
static int gv_move_qp(struct rdma_cm_id *id, struct ibv_qp *qp, enum ibv_qp_state state) {
	struct ibv_qp_attr attr;
	int mask, r;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = state;
	if (rdma_init_qp_attr(id, &attr, &mask))
		return -1;
	if ((r = ibv_modify_qp(qp, &attr, mask))) {
		errno = r;
		return -1;
	}
	return 0;
}

// gv_establish_own_qp moves a QP of gv_create_own_qp to RTR and RTS as the
// connect response says, but with max_rd_atomic RDMA READs and atomics
// outstanding whatever the peer granted, completes the handshake
// (rdma_establish) and makes the QP the id's (rdma_disconnect then moves
// it to the error state). Returns 0, or -1 with errno.
static int gv_establish_own_qp(struct rdma_cm_id *id, struct ibv_qp *qp, int max_rd_atomic) {
	struct ibv_qp_attr attr;
	int mask, r;
	if (gv_move_qp(id, qp, IBV_QPS_RTR))
		return -1;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	if (rdma_init_qp_attr(id, &attr, &mask))
		return -1;
	attr.max_rd_atomic = max_rd_atomic;
	mask |= IBV_QP_MAX_QP_RD_ATOMIC;
	if ((r = ibv_modify_qp(qp, &attr, mask))) {
		errno = r;
		return -1;
	}
	if (rdma_establish(id))
		return -1;
	id->qp = qp;
	return 0;
}

// gv_destroy_qp destroys the id's QP, keeping it on the id if that fails
// (rdma_destroy_qp forgets it either way, leaking it on failure).
static int gv_destroy_qp(struct rdma_cm_id *id) {
	if (!id->qp)
		return 0;
	int r = ibv_destroy_qp(id->qp);
	if (r)
		return r;
	id->qp = NULL;
	return 0;
}

// gv_adopt_qp makes qp, a QP of the id's device in the RESET state (one
// kept from an earlier connection, see gv_release_qp), the id's, as
// rdma_create_qp would have made a new one: moved to INIT with the
// attributes rdma_cm gives for the id (its port and partition), so that
// librdmacm moves it through RTR and RTS in rdma_accept, or when the
// connect response comes, and to the error state on rdma_disconnect.
// Returns 0, or -1 with errno.
static int gv_adopt_qp(struct rdma_cm_id *id, struct ibv_qp *qp) {
	if (id->qp) {
		errno = EINVAL;
		return -1;
	}
	if (gv_move_qp(id, qp, IBV_QPS_INIT))
		return -1;
	id->pd = qp->pd;
	id->qp = qp;
	return 0;
}

// gv_release_qp takes the id's QP from it and moves it to the RESET state,
// for another id to adopt. The QP is the caller's from here on, reset or
// not; the return is 0 or an errno.
static int gv_release_qp(struct rdma_cm_id *id) {
	struct ibv_qp *qp = id->qp;
	if (!qp)
		return EINVAL;
	id->qp = NULL;
	struct ibv_qp_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RESET;
	return ibv_modify_qp(qp, &attr, IBV_QP_STATE);
}

// gv_error_qp moves the id's QP to the error state, as rdma_disconnect
// does before it tells the peer; the return is 0 or an errno.
static int gv_error_qp(struct rdma_cm_id *id) {
	if (!id->qp)
		return 0;
	struct ibv_qp_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(id->qp, &attr, IBV_QP_STATE);
}

static int gv_set_ack_timeout(struct rdma_cm_id *id, uint8_t t) {
	return rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &t, sizeof(t));
}

static void *gv_qp(struct rdma_cm_id *id) { return id->qp; }
static void *gv_verbs(struct rdma_cm_id *id) { return id->verbs; }
static int gv_channel_fd(struct rdma_event_channel *ch) { return ch->fd; }

// gv_rescan returns how many devices librdmacm finds now, or -1 with errno
// (ENODEV when there is none).
static int gv_rescan(void) {
	int n = 0;
	struct ibv_context **l = rdma_get_devices(&n);
	if (!l)
		return -1;
	rdma_free_devices(l);
	return n;
}

// gv_only_device returns the context of the host's one RDMA device, or
// NULL with *n the count of devices when there are none or several.
static struct ibv_context *gv_only_device(int *n) {
	*n = 0;
	struct ibv_context **l = rdma_get_devices(n);
	if (!l)
		return NULL;
	struct ibv_context *c = *n == 1 ? l[0] : NULL;
	rdma_free_devices(l);
	return c;
}
*/
import "C"

import (
	"net/netip"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/goverbs/rdma/internal/pollfd"
)

// Supported reports whether the real librdmacm is linked in.
const Supported = true

// Every constant of types.go equals librdmacm's (and the kernel's) own.
var (
	_ [EventAddrResolved - C.RDMA_CM_EVENT_ADDR_RESOLVED]struct{}
	_ [C.RDMA_CM_EVENT_ADDR_RESOLVED - EventAddrResolved]struct{}
	_ [EventAddrError - C.RDMA_CM_EVENT_ADDR_ERROR]struct{}
	_ [C.RDMA_CM_EVENT_ADDR_ERROR - EventAddrError]struct{}
	_ [EventRouteResolved - C.RDMA_CM_EVENT_ROUTE_RESOLVED]struct{}
	_ [C.RDMA_CM_EVENT_ROUTE_RESOLVED - EventRouteResolved]struct{}
	_ [EventRouteError - C.RDMA_CM_EVENT_ROUTE_ERROR]struct{}
	_ [C.RDMA_CM_EVENT_ROUTE_ERROR - EventRouteError]struct{}
	_ [EventConnectRequest - C.RDMA_CM_EVENT_CONNECT_REQUEST]struct{}
	_ [C.RDMA_CM_EVENT_CONNECT_REQUEST - EventConnectRequest]struct{}
	_ [EventConnectResponse - C.RDMA_CM_EVENT_CONNECT_RESPONSE]struct{}
	_ [C.RDMA_CM_EVENT_CONNECT_RESPONSE - EventConnectResponse]struct{}
	_ [EventConnectError - C.RDMA_CM_EVENT_CONNECT_ERROR]struct{}
	_ [C.RDMA_CM_EVENT_CONNECT_ERROR - EventConnectError]struct{}
	_ [EventUnreachable - C.RDMA_CM_EVENT_UNREACHABLE]struct{}
	_ [C.RDMA_CM_EVENT_UNREACHABLE - EventUnreachable]struct{}
	_ [EventRejected - C.RDMA_CM_EVENT_REJECTED]struct{}
	_ [C.RDMA_CM_EVENT_REJECTED - EventRejected]struct{}
	_ [EventEstablished - C.RDMA_CM_EVENT_ESTABLISHED]struct{}
	_ [C.RDMA_CM_EVENT_ESTABLISHED - EventEstablished]struct{}
	_ [EventDisconnected - C.RDMA_CM_EVENT_DISCONNECTED]struct{}
	_ [C.RDMA_CM_EVENT_DISCONNECTED - EventDisconnected]struct{}
	_ [EventDeviceRemoval - C.RDMA_CM_EVENT_DEVICE_REMOVAL]struct{}
	_ [C.RDMA_CM_EVENT_DEVICE_REMOVAL - EventDeviceRemoval]struct{}
	_ [EventMulticastJoin - C.RDMA_CM_EVENT_MULTICAST_JOIN]struct{}
	_ [C.RDMA_CM_EVENT_MULTICAST_JOIN - EventMulticastJoin]struct{}
	_ [EventMulticastError - C.RDMA_CM_EVENT_MULTICAST_ERROR]struct{}
	_ [C.RDMA_CM_EVENT_MULTICAST_ERROR - EventMulticastError]struct{}
	_ [EventAddrChange - C.RDMA_CM_EVENT_ADDR_CHANGE]struct{}
	_ [C.RDMA_CM_EVENT_ADDR_CHANGE - EventAddrChange]struct{}
	_ [EventTimewaitExit - C.RDMA_CM_EVENT_TIMEWAIT_EXIT]struct{}
	_ [C.RDMA_CM_EVENT_TIMEWAIT_EXIT - EventTimewaitExit]struct{}
	_ [AHAttrSize - C.sizeof_struct_ibv_ah_attr]struct{}
	_ [C.sizeof_struct_ibv_ah_attr - AHAttrSize]struct{}
)

// EventChannel is an rdma_event_channel driven through the netpoller.
type EventChannel struct {
	ch *C.struct_rdma_event_channel
	fd *pollfd.FD
	ev C.struct_gv_event
	// getMu is held while rdma_get_cm_event runs (see Quiet).
	getMu sync.Mutex
}

// Quiet runs f while no event is being fetched. rdma_get_cm_event does
// more than read: for a connect response it moves the id's QP to RTR and
// RTS and sends the RTU, for a reject it moves the QP to the error state,
// reading id->qp each time. Destroying a QP that an event of its id may
// still be processed for (a Dial cancelled while its request is answered)
// must therefore run inside Quiet, or librdmacm may use it after it was
// freed (a crash at address 0 inside rdma_get_cm_event). Events are
// fetched without blocking, so Quiet waits for one event's processing at
// most.
func (c *EventChannel) Quiet(f func()) {
	c.getMu.Lock()
	defer c.getMu.Unlock()
	f()
}

// NewEventChannel creates an event channel whose fd is nonblocking and
// registered with the netpoller.
func NewEventChannel() (*EventChannel, error) {
	ch, err := C.rdma_create_event_channel()
	if ch == nil {
		return nil, callError("rdma_create_event_channel", err)
	}
	fd, err := pollfd.New(int(C.gv_channel_fd(ch)), "rdma_cm")
	if err != nil {
		C.rdma_destroy_event_channel(ch)
		return nil, err
	}
	return &EventChannel{ch: ch, fd: fd}, nil
}

// Run parks until events arrive and passes each to handle, acknowledged,
// until Interrupt is called; then it returns. Only one goroutine may Run.
func (c *EventChannel) Run(handle func(Event)) error {
	return c.fd.Drain(func() error {
		c.getMu.Lock()
		r, err := C.gv_get_event(c.ch, &c.ev)
		c.getMu.Unlock()
		if r != 0 {
			if err == syscall.EAGAIN || err == syscall.EINTR {
				return err
			}
			return os.NewSyscallError("rdma_get_cm_event", err)
		}
		handle(c.copyEvent())
		return nil
	})
}

func (c *EventChannel) copyEvent() Event {
	e := &c.ev
	ev := Event{
		Type:         EventType(e._type),
		Status:       int(e.status),
		Handle:       uintptr(e.handle),
		ListenHandle: uintptr(e.listen_handle),
		ID:           &ID{id: e.id},
		Initiator:    uint8(e.initiator_depth),
		Responder:    uint8(e.responder_resources),
	}
	if n := int(e.private_len); n > 0 {
		ev.PrivateData = C.GoBytes(unsafe.Pointer(&e.private_data[0]), C.int(n))
	}
	if e.ud != 0 {
		ud := &UDParam{QPNum: uint32(e.ud_qp_num), QKey: uint32(e.ud_qkey)}
		copy(ud.AHAttr[:], unsafe.Slice((*byte)(unsafe.Pointer(&e.ah_attr)), len(ud.AHAttr)))
		ev.UD = ud
	}
	return ev
}

// Interrupt makes Run return.
func (c *EventChannel) Interrupt() { c.fd.Close() }

// Destroy releases the channel; every id on it must be destroyed first.
func (c *EventChannel) Destroy() { C.rdma_destroy_event_channel(c.ch) }

// Rescan makes librdmacm look at the host's devices again and returns how
// many there are (rdma_get_devices). librdmacm closes the context of a
// device that went away only once a rescan has found it missing and no id
// uses it any more; with no device left at all it never does (it stops at
// the error), and the caller must release the context's files itself.
func Rescan() (int, error) {
	n, err := C.gv_rescan()
	if n < 0 {
		return 0, os.NewSyscallError("rdma_get_devices", err)
	}
	return int(n), nil
}

// OnlyDevice returns the ibv_context of the host's only RDMA device (as
// librdmacm opened it, the same every id of it has), or nil and the number
// of devices when there are none or several.
func OnlyDevice() (unsafe.Pointer, int) {
	var n C.int
	c := C.gv_only_device(&n)
	return unsafe.Pointer(c), int(n)
}

// ID is an rdma_cm_id.
type ID struct{ id *C.struct_rdma_cm_id }

// NewID creates an RC (RDMA_PS_TCP) id on ch whose events carry handle.
func NewID(ch *EventChannel, handle uintptr) (*ID, error) { return newID(ch, handle, 0) }

// NewUDPID creates an id of the UDP port space (RDMA_PS_UDP), for
// datagrams: bound and listening, it answers service ID resolutions of
// its port; connected, it resolves a peer's.
func NewUDPID(ch *EventChannel, handle uintptr) (*ID, error) { return newID(ch, handle, 1) }

func newID(ch *EventChannel, handle uintptr, udp C.int) (*ID, error) {
	var id *C.struct_rdma_cm_id
	if r, err := C.gv_create_id(ch.ch, &id, C.uintptr_t(handle), udp); r != 0 {
		return nil, os.NewSyscallError("rdma_create_id", err)
	}
	return &ID{id: id}, nil
}

// JoinMulticast joins the multicast group at group (rdma_join_multicast)
// on the bound id's device; the outcome is a multicast join event, whose
// UD says where datagrams to the group go (QP number 0xffffff), or a
// multicast error event. The caller attaches its QP to the group.
func (id *ID) JoinMulticast(group netip.Addr) error {
	fam, ip := ipBytes(group)
	if r, err := C.gv_join_multicast(id.id, fam, (*C.uint8_t)(&ip[0]), 0); r != 0 {
		return os.NewSyscallError("rdma_join_multicast", err)
	}
	return nil
}

// LeaveMulticast leaves a group JoinMulticast joined.
func (id *ID) LeaveMulticast(group netip.Addr) error {
	fam, ip := ipBytes(group)
	if r, err := C.gv_join_multicast(id.id, fam, (*C.uint8_t)(&ip[0]), 1); r != 0 {
		return os.NewSyscallError("rdma_leave_multicast", err)
	}
	return nil
}

// PortNum is the device port the id is bound to (0 while unbound).
func (id *ID) PortNum() uint8 { return uint8(C.gv_port_num(id.id)) }

// AcceptUD answers a service ID resolution (a UDP port space id's connect
// request) with qpNum, the QP that receives the port's datagrams, and
// rdma_cm's Q_Key for the port space.
func (id *ID) AcceptUD(qpNum uint32) error { return id.connect(nil, 1, qpNum, "rdma_accept") }

// ConnectUD starts the service ID resolution of a UDP port space id whose
// route is resolved; the outcome is its established event (carrying
// Event.UD), or an unreachable or rejected one.
func (id *ID) ConnectUD() error { return id.connect(nil, 0, 0, "rdma_connect") }

// SetHandle changes the handle the id's events carry (for ids born from
// connect requests, which inherit the listener's).
func (id *ID) SetHandle(h uintptr) { C.gv_set_handle(id.id, C.uintptr_t(h)) }

func ipBytes(a netip.Addr) (C.int, [16]byte) {
	var b [16]byte
	if a.Is4() {
		v := a.As4()
		copy(b[:], v[:])
		return C.AF_INET, b
	}
	b = a.As16()
	return C.AF_INET6, b
}

// Bind binds the id to a local address (rdma_bind_addr).
func (id *ID) Bind(ap netip.AddrPort) error {
	fam, ip := ipBytes(ap.Addr())
	if r, err := C.gv_bind(id.id, fam, (*C.uint8_t)(&ip[0]), C.uint16_t(ap.Port())); r != 0 {
		return os.NewSyscallError("rdma_bind_addr", err)
	}
	return nil
}

// Listen starts listening (rdma_listen).
func (id *ID) Listen(backlog int) error {
	if r, err := C.rdma_listen(id.id, C.int(backlog)); r != 0 {
		return os.NewSyscallError("rdma_listen", err)
	}
	return nil
}

// ResolveAddr starts address resolution; src may be the zero Addr.
func (id *ID) ResolveAddr(src netip.Addr, dst netip.AddrPort, timeoutMs int) error {
	var sfam C.int
	var sip [16]byte
	if src.IsValid() {
		sfam, sip = ipBytes(src)
	}
	dfam, dip := ipBytes(dst.Addr())
	if r, err := C.gv_resolve_addr(id.id, sfam, (*C.uint8_t)(&sip[0]), dfam, (*C.uint8_t)(&dip[0]),
		C.uint16_t(dst.Port()), C.int(timeoutMs)); r != 0 {
		return os.NewSyscallError("rdma_resolve_addr", err)
	}
	return nil
}

// ResolveRoute starts route resolution.
func (id *ID) ResolveRoute(timeoutMs int) error {
	if r, err := C.rdma_resolve_route(id.id, C.int(timeoutMs)); r != 0 {
		return os.NewSyscallError("rdma_resolve_route", err)
	}
	return nil
}

func (id *ID) connect(private []byte, accept C.int, qpNum uint32, name string) error {
	return id.connectDepth(private, accept, qpNum, 0, 0, name)
}

// ConnectRead is Connect for a QP that issues up to initiator RDMA READs
// at once and serves up to responder of the peer's (rdma_conn_param's
// initiator_depth and responder_resources).
func (id *ID) ConnectRead(private []byte, initiator, responder uint8) error {
	return id.connectDepth(private, 0, 0, initiator, responder, "rdma_connect")
}

// AcceptRead is Accept with RDMA READ depths as ConnectRead's; neither
// may exceed what the request offered (Event.Initiator, Event.Responder).
func (id *ID) AcceptRead(private []byte, initiator, responder uint8) error {
	return id.connectDepth(private, 1, 0, initiator, responder, "rdma_accept")
}

func (id *ID) connectDepth(private []byte, accept C.int, qpNum uint32, initiator, responder uint8, name string) error {
	var p unsafe.Pointer
	if len(private) > 0 {
		p = C.CBytes(private)
		defer C.free(p)
	}
	if r, err := C.gv_connect(id.id, p, C.uint8_t(len(private)), accept, C.uint32_t(qpNum), C.uint8_t(initiator), C.uint8_t(responder)); r != 0 {
		return os.NewSyscallError(name, err)
	}
	return nil
}

// SetAckTimeout sets the local ACK timeout of the id's QP, 4.096 µs × 2^t
// (rdma_set_option RDMA_OPTION_ID_ACK_TIMEOUT): how long the NIC waits for
// an acknowledgement before it retransmits. It takes effect when the QP
// becomes ready to send, so it must be set before Connect (after
// ResolveRoute, so that it does not change the route's packet lifetime)
// or Accept; each side sets its own.
func (id *ID) SetAckTimeout(t uint8) error {
	if r, err := C.gv_set_ack_timeout(id.id, C.uint8_t(t)); r != 0 {
		return os.NewSyscallError("rdma_set_option", err)
	}
	return nil
}

// Connect sends a connection request carrying private (rdma_connect).
func (id *ID) Connect(private []byte) error { return id.connect(private, 0, 0, "rdma_connect") }

// Accept accepts a connection request, replying with private (rdma_accept).
func (id *ID) Accept(private []byte) error { return id.connect(private, 1, 0, "rdma_accept") }

// Reject refuses a connection request (rdma_reject).
func (id *ID) Reject(private []byte) error {
	var p unsafe.Pointer
	if len(private) > 0 {
		p = C.CBytes(private)
		defer C.free(p)
	}
	if r, err := C.rdma_reject(id.id, p, C.uint8_t(len(private))); r != 0 {
		return os.NewSyscallError("rdma_reject", err)
	}
	return nil
}

// Disconnect moves the QP to the error state and tells the peer
// (rdma_disconnect).
func (id *ID) Disconnect() error {
	if r, err := C.rdma_disconnect(id.id); r != 0 {
		return os.NewSyscallError("rdma_disconnect", err)
	}
	return nil
}

// ErrorQP moves the id's QP to the error state without telling the peer:
// its work requests flush, as after Disconnect, and the connection
// manager's exchange is left for a later Disconnect or Destroy.
func (id *ID) ErrorQP() error {
	if r := C.gv_error_qp(id.id); r != 0 {
		return os.NewSyscallError("ibv_modify_qp", syscall.Errno(r))
	}
	return nil
}

// CreateQP creates an RC QP on the id using pd and cq (C pointers from
// package ibv) for both directions, and returns the ibv_qp pointer and the
// inline size the provider granted.
func (id *ID) CreateQP(pd, cq unsafe.Pointer, sendWR, recvWR, inline int) (unsafe.Pointer, int, error) {
	var maxInline C.uint32_t
	if r, err := C.gv_create_qp(id.id, pd, cq, C.uint32_t(sendWR), C.uint32_t(recvWR),
		C.uint32_t(inline), &maxInline); r != 0 {
		return nil, 0, os.NewSyscallError("rdma_create_qp", err)
	}
	return C.gv_qp(id.id), int(maxInline), nil
}

// DestroyQP destroys the id's QP (ibv_destroy_qp).
func (id *ID) DestroyQP() error {
	if r := C.gv_destroy_qp(id.id); r != 0 {
		return os.NewSyscallError("ibv_destroy_qp", syscall.Errno(r))
	}
	return nil
}

// AdoptQP makes qp, a reset QP of the id's device that ReleaseQP gave up,
// the id's, as CreateQP would have made a new one: in the INIT state, and
// moved through the rest by the handshake.
func (id *ID) AdoptQP(qp unsafe.Pointer) error {
	if r, err := C.gv_adopt_qp(id.id, (*C.struct_ibv_qp)(qp)); r != 0 {
		return os.NewSyscallError("ibv_modify_qp", err)
	}
	return nil
}

// ReleaseQP takes the id's QP from it and resets it (its work requests
// must all have completed: a reset drops those still queued without a
// completion). The QP is the caller's in either case, for AdoptQP or its
// destruction; the error says the reset failed.
func (id *ID) ReleaseQP() error {
	if r := C.gv_release_qp(id.id); r != 0 {
		return os.NewSyscallError("ibv_modify_qp", syscall.Errno(r))
	}
	return nil
}

// CreateOwnQP creates an RC QP on pd and cq, in the INIT state, that is not
// the id's: librdmacm does not move it through its states, so the caller
// may set what the handshake would not (EstablishOwnQP). It is for tests
// of peers that break the rules; connect with ConnectNoQP naming its
// number.
func (id *ID) CreateOwnQP(pd, cq unsafe.Pointer, sendWR, recvWR int) (unsafe.Pointer, error) {
	qp, err := C.gv_create_own_qp(id.id, pd, cq, C.uint32_t(sendWR), C.uint32_t(recvWR))
	if qp == nil {
		return nil, os.NewSyscallError("ibv_create_qp", err)
	}
	return unsafe.Pointer(qp), nil
}

// EstablishOwnQP, after the connect response, moves a QP of CreateOwnQP to
// RTS with maxRdAtomic RDMA READs and atomics outstanding (whatever the
// peer granted), completes the handshake and gives the QP to the id.
func (id *ID) EstablishOwnQP(qp unsafe.Pointer, maxRdAtomic int) error {
	if r, err := C.gv_establish_own_qp(id.id, (*C.struct_ibv_qp)(qp), C.int(maxRdAtomic)); r != 0 {
		return os.NewSyscallError("rdma_establish", err)
	}
	return nil
}

// DestroyOwnQP destroys a QP of CreateOwnQP that the id never took, or one
// that ReleaseQP took from an id.
func DestroyOwnQP(qp unsafe.Pointer) error {
	if r := C.ibv_destroy_qp((*C.struct_ibv_qp)(qp)); r != 0 {
		return os.NewSyscallError("ibv_destroy_qp", syscall.Errno(r))
	}
	return nil
}

// ConnectNoQP sends a connection request carrying private for an id that
// has no QP, naming qpNum as its QP (rdma_connect with the conn param's
// qp_num). The handshake then stays half-open: librdmacm sends no RTU for
// such an id, whatever its events.
func (id *ID) ConnectNoQP(private []byte, qpNum uint32) error {
	return id.connect(private, 0, qpNum, "rdma_connect")
}

// Destroy destroys the id (rdma_destroy_id). It blocks until every event of
// the id is acknowledged, so it must not run on the event goroutine while
// an event of this id is held.
func (id *ID) Destroy() error {
	if r, err := C.rdma_destroy_id(id.id); r != 0 {
		return os.NewSyscallError("rdma_destroy_id", err)
	}
	return nil
}

// Verbs returns the id's ibv_context pointer, or nil if unbound.
func (id *ID) Verbs() unsafe.Pointer { return C.gv_verbs(id.id) }

func (id *ID) addr(which C.int) netip.AddrPort {
	var ip [16]byte
	var port C.uint16_t
	switch C.gv_addr(id.id, which, (*C.uint8_t)(&ip[0]), &port) {
	case C.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[:4])), uint16(port))
	case C.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(ip).Unmap(), uint16(port))
	}
	return netip.AddrPort{}
}

// LocalAddr is the id's bound address.
func (id *ID) LocalAddr() netip.AddrPort { return id.addr(0) }

// PeerAddr is the connected or requesting peer's address.
func (id *ID) PeerAddr() netip.AddrPort { return id.addr(1) }

// cEventName is librdmacm's name of t, for the test that holds String to it.
func cEventName(t EventType) string {
	return C.GoString(C.rdma_event_str(C.enum_rdma_cm_event_type(t)))
}
