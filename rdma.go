// Package rdma gives Go programs RDMA connections with the shape of TCP's:
// Listen returns a net.Listener and Dial a net.Conn, so code written against
// package net (HTTP, gRPC, net/rpc, home-grown protocols) runs over
// InfiniBand, RoCE or Soft-RoCE by changing how it dials and listens.
//
// Underneath, librdmacm sets connections up and libibverbs moves the data:
// each connection is an RC queue pair with a preregistered send ring and
// receive ring and pre-posted (zero-length) receives. A Write is copied
// into the send ring and written with RDMA WRITE with immediate data into
// the peer's receive ring, in messages of at most the smaller of the two
// sides' BufferSize; credits granted by the receiver guarantee a posted
// receive for every message and unread bytes that are never overwritten,
// so the NIC never meets a receiver that is not ready. Besides the regions
// a side registers for one-sided RDMA (below), with the access it grants,
// the receive ring is the only memory a peer may touch, and only through
// its own connection. While the peer has no receive free, or is behind,
// small Writes gather into one message (see Conn.Write and SetNoDelay); a
// writer far ahead of its reader blocks instead of overrunning it. One
// goroutine per completion queue (a device has one, and more once
// connections fill it) polls the shared queue and, when idle,
// parks in Go's netpoller on the completion channel instead of holding an
// OS thread; a Read or Write that waits briefly polls the queue itself
// (see PollMode).
//
// By default a connection is a byte stream, as TCP's: Read returns whatever
// has arrived, up to len(b), across the peer's messages, so Write
// boundaries are not kept. With Options.Messages a side's Reads are
// message-oriented instead: each returns bytes of one of the peer's Writes
// at most, and all of it when the buffer is large enough, so a message
// protocol needs no framing of its own. Each side chooses for its own
// Reads; the peer learns of the choice in the handshake.
//
// Besides the stream, a connection carries one-sided RDMA: a side
// registers a Region with the access it grants (Conn.RegisterRegion) and
// sends its RemoteKey to the peer over the connection; the peer reads and
// writes it with RDMA READ and WRITE, without the owner's CPU, through a
// RemoteRegion (an io.ReaderAt and io.WriterAt; ReadAtContext and
// WriteAtContext move data between registered regions without a copy).
// Nothing else is ever remotely accessible, and a key works on its own
// connection only.
//
// Errors follow package net: every error is a *net.OpError with Net "rdma"
// (io.EOF excepted: it is returned bare once the peer has closed and
// everything it wrote has been read; and a connection or listener that
// fell back to TCP, see FallbackTCP, reports Net "tcp" as package net
// does). What it wraps can be tested with
// errors.Is: net.ErrClosed after Close; os.ErrDeadlineExceeded when a
// deadline passes; ErrNoDevice, ErrProtocol, ErrUnsupported,
// ErrRemoteAccess and ErrOutOfBounds as their docs say;
// syscall.ECONNREFUSED when the listener refuses (a
// *RefusedError says why: see RefuseReason); syscall.EPIPE
// for a Write after CloseWrite; syscall.ECONNRESET when the peer goes away
// without closing or the connection breaks; syscall.ETIMEDOUT when the
// peer stopped answering (no keepalive probe acknowledged, see
// Conn.SetKeepAliveConfig, or the NIC's retransmissions ran out), and
// when Close had to discard written data; syscall.EINVAL on a nil or zero Conn or
// Listener. A failed C call is an *os.SyscallError naming that call (for
// the steps of connection setup that complete asynchronously, the call
// that started the step, as net names connect for a refused non-blocking
// connect).
package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Addr is the address of an RDMA connection end point: an IP address of an
// RDMA-capable interface (an IPoIB or RoCE netdev) and an rdma_cm port.
type Addr struct {
	IP   net.IP
	Port int
	Zone string // IPv6 scoped addressing zone
}

// Network returns "rdma".
func (a *Addr) Network() string { return "rdma" }

