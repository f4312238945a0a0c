package ibv

// The data-path types and constants live in this file, without cgo, so that
// code above the verbs seam (rings, credit ledger, completion dispatch) can
// be built and tested with fakes on any platform. ibv.go checks at compile
// time that every constant equals libibverbs' own and that the batch limits
// equal the C shims' array sizes.

// Send flags (enum ibv_send_flags).
const (
	SendSignaled = 1 << 1 // IBV_SEND_SIGNALED
	SendInline   = 1 << 3 // IBV_SEND_INLINE
	// SendEmptyWrite is this package's own flag: post a zero-length RDMA
	// WRITE instead of the SEND (no payload, no immediate data). The
	// peer's NIC acknowledges it without touching memory or consuming a
	// receive, which makes it a keepalive probe.
	SendEmptyWrite = 1 << 30
	// SendWriteImm is this package's own flag too: post an RDMA WRITE
	// with immediate data to SendWR.RemoteAddr under SendWR.RKey instead
	// of the SEND. The payload lands in the peer's memory and the
	// immediate data consumes one of its receives.
	SendWriteImm = 1 << 29
	// SendRead and SendWrite are this package's own flags as well: post a
	// plain RDMA READ of SendWR.RemoteAddr into Addr, or an RDMA WRITE of
	// Addr to RemoteAddr, under RKey, instead of the SEND: the one-sided
	// operations on regions an application registered.
	SendRead  = 1 << 28
	SendWrite = 1 << 27
	// SendHeader is this package's own flag too, for transports without
	// immediate data (iWARP): post a SEND whose payload is the message's
	// header, HeaderLen bytes inline: Imm, then Len (the length of the
	// data message it announces), both big-endian. Addr and LKey are
	// not used.
	SendHeader = 1 << 26
	// SendPlain posts a SEND without immediate data of the payload at
	// Addr: what a peer on a transport without immediate data sends.
	SendPlain = 1 << 25
	// SendCompareSwap and SendFetchAdd are this package's own flags too:
	// post a remote atomic on the 8 bytes at RemoteAddr under RKey
	// instead of the SEND, whose old value lands in the 8 bytes at Addr
	// (Len 8, under LKey): a compare-and-swap of Compare for Swap, or a
	// fetch-and-add of Compare.
	SendCompareSwap = 1 << 23
	SendFetchAdd    = 1 << 22
)

// A device's atomicity of remote atomics (enum ibv_atomic_cap).
const (
	AtomicNone = 0 // no remote atomics
	AtomicHCA  = 1 // atomic against the device's other operations on the word only
	AtomicGlob = 2 // atomic against the host's CPUs too
)

// HeaderLen is the header a SendHeader SEND starts with. With
// SendHeaderData its payload follows: the Len bytes at Addr (under LKey),
// at most HeaderData of them, copied inline behind the header.
const (
	HeaderLen  = 8
	HeaderData = 72
	// HeaderSlot is what a receive takes such a SEND into.
	HeaderSlot = HeaderLen + HeaderData
)

// SendHeaderData, with SendHeader, carries the data message's payload in
// the SEND itself, behind the header, instead of an RDMA WRITE before it.
const SendHeaderData = 1 << 24

// Completion statuses and flags the library distinguishes.
const (
	WCSuccess      = 0      // IBV_WC_SUCCESS
	WCFlushErr     = 5      // IBV_WC_WR_FLUSH_ERR
	WCLocProtErr   = 4      // IBV_WC_LOC_PROT_ERR: a local buffer outside its region
	WCRemInvReqErr = 9      // IBV_WC_REM_INV_REQ_ERR: the responder found the request invalid
	WCRemAccessErr = 10     // IBV_WC_REM_ACCESS_ERR: the responder refused the access
	WCRetryExcErr  = 12     // IBV_WC_RETRY_EXC_ERR
	WCWithImm      = 1 << 1 // IBV_WC_WITH_IMM, in WC.Flags
)

// Opcodes of receive completions (enum ibv_wc_opcode), in WC.Opcode.
const (
	WCOpRecv         = 1 << 7       // IBV_WC_RECV: a SEND consumed the receive
	WCOpRecvWriteImm = WCOpRecv + 1 // IBV_WC_RECV_RDMA_WITH_IMM: an RDMA WRITE with immediate data did
)

// WC is one work completion; its layout mirrors struct gv_wc.
type WC struct {
	WRID    uint64
	Status  uint32
	Opcode  uint32
	ByteLen uint32
	QPNum   uint32
	Imm     uint32 // immediate data, host order, when Flags has WCWithImm
	Flags   uint32
	SrcQP   uint32 // a UD receive's: the QP number of the sender
}

