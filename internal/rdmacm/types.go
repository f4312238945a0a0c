package rdmacm

// The event types, the events and the reject statuses live in this file,
// without cgo, so that the root package's control path (what a dial, an
// accept or an established connection does with each event) can be built
// and tested over a fake id on any platform, as internal/ibv/types.go
// does for the data path. rdmacm.go checks at compile time that every
// constant equals librdmacm's own.

// EventType is an rdma_cm event type.
type EventType int

// Event types the library acts on (enum rdma_cm_event_type).
const (
	EventAddrResolved    EventType = 0  // RDMA_CM_EVENT_ADDR_RESOLVED
	EventAddrError       EventType = 1  // RDMA_CM_EVENT_ADDR_ERROR
	EventRouteResolved   EventType = 2  // RDMA_CM_EVENT_ROUTE_RESOLVED
	EventRouteError      EventType = 3  // RDMA_CM_EVENT_ROUTE_ERROR
	EventConnectRequest  EventType = 4  // RDMA_CM_EVENT_CONNECT_REQUEST
	EventConnectResponse EventType = 5  // RDMA_CM_EVENT_CONNECT_RESPONSE
	EventConnectError    EventType = 6  // RDMA_CM_EVENT_CONNECT_ERROR
	EventUnreachable     EventType = 7  // RDMA_CM_EVENT_UNREACHABLE
	EventRejected        EventType = 8  // RDMA_CM_EVENT_REJECTED
	EventEstablished     EventType = 9  // RDMA_CM_EVENT_ESTABLISHED
	EventDisconnected    EventType = 10 // RDMA_CM_EVENT_DISCONNECTED
	EventDeviceRemoval   EventType = 11 // RDMA_CM_EVENT_DEVICE_REMOVAL
	EventMulticastJoin   EventType = 12 // RDMA_CM_EVENT_MULTICAST_JOIN
	EventMulticastError  EventType = 13 // RDMA_CM_EVENT_MULTICAST_ERROR
	EventAddrChange      EventType = 14 // RDMA_CM_EVENT_ADDR_CHANGE
	EventTimewaitExit    EventType = 15 // RDMA_CM_EVENT_TIMEWAIT_EXIT
)

// eventNames are the names rdma_event_str gives.
var eventNames = [...]string{
	EventAddrResolved:    "RDMA_CM_EVENT_ADDR_RESOLVED",
	EventAddrError:       "RDMA_CM_EVENT_ADDR_ERROR",
	EventRouteResolved:   "RDMA_CM_EVENT_ROUTE_RESOLVED",
	EventRouteError:      "RDMA_CM_EVENT_ROUTE_ERROR",
	EventConnectRequest:  "RDMA_CM_EVENT_CONNECT_REQUEST",
	EventConnectResponse: "RDMA_CM_EVENT_CONNECT_RESPONSE",
	EventConnectError:    "RDMA_CM_EVENT_CONNECT_ERROR",
	EventUnreachable:     "RDMA_CM_EVENT_UNREACHABLE",
	EventRejected:        "RDMA_CM_EVENT_REJECTED",
	EventEstablished:     "RDMA_CM_EVENT_ESTABLISHED",
	EventDisconnected:    "RDMA_CM_EVENT_DISCONNECTED",
	EventDeviceRemoval:   "RDMA_CM_EVENT_DEVICE_REMOVAL",
	EventMulticastJoin:   "RDMA_CM_EVENT_MULTICAST_JOIN",
	EventMulticastError:  "RDMA_CM_EVENT_MULTICAST_ERROR",
	EventAddrChange:      "RDMA_CM_EVENT_ADDR_CHANGE",
	EventTimewaitExit:    "RDMA_CM_EVENT_TIMEWAIT_EXIT",
}

// String is the event type's name, as rdma_event_str gives it.
func (t EventType) String() string {
	if t >= 0 && int(t) < len(eventNames) {
		return eventNames[t]
	}
	return "UNKNOWN EVENT"
}

// Reject statuses: the reason an InfiniBand connection manager's reject
// carries (enum ib_cm_rej_reason, the kernel's), which a REJECTED event
// reports as its status when no private data explains the reject.
const (
	// RejectInvalidServiceID: no listener took the request
	// (IB_CM_REJ_INVALID_SERVICE_ID: rdma_cm found no listener on the
	// port).
	RejectInvalidServiceID = 8
	// RejectStaleConn: the request came from a QP whose number the
	// peer's connection manager still holds as a live connection's
	// (IB_CM_REJ_STALE_CONN).
	RejectStaleConn = 10
)

// Event is a copy of an rdma_cm_event, already acknowledged.
type Event struct {
	Type   EventType
	Status int
	// Handle is the handle of the id the event is for; ListenHandle that of
	// the listening id for connect requests, whose ID is a new id.
	Handle       uintptr
	ListenHandle uintptr
	ID           *ID
	PrivateData  []byte
	// Initiator and Responder are, in a connect request, the RDMA READ
	// depths the requester offers from this side's point of view (the
	// kernel swaps them): how many READs this side may issue, and serve.
	Initiator, Responder uint8
	// UD is, in the established event of a UDP port space id, what its
	// service ID resolution found: where datagrams to the peer go.
	UD *UDParam
}

// AHAttrSize is the size of a struct ibv_ah_attr.
const AHAttrSize = 32

// UDParam is the outcome of a service ID resolution: the peer's QP
// number and Q_Key, and the address handle attributes (a struct
// ibv_ah_attr) of the route to it.
type UDParam struct {
	QPNum, QKey uint32
	AHAttr      [AHAttrSize]byte
}