// String returns "host:port".
func (a *Addr) String() string {
	if a == nil {
		return "<nil>"
	}
	host := ""
	if len(a.IP) > 0 {
		host = a.IP.String()
		if a.Zone != "" {
			host += "%" + a.Zone
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(a.Port))
}

// AddrPort returns the address as a netip.AddrPort.
func (a *Addr) AddrPort() netip.AddrPort {
	if a == nil {
		return netip.AddrPort{}
	}
	ip, _ := netip.AddrFromSlice(a.IP)
	if a.Zone != "" {
		ip = ip.WithZone(a.Zone)
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(a.Port))
}

func addrFrom(ap netip.AddrPort) *Addr {
	ip := ap.Addr()
	return &Addr{IP: net.IP(ip.AsSlice()), Port: int(ap.Port()), Zone: ip.Zone()}
}

// ResolveAddr parses and resolves address ("host:port") for network
// "rdma", "rdma4" or "rdma6", like net.ResolveTCPAddr.
func ResolveAddr(network, address string) (*Addr, error) {
	ap, err := resolve(context.Background(), network, address)
	if err != nil {
		return nil, err
	}
	return addrFrom(ap), nil
}

// resolve turns "host:port" into one IP address of the family the network
// allows: the first one the resolver returns.
func resolve(ctx context.Context, network, address string) (netip.AddrPort, error) {
	switch network {
	case "rdma", "rdma4", "rdma6":
	default:
		return netip.AddrPort{}, net.UnknownNetworkError(network)
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, &net.AddrError{Err: "missing port in address", Addr: address}
	}
	port, err := net.LookupPort("tcp", portStr)
	if err != nil {
		return netip.AddrPort{}, &net.AddrError{Err: "invalid port", Addr: address}
	}
	var ips []netip.Addr
	if host == "" {
		if network == "rdma6" {
			ips = []netip.Addr{netip.IPv6Unspecified()}
		} else {
			ips = []netip.Addr{netip.IPv4Unspecified()}
		}
	} else if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip.Unmap()}
	} else {
		addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return netip.AddrPort{}, err
		}
		ips = addrs
	}
	for _, ip := range ips {
		ip = ip.Unmap()
		switch {
		case network == "rdma4" && !ip.Is4():
		case network == "rdma6" && !ip.Is6():
		default:
			return netip.AddrPortFrom(ip, uint16(port)), nil
		}
	}
	return netip.AddrPort{}, &net.AddrError{Err: "no suitable address found", Addr: address}
}

// Defaults for the per-connection buffer settings.
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
//
// On iWARP an RDMA READ's response is written into the reader's memory
// under the key the READ names, so memory a connection reads into allows
// remote writes through that key: the peer can write it while the
// registration lasts. That is the transport's rule, not this package's:
// keep regions that ReadAt or Region.ReadFrom fill apart from memory the
// peer must not touch.
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
// one per one-sided operation (16: see RemoteRegion) and one for its
// teardown. A device's queue holds at most its max_cqe
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

// ErrNoDevice is wrapped by the error Dial and Listen return when no RDMA
// device serves the address (127.0.0.1, say, or an interface without RDMA),
// and when librdmacm finds no RDMA device on the host at all; and by the
// errors of Accept, Read, Write and a Dial in progress once their device
// has gone away (removed, or failed fatally): the library then releases
// what it held of the device without waiting for Close.
var ErrNoDevice = errors.New("no RDMA device serves this address")

// ErrProtocol is wrapped by the error Dial returns when the listener at the
// address is not an rdma (this package's) listener, e.g. a perftest server,
// and by Read and Write errors once the peer broke the protocol (a message
// of an unknown type, more messages or credits than granted). A listener
// of this package refuses a dialer of another protocol version (the
// dialer's error, a *RefusedError, wraps syscall.ECONNREFUSED and
// ErrProtocol).
var ErrProtocol = errors.New("peer does not speak this package's protocol")

// ErrUnsupported is wrapped by the error of every Dial and Listen with valid
// options and address on builds without cgo or off Linux.
var ErrUnsupported = errors.New("rdma: not supported on this build (needs linux and cgo)")

// deviceError says no device serves an address while keeping the verb's
// own error reachable through errors.As.
type deviceError struct{ err error }

func (e *deviceError) Error() string   { return ErrNoDevice.Error() + " (" + e.err.Error() + ")" }
func (e *deviceError) Unwrap() []error { return []error{ErrNoDevice, e.err} }

// hostDeviceError is the error of a call that looks for the host's RDMA
// devices (opening the connection manager's event channel): ErrNoDevice
// when it failed with ENODEV, librdmacm having found none, and the call's
// own error (an *os.SyscallError naming it) for anything else. ENOMEM or
// EIO says nothing about the devices, and ErrNoDevice would send a Dialer
// with FallbackTCP to TCP over a transient failure.
func hostDeviceError(err error) error {
	if errors.Is(err, syscall.ENODEV) {
		return &deviceError{err}
	}
	return err
}

