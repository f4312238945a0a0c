//go:build !linux || !cgo

package zerocost

// Available reports whether this build has the provider.
const Available = false

// Noop does nothing: this build has no C.
func Noop() {}

// Wire is two joined ends; in this build there is none.
type Wire struct{}

// New fails: the provider is C.
func New(sendQueue, recvQueue, cqe int, shared bool) (*Wire, error) { return nil, ErrUnavailable }

// End returns nothing in this build.
func (w *Wire) End(i int) End { return End{} }

// Alloc fails in this build.
func Alloc(size int) ([]byte, error) { return nil, ErrUnavailable }

// Free does nothing in this build.
func Free(buf []byte) {}

// Register fails in this build.
func (w *Wire) Register(end int, buf []byte, a Access) (uint32, error) { return 0, ErrUnavailable }

// Deregister does nothing in this build.
func (w *Wire) Deregister(end int, key uint32) {}

// Stats is zero in this build.
func (w *Wire) Stats(end int) Stats { return Stats{} }

// Err is nil in this build.
func (w *Wire) Err() error { return nil }

// Close does nothing in this build.
func (w *Wire) Close() {}

// RunC fails in this build.
func (w *Wire) RunC(p Pattern, n, size int) error { return ErrUnavailable }

// Events is an end's completion events; in this build there are none.
type Events struct{}

// Events fails in this build.
func (w *Wire) Events(end int) (*Events, error) { return nil, ErrUnavailable }

// Wait fails in this build.
func (e *Events) Wait() error { return ErrUnavailable }

// Close does nothing in this build.
func (e *Events) Close() error { return nil }
