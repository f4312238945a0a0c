//go:build linux && cgo

package rdma

import (
	"errors"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/goverbs/rdma/internal/ibv"
)

// regionSys is the verbs side of a Region: its memory registration.
type regionSys struct{ mr *ibv.MR }

// registerMem maps size bytes (whole pages, faulted in) and registers the
// first size of them in the connection's protection domain with access:
// local write always, and the remote rights asked for, never atomics.
// regMu is held, so that the release cannot hand the arena (and its PD) to
// another connection meanwhile.
func (c *Conn) registerMem(size int, access Access) (*Region, error) {
	if c.ar == nil || c.dev == nil {
		return nil, net.ErrClosed
	}
	mapped := (size + page - 1) &^ (page - 1)
	mem, err := unix.Mmap(-1, 0, mapped, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, &mmapError{need: mapped, err: os.NewSyscallError("mmap", err)}
	}
	mr, err := c.ar.pd.RegMRAccess(mem[:size], access&RemoteRead != 0, access&RemoteWrite != 0)
	if err != nil {
		unix.Munmap(mem)
		var lim unix.Rlimit
		if errors.Is(err, syscall.ENOMEM) && unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil && lim.Cur != unix.RLIM_INFINITY {
			return nil, &memlockError{need: size, limit: lim.Cur, err: err}
		}
		return nil, err
	}
	r := &Region{c: c, mem: mem, size: size, access: access, base: addrOf(mem), lkey: mr.LKey,
		sys: regionSys{mr: mr}, unpinned: make(chan struct{}, 1)}
	if access != 0 {
		r.key = RemoteKey{Addr: r.base, Size: uint64(size), RKey: mr.RKey, Access: access}
	}
	c.dev.addRegistered(size)
	c.mu.Lock()
	c.st.RegisteredBytes += size
	c.mu.Unlock()
	return r, nil
}

// freeRegion deregisters a region, which revokes the peer's access, and
// unmaps it.
func (c *Conn) freeRegion(r *Region) {
	r.sys.mr.Dereg()
	unix.Munmap(r.mem)
	c.dev.addRegistered(-r.size)
	c.mu.Lock()
	c.st.RegisteredBytes -= r.size
	c.mu.Unlock()
}

// releaseRegions frees every region and the bounce memory once the QP is
// gone (nothing can use them any more), before the arena's PD goes to the
// next connection.
func (c *Conn) releaseRegions() {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	c.mu.Lock()
	c.abortOneSided()
	regs := append([]*Region(nil), c.os.regions...)
	if b := c.os.bounce; b != nil {
		regs = append(regs, b)
	}
	c.mu.Unlock()
	for _, r := range regs {
		r.free()
	}
}
