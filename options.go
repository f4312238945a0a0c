package rdma

import (
	"fmt"
	"time"
)

// Defaults of the Options fields of those names.
const (
	DefaultBufferSize = 64 << 10
	DefaultSendDepth  = 16
	DefaultRecvDepth  = 64
	DefaultSpinTime   = 50 * time.Microsecond
)

// Limits on the per-connection buffer settings.
const (
	minBufferSize = 256
	maxBufferSize = 16 << 20
	maxDepth      = 1024
)

// Options are the per-connection resource settings shared by Dialer and
// ListenConfig. Zero values pick the defaults.
type Options struct {
	// BufferSize is the largest message: on a connection, the smaller of
	// the two sides' BufferSize (headers travel apart, as immediate data);
	// bigger Writes are split. A connection starts with send and receive
	// rings of 16 KiB (messages of up to 8 KiB), and moves to rings of 16
	// of the largest messages (at most 1 MiB, at least two of them) while
	// the peer streams to it, back once it is idle (see RegisteredMemory);
	// a message takes only its own length in the peer's ring (rounded up
	// to 64 bytes), so many small messages fit where one large one does.
	// Default 64 KiB.
	BufferSize int
	// SendDepth is the most data messages in flight from this side in the
	// send queue. It costs no memory. Default 16.
	SendDepth int
	// RecvDepth is the number of receives posted for the peer's data
	// messages, the most messages it may have in flight to this side
	// (besides what the ring's bytes allow). Receives are zero-length:
	// it costs no memory, only completion-queue entries. Default 64: deep
	// enough that a stream of small messages rarely waits for a credit
	// message (credits go back in batches of a quarter of it).
	RecvDepth int
	// Poll chooses how a Read or Write that must wait learns that it can
	// go on: PollAdaptive (the default) spins for SpinTime and then parks,
	// PollBusy spins until it can go on, PollEvent parks at once.
	Poll PollMode
	// Messages makes this side's Reads message-oriented: every Read returns
	// bytes of at most one of the peer's Writes, and a Read whose buffer is
	// at least as large as that Write returns all of it. The peer learns of
	// it in the handshake and then never merges Writes.
	//
	// A Write of any size is one message (bigger ones travel in fragments
	// of BufferSize and are put together again); a Read with a smaller
	// buffer gets the message in order over several Reads, the last of
	// which ends at the message's end. A zero-length Write sends nothing,
	// in either mode, so a Read never returns (0, nil) for one. The other
	// side may choose differently for its own Reads. Default false: Reads
	// return a byte stream, as TCP's.
	Messages bool
	// SpinTime is how long a Read or Write that must wait polls the
	// completion queue itself before it parks, with PollAdaptive: short
	// waits (a round trip) then cost no wakeup, at the price of CPU while
	// spinning. While a connection's recent waits were shorter than a
	// millisecond it spins up to twice their average instead, if that is
	// longer; while they were longer than both a millisecond and SpinTime
	// it parks at once (a spin would not have caught them, and where the
	// provider does a message's receive work on this host's CPUs, as
	// Soft-RoCE does, spinning delays it). Default 50µs; negative is the
	// same as PollEvent.
	SpinTime time.Duration
}

// RegisteredMemory returns how many bytes of memory an idle connection
// with these options registers with the device: a receive ring and a send
// ring of 16 KiB each (2 × BufferSize, in whole pages, if that is less):
// 32 KiB with the defaults; SendDepth and RecvDepth cost none. While the
// peer streams to it, a connection registers a receive ring of 16 ×
// BufferSize (at most 1 MiB, at least 2 × BufferSize, in whole pages, and
// no more than the peer's BufferSize gives) besides, and the peer a send
// ring to match; a connection that
// streams both ways registers both (GrownRegisteredMemory). They go again
// once no data has come for two seconds. It returns an error for options
// Dial and Listen would refuse. On an iWARP device, which has no immediate
// data, each connection registers 80 bytes more per receive, in whole
// pages (8 KiB with the defaults), for the headers of the messages it
// receives and the payload of the small ones.
func (o Options) RegisteredMemory() (int, error) {
	o, err := o.normalized()
	if err != nil {
		return 0, err
	}
	return newLayout(o).size(), nil
}

// GrownRegisteredMemory returns the most memory a connection with these
// options registers while it streams both ways: RegisteredMemory and a big
// receive ring and send ring of 16 × BufferSize each (at most 1 MiB, at
// least 2 × BufferSize, in whole pages): 2,080 KiB with the defaults.
func (o Options) GrownRegisteredMemory() (int, error) {
	o, err := o.normalized()
	if err != nil {
		return 0, err
	}
	l := newLayout(o)
	if l.bigRing <= l.ring {
		return l.size(), nil
	}
	return l.size() + 2*l.bigRing, nil
}

// CompletionQueueEntries returns how many entries of its device's shared
// completion queue a connection with these options reserves: one per
// receive and send it may have outstanding (RecvDepth + SendDepth + 10),
// one per one-sided operation (16: see RemoteRegion), one for the
// keepalive probe and one for its teardown. A device's queue holds at most its max_cqe
// entries (cmd/rdmainfo reports it), which bounds the connections one
// process can have on a device; it returns an error for options Dial and
// Listen would refuse.
func (o Options) CompletionQueueEntries() (int, error) {
	o, err := o.normalized()
	if err != nil {
		return 0, err
	}
	return newLayout(o).cqEntries(), nil
}

func (o Options) normalized() (Options, error) {
	if o.BufferSize == 0 {
		o.BufferSize = DefaultBufferSize
	}
	if o.SendDepth == 0 {
		o.SendDepth = DefaultSendDepth
	}
	if o.RecvDepth == 0 {
		o.RecvDepth = DefaultRecvDepth
	}
	if o.SpinTime == 0 {
		o.SpinTime = DefaultSpinTime
	}
	switch {
	case o.BufferSize < minBufferSize || o.BufferSize > maxBufferSize:
		return o, fmt.Errorf("rdma: BufferSize %d outside [%d, %d]", o.BufferSize, minBufferSize, maxBufferSize)
	case o.SendDepth < 2 || o.SendDepth > maxDepth:
		return o, fmt.Errorf("rdma: SendDepth %d outside [2, %d]", o.SendDepth, maxDepth)
	case o.RecvDepth < 2 || o.RecvDepth > maxDepth:
		return o, fmt.Errorf("rdma: RecvDepth %d outside [2, %d]", o.RecvDepth, maxDepth)
	case o.Poll < PollAdaptive || o.Poll > PollEvent:
		return o, fmt.Errorf("rdma: unknown poll mode %d", int(o.Poll))
	}
	if o.SpinTime < 0 && o.Poll == PollAdaptive {
		o.Poll = PollEvent
	}
	return o, nil
}
