//go:build !linux || !cgo

package rdmacm

// Supported reports whether the real librdmacm is linked in.
const Supported = false

// ID is an rdma_cm_id; without librdmacm there is none.
type ID struct{}
