package rdma

import (
	"fmt"
	"syscall"

	"github.com/goverbs/rdma/internal/ibv"
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

// inlineError: the transport carries no immediate data, so every message
// header goes as the payload of a SEND posted inline (ibv.SendHeader),
// but the device gave the connection's QP less inline room than a
// header. The first header's post would fail, in the middle of the
// connection's life; the setup fails instead, saying why. Sending the
// header from registered memory would take a registered header slot per
// send in flight, kept until its completion; no iWARP provider known
// grants less than 64 bytes inline (siw grants 80), so that is not
// worth its cost on every send.
type inlineError struct {
	have int // the inline bytes the QP took
}

func (e *inlineError) Error() string {
	return fmt.Sprintf("the device's queue pair sends at most %d bytes inline, fewer than the %d of a message header, "+
		"which a transport without immediate data (iWARP) sends inline: the device cannot carry this protocol",
		e.have, ibv.HeaderLen)
}

func (e *inlineError) Unwrap() error { return syscall.EOPNOTSUPP }

// checkInline says whether a QP that sends maxInline bytes inline serves
// a connection laid out as lay: one whose headers travel as SENDs needs
// room for a header.
func checkInline(lay layout, maxInline int) error {
	if lay.headers() && maxInline < ibv.HeaderLen {
		return &inlineError{have: maxInline}
	}
	return nil
}