// noDeviceLeft reports whether a rescan of the host's devices (n found,
// or err) says that none is left: none found, or ENODEV. Any other
// failure says nothing about the devices.
func noDeviceLeft(n int, err error) bool {
	if err != nil {
		return errors.Is(err, syscall.ENODEV)
	}
	return n == 0
}

// protocolError says what was wrong with the peer's handshake.
type protocolError struct{ detail string }

func (e *protocolError) Error() string { return ErrProtocol.Error() + ": " + e.detail }
func (e *protocolError) Unwrap() error { return ErrProtocol }

// Dialer holds options for dialing, like net.Dialer. The zero value works.
type Dialer struct {
	// Timeout bounds the whole dial (address and route resolution and
	// connection). Zero means the context's deadline bounds it, or, if it
	// has none, DefaultDialTimeout: a dial never waits forever for a
	// server that received the request and never answers.
	Timeout time.Duration
	// LocalAddr, if not nil, is the local address to dial from (its port
	// is ignored).
	LocalAddr *Addr
	// KeepAlive is how long the connection must be quiet before the first
	// keepalive probe, as net.Dialer's: zero means the default
	// (DefaultKeepAliveIdle), negative turns probes off. It is ignored if
	// KeepAliveConfig.Enable is true.
	KeepAlive time.Duration
	// KeepAliveConfig configures the probes as net.Dialer's does (see
	// Conn.SetKeepAliveConfig). If its Enable is false and KeepAlive is
	// negative, there are none.
	KeepAliveConfig net.KeepAliveConfig
	// FallbackTCP, if set, makes Dial connect over TCP (Go's net, to the
	// same address and port) when RDMA cannot carry the connection: no
	// RDMA device serves the route, or this host has none, or this build
	// has no RDMA (the errors wrapping ErrNoDevice or ErrUnsupported); the
	// peer has no RDMA listener on the port (a RefusedError with reason
	// RefusedNoListener); or the peer's host never answered the RDMA
	// connection request (a host without RDMA). A refusal by an RDMA
	// listener (any other reason), a foreign RDMA server (ErrProtocol), a
	// timeout and a cancelled context never fall back. The connection is
	// then a *net.TCPConn: its LocalAddr().Network() is "tcp", and IsRDMA
	// reports false. If TCP fails too, the error holds both failures.
	FallbackTCP bool
	Options
}

// Dial connects to address on network ("rdma", "rdma4" or "rdma6").
func Dial(network, address string) (*Conn, error) {
	var d Dialer
	return d.dial(context.Background(), network, address)
}

// DialContext connects to address on network, honouring ctx's deadline and
// cancellation during resolution and connection. (On iWARP the kernel
// connects TCP inside rdma_connect and cannot be interrupted there: a Dial
// that gives up then returns at once, and the connection's resources go
// when that call returns, within TCP's SYN retries.) So that it can be plugged
// into code that dials TCP (http.Transport.DialContext, say), it takes
// "tcp", "tcp4" and "tcp6" to mean "rdma", "rdma4" and "rdma6".
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
		network = "rdma" + network[3:]
	}
	if d.FallbackTCP && d.Timeout > 0 {
		// One bound for both attempts.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	c, err := d.dial(ctx, network, address)
	if err != nil {
		if d.FallbackTCP && fallsBackToTCP(err) {
			return d.dialTCP(ctx, network, address, err)
		}
		return nil, err
	}
	return c, nil
}

// Dial connects to address on network.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DefaultDialTimeout bounds a dial that has neither a Timeout nor a
// deadline: about what Linux's TCP connect takes to give up on a host that
// does not answer (127 s with the default six SYN retries). rdma_cm alone
// would wait much longer: a server's CM acknowledges a request it has not
// answered yet with an MRA, which stretches the dialer's timeout to minutes.
const DefaultDialTimeout = 2 * time.Minute

// defaultDialTimeout is DefaultDialTimeout; tests shorten it.
var defaultDialTimeout = DefaultDialTimeout

