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
