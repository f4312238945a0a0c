// Package rdma provides network connections over RDMA with the shape of
// TCP's: Listen returns a net.Listener and Dial a net.Conn, so code written
// against package net (HTTP, gRPC, net/rpc, protocols of its own) runs over
// InfiniBand, RoCE or iWARP by changing how it dials and listens.
//
//	ln, err := rdma.Listen("rdma", "10.0.0.1:7471") // an RDMA interface's address
//	...
//	c, err := rdma.Dial("rdma", "10.0.0.1:7471")
//
// The networks are "rdma", "rdma4" and "rdma6". A Dialer and a
// ListenConfig hold the options of a dial and of a listener, as net.Dialer
// and net.ListenConfig do. Setting a connection up takes milliseconds (a
// queue pair, registered memory, the connection manager's handshake), so
// keep connections rather than dial one per request.
//
// A connection is a byte stream, as TCP's. A Write copies its bytes into
// memory registered with the device, and the NIC moves them into the
// peer's registered memory as the peer makes room, so a writer far ahead
// of its reader blocks instead of overrunning it; while the peer is
// behind, small Writes gather into one message (see Conn.SetNoDelay).
// Close is graceful: the peer reads everything written, then io.EOF.
//
// # Requirements
//
// Linux with cgo, libibverbs and librdmacm (rdma-core), and an RDMA device
// that serves the address dialed or listened on: an RDMA NIC, or Soft-RoCE or
// soft-iWARP on an Ethernet interface. Every connection registers memory
// with its device, which counts against the locked-memory limit
// (RLIMIT_MEMLOCK; see Options.RegisteredMemory). Elsewhere the package
// builds with the same API, and Dial and Listen fail with an error
// wrapping ErrUnsupported.
//
// # Errors
//
// Errors follow package net: every error is a *net.OpError with Net
// "rdma", but for io.EOF, returned bare once the peer has closed and
// everything it wrote has been read, and the errors of a connection or
// listener that fell back to TCP, whose Net is "tcp" as package net's is.
// What an error wraps can be tested with errors.Is:
//   - net.ErrClosed after Close;
//   - os.ErrDeadlineExceeded when a deadline passes;
//   - ErrNoDevice, ErrProtocol, ErrUnsupported, ErrRemoteAccess and
//     ErrOutOfBounds, as their docs say;
//   - syscall.ECONNREFUSED when the listener refuses (a *RefusedError
//     says why);
//   - syscall.EPIPE for a Write after CloseWrite;
//   - syscall.ECONNRESET when the peer goes away without closing, or the
//     connection breaks;
//   - syscall.ETIMEDOUT when the peer stopped answering (no keepalive
//     probe acknowledged, see Conn.SetKeepAliveConfig, or the NIC's
//     retransmissions ran out), and when Close had to discard written data;
//   - syscall.EINVAL on a nil or zero Conn or Listener.
//
// A failed C call is an *os.SyscallError naming that call (for the steps
// of connection setup that complete asynchronously, the call that started
// the step, as net names connect for a refused non-blocking connect).
//
// # Message mode
//
// With Options.Messages a side's Reads are message-oriented instead: each
// returns bytes of at most one of the peer's Writes, and all of it when
// the buffer is large enough, so a message protocol needs no framing of
// its own. Each side chooses for its own Reads; the peer learns of the
// choice in the handshake.
//
// # One-sided RDMA
//
// A connection also carries one-sided RDMA. A side registers a Region with
// the access it grants (Conn.RegisterRegion) and sends the region's
// RemoteKey to the peer, over the connection itself, say; the peer turns
// the key into a RemoteRegion (Conn.Remote), an io.ReaderAt and
// io.WriterAt whose reads and writes are RDMA READs and WRITEs that do not
// involve the owner's CPU. RemoteRegion.ReadAtContext and WriteAtContext
// move data between registered regions without a copy. A key works on its
// own connection only, until the owner closes the region. Besides its
// regions, the only memory of a side the peer can write is the
// connection's receive ring, which the protocol itself writes (and, on
// iWARP, the memory RDMA READs land in: see RemoteRegion.ReadAtContext).
//
// # Datagrams
//
// ListenPacket returns a PacketConn, a net.PacketConn over RDMA unreliable
// datagrams (UD), the UDP of RDMA: one queue pair for any number of peers,
// datagrams of up to 65,507 bytes (fragmented beyond the port's MTU) that may
// be lost but never arrive changed or merged, batches (ReadBatch,
// WriteBatch), multicast groups (ListenMulticast), and, with
// ListenConfig.FallbackUDP, a UDP socket where RDMA has no datagrams.
//
// # Fallback
//
// With Dialer.FallbackTCP and ListenConfig.FallbackTCP a service also runs
// where there is no RDMA, and between a host with RDMA and one without:
// the dial, or the listener, uses TCP on the same address and port number
// when RDMA cannot carry the connection. It is never silent: the
// connection is then a *net.TCPConn, IsRDMA reports false, and
// Listener.Stats counts such connections apart. A refusal by an RDMA
// listener never falls back. A listener on iWARP cannot have a TCP side on
// its port, which iWARP's own connections use.
//
// # Tuning
//
// The defaults suit most uses. Options sizes a connection: BufferSize is
// the largest message, SendDepth and RecvDepth the messages in flight, and
// Poll and SpinTime decide how a Read or Write that must wait learns it
// can go on (see PollMode). Options.RegisteredMemory,
// GrownRegisteredMemory and CompletionQueueEntries say what a connection
// costs. Conn.SetNoDelay trades message rate for the latency of
// back-to-back small Writes; keepalive probes are on unless turned off
// (Conn.SetKeepAliveConfig); SetDevicePool bounds what a device keeps of
// closed connections for the next ones. Conn.Stats, Listener.Stats and
// Devices report counters.
package rdma