func (d *Dialer) dial(ctx context.Context, network, address string) (*Conn, error) {
	timeout := d.Timeout
	if _, ok := ctx.Deadline(); !ok && timeout <= 0 {
		timeout = defaultDialTimeout
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	opErr := func(addr net.Addr, err error) error {
		var src net.Addr
		if d.LocalAddr != nil {
			src = d.LocalAddr
		}
		return &net.OpError{Op: "dial", Net: "rdma", Source: src, Addr: addr, Err: err}
	}
	opts, err := d.Options.normalized()
	if err != nil {
		return nil, opErr(nil, err)
	}
	raddr, err := resolve(ctx, network, address)
	if err != nil {
		return nil, opErr(nil, mapCtxErr(err))
	}
	var laddr netip.Addr
	if d.LocalAddr != nil {
		laddr = d.LocalAddr.AddrPort().Addr()
	}
	c, err := dial(ctx, laddr, raddr, opts)
	if err != nil {
		return nil, opErr(addrFrom(raddr), mapCtxErr(err))
	}
	c.mu.Lock()
	c.setKeepAlive(keepAliveFrom(d.KeepAlive, d.KeepAliveConfig))
	c.mu.Unlock()
	return c, nil
}

// mapCtxErr turns a context's deadline into the timeout error net uses.
func mapCtxErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return errTimeout
	}
	return err
}

// errTimeout is the error of every deadline or timeout, as in package net.
var errTimeout = os.ErrDeadlineExceeded

// ListenConfig holds options for listening, like net.ListenConfig.
type ListenConfig struct {
	// Backlog is the most connections that may be in their handshake or
	// established and waiting for Accept (and the rdma_listen backlog);
	// requests beyond it are refused. Default 128.
	Backlog int
	// KeepAlive and KeepAliveConfig configure the keepalive probes of
	// accepted connections, as the Dialer's fields of those names do.
	KeepAlive       time.Duration
	KeepAliveConfig net.KeepAliveConfig
	// Refused, if not nil, is called for every connection request the
	// listener refuses, with the dialer's address and a *net.OpError
	// (Op "accept") whose chain holds a *RefusedError (the reason the
	// dialer was told) and, when the listener's own setup failed, the
	// error that says what to do (the locked-memory limit to raise, say).
	// It runs on the goroutine that answers every connection request of
	// the process when the refusal is decided on arrival (backlog full,
	// another protocol), and on the goroutine that set the connection up
	// when its setup failed (out of locked memory, say): it may be called
	// from several goroutines at once, must be safe for that, return
	// quickly (log, count) and not call the listener. Listener.Stats
	// counts the refusals either way. Both
	// happen before the reject is sent, so a dialer that has been refused
	// finds its refusal counted.
	Refused func(remote net.Addr, err error)
	// FallbackTCP, if set, makes the listener accept TCP connections too,
	// on the same address and port number (from dialers on hosts without
	// RDMA, or whose FallbackTCP found no RDMA route), and makes Listen
	// succeed over TCP alone where no RDMA device serves the address (or
	// the build has no RDMA). Accept returns a *net.TCPConn for those;
	// IsRDMA tells them apart, and Listener.Stats counts them
	// (AcceptedTCP).
	FallbackTCP bool
	Options
}

// Listen announces on the local address: "host:port" with an address of an
// RDMA-capable interface, or an empty host for all of them. Port 0 picks a
// free port; Listener.Addr reports it.
func Listen(network, address string) (*Listener, error) {
	var lc ListenConfig
	return lc.listen(context.Background(), network, address)
}

// Listen announces on the local address; see the package-level Listen.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	l, err := lc.listen(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (lc *ListenConfig) listen(ctx context.Context, network, address string) (*Listener, error) {
	opErr := func(addr net.Addr, err error) error {
		return &net.OpError{Op: "listen", Net: "rdma", Addr: addr, Err: err}
	}
	opts, err := lc.Options.normalized()
	if err != nil {
		return nil, opErr(nil, err)
	}
	backlog := lc.Backlog
	if backlog <= 0 {
		backlog = 128
	}
	ap, err := resolve(ctx, network, address)
	if err != nil {
		return nil, opErr(nil, err)
	}
	var l *Listener
	if lc.FallbackTCP {
		l, err = lc.listenFallback(ctx, network, ap, func(ap netip.AddrPort) (*Listener, error) {
			return listen(ap, backlog, opts, lc.Refused)
		})
	} else {
		l, err = listen(ap, backlog, opts, lc.Refused)
	}
	if err != nil {
		return nil, opErr(addrFrom(ap), err)
	}
	l.keepAlive = keepAliveFrom(lc.KeepAlive, lc.KeepAliveConfig)
	return l, nil
}
