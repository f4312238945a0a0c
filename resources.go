package rdma

import (
	"fmt"
	"syscall"
)

// Errors of a connection's setup that tell what to do: which limit was
// hit, its value, what the connection needed, and the knob.

// memlockError: registering a connection's buffers exceeded the
// locked-memory limit (RLIMIT_MEMLOCK): the NIC may only use pinned
// memory, and without CAP_IPC_LOCK the kernel counts it against that limit.
type memlockError struct {
	need  int    // bytes this connection registers
	limit uint64 // the soft limit, bytes
	err   error  // ibv_reg_mr's
}

func (e *memlockError) Error() string {
	return fmt.Sprintf("%v: registering %d KiB for this connection's buffers exceeds the locked-memory limit "+
		"(RLIMIT_MEMLOCK %d KiB, shared by every registration of the process): raise it (ulimit -l unlimited, "+
		"or LimitMEMLOCK=infinity for a systemd service) or register less per connection "+
		"(Options.BufferSize, SendDepth and RecvDepth; Options.RegisteredMemory says how much)",
		e.err, e.need>>10, e.limit>>10)
}

func (e *memlockError) Unwrap() error { return e.err }

// mmapError: the connection's buffers could not be mapped.
type mmapError struct {
	need int
	err  error
}

func (e *mmapError) Error() string {
	return fmt.Sprintf("%v: %d KiB for this connection's buffers (Options.RegisteredMemory): the host is out of "+
		"memory, or the process hit its address-space or map-count limit", e.err, e.need>>10)
}

func (e *mmapError) Unwrap() error { return e.err }

// cqLimitError: the device's shared completion queue cannot grow enough
// for one more connection.
type cqLimitError struct {
	need, max int // entries the CQ would need, and its maximum (max_cqe)
	perConn   int // entries this connection takes
	conns     int // connections the device already serves
}

func (e *cqLimitError) Error() string {
	return fmt.Sprintf("the device's completion queue would need %d entries, more than its maximum of %d (max_cqe): "+
		"%d connections of this process use it and each takes %d with these Options (RecvDepth + SendDepth + 11); "+
		"lower SendDepth and RecvDepth, or spread the connections over more devices",
		e.need, e.max, e.conns, e.perConn)
}

func (e *cqLimitError) Unwrap() error { return syscall.ENOSPC }