// RecvWR is one receive to post; its layout mirrors struct gv_recv. Len 0
// posts a receive without a scatter entry: it takes the immediate data of
// a SEND without payload or of an RDMA WRITE with immediate data, whose
// payload goes where the writer put it.
type RecvWR struct {
	ID   uint64
	Addr uint64
	Len  uint32
	LKey uint32
}

// SendWR is one SEND with immediate data to post (or, with
// SendEmptyWrite, a zero-length RDMA WRITE; with SendWriteImm, an RDMA
// WRITE with immediate data to RemoteAddr under RKey; with SendRead or
// SendWrite, a plain RDMA READ or WRITE; with SendCompareSwap or
// SendFetchAdd, a remote atomic); its layout mirrors struct
// gv_send. Len 0 sends no payload.
type SendWR struct {
	ID         uint64
	Addr       uint64
	Len        uint32
	LKey       uint32
	Flags      int32
	Imm        uint32 // host order
	RemoteAddr uint64 // SendWriteImm, SendRead, SendWrite, the atomics only
	RKey       uint32 // SendWriteImm, SendRead, SendWrite, the atomics only
	Compare    uint64 // SendCompareSwap: the value compared; SendFetchAdd: the addend
	Swap       uint64 // SendCompareSwap: the value swapped in
}

// WriteWR is one RDMA WRITE to post (QP.PostWrite): Len bytes from Addr,
// registered under LKey, to RemoteAddr in the peer's region of RKey.
type WriteWR struct {
	ID         uint64
	Addr       uint64
	Len        uint32
	LKey       uint32
	RemoteAddr uint64
	RKey       uint32
	Flags      int32 // SendSignaled, SendInline
}

// Batch limits of the C shims (their stack arrays have these sizes).
const (
	// MaxPollBatch is the most completions CQ.Poll returns at once.
	MaxPollBatch = 32
	// MaxSendBatch is the most sends QP.PostSends takes at once.
	MaxSendBatch = 32
	// MaxRecvBatch is the most receives QP.PostRecvs takes at once.
	MaxRecvBatch = 64
)

// AsyncEventType is an asynchronous event's type (enum ibv_event_type);
// the ones the library acts on are named.
type AsyncEventType int

// Asynchronous events the library acts on.
const (
	EventCQErr       AsyncEventType = 0  // IBV_EVENT_CQ_ERR
	EventQPFatal     AsyncEventType = 1  // IBV_EVENT_QP_FATAL
	EventQPReqErr    AsyncEventType = 2  // IBV_EVENT_QP_REQ_ERR
	EventQPAccessErr AsyncEventType = 3  // IBV_EVENT_QP_ACCESS_ERR
	EventPathMigErr  AsyncEventType = 7  // IBV_EVENT_PATH_MIG_ERR
	EventDeviceFatal AsyncEventType = 8  // IBV_EVENT_DEVICE_FATAL
	EventPortActive  AsyncEventType = 9  // IBV_EVENT_PORT_ACTIVE
	EventPortErr     AsyncEventType = 10 // IBV_EVENT_PORT_ERR
)

// AsyncEvent is one asynchronous event of a device, already acknowledged:
// QPNum names the QP of a QP event, Port the port of a port event.
type AsyncEvent struct {
	Type  AsyncEventType
	QPNum uint32
	Port  int
}

// GRHLen is the room a UD receive keeps in front of each datagram for the
// Global Routing Header the device writes there (on RoCE v2 over IPv4,
// the packet's IPv4 header, in its last 20 bytes).
const GRHLen = 40

// WCGRH is IBV_WC_GRH, in WC.Flags: the receive's first GRHLen bytes are
// a GRH.
const WCGRH = 1 << 0

// MaxUDSendBatch is the most datagram sends PostUDSends posts at once.
const MaxUDSendBatch = 32

// UDQKey is the Q_Key rdma_cm gives the QPs of its UDP port space
// (RDMA_UDP_QKEY), which its service ID resolution answers with.
const UDQKey = 0x01234567

// UDSendWR is one datagram SEND; its layout mirrors struct gv_ud_send.
type UDSendWR struct {
	ID    uint64
	Addr  uint64
	Len   uint32
	LKey  uint32
	AH    uintptr // an *AH's address handle (AH.Handle)
	QPN   uint32
	QKey  uint32
	Flags int32
	_     uint32
}
