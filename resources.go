package rdma

import (
	"fmt"
	"syscall"
)

// Errors of a connection's setup that tell what to do: which limit was
// hit, its value, what the connection needed, and the knob.

// memlockError: registering a connection's rings exceeded the
// locked-memory limit (RLIMIT_MEMLOCK): the NIC may only use pinned
// memory, and without CAP_IPC_LOCK the kernel counts it against that limit.
type memlockError struct {
	need  int    // bytes this connection registers
	limit uint64 // the soft limit, bytes
	err   error  // ibv_reg_mr's
}

func (e *memlockError) Error() string {
	return fmt.Sprintf("%v: registering %d KiB for this connection's rings exceeds the locked-memory limit "+
		"(RLIMIT_MEMLOCK %d KiB, shared by every registration of the process): raise it (ulimit -l unlimited, "+
		"or LimitMEMLOCK=infinity for a systemd service) or register less per connection "+
		"(Options.BufferSize; Options.RegisteredMemory says how much)",
		e.err, e.need>>10, e.limit>>10)
}

func (e *memlockError) Unwrap() error { return e.err }

// mmapError: the connection's rings could not be mapped.
type mmapError struct {
	need int
	err  error
}

func (e *mmapError) Error() string {
	return fmt.Sprintf("%v: %d KiB for this connection's rings (Options.RegisteredMemory): the host is out of "+
		"memory, or the process hit its address-space or map-count limit", e.err, e.need>>10)
}

func (e *mmapError) Unwrap() error { return e.err }

// cqLimitError: one connection needs more CQ entries than a completion
// queue of the device may have (more connections get more CQs, but one
// connection's QP completes on one CQ).
type cqLimitError struct {
	need, max int // entries the connection would need, and a CQ's maximum (max_cqe)
}

func (e *cqLimitError) Error() string {
	return fmt.Sprintf("a connection with these Options takes %d completion queue entries (RecvDepth + SendDepth + %d), "+
		"more than the device's maximum of %d per completion queue (max_cqe): lower SendDepth and RecvDepth",
		e.need, cqFixed, e.max)
}

func (e *cqLimitError) Unwrap() error { return syscall.ENOSPC }
