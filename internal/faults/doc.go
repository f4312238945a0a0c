// Package faults makes the calls that libibverbs and librdmacm make into
// the kernel's RDMA interface fail on purpose, one at a time or a run of
// them, so that tests can check what the library does with every failure
// a real host may return (ENOMEM, EIO, a device going away).
//
// It is built only with the faultinject build tag: a test binary built so
// (go test -tags faultinject) defines write, read and ioctl itself, and
// the dynamic linker binds the C libraries' calls to those definitions
// instead of the C library's. Each one passes the call through unless it
// is armed and the call is the one chosen to fail; only calls on the RDMA
// character devices (/dev/infiniband/*) and on their event files count.
// Go's own system calls do not go through the C library and are never
// touched.
package faults
