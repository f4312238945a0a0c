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

// regionSys is the verbs side of a Region: its memory registration, and on
// iWARP a second one of the same memory that RDMA READs land in.
type regionSys struct{ mr, sink *ibv.MR }

// registerMem maps size bytes (whole pages, faulted in) and registers the
// first size of them in the connection's protection domain with access:
// local write always, and the remote rights asked for (on iWARP, see
// below, remote write for RDMA READs into it). Given shared, a mapping
// another region holds, it registers that instead of mapping memory.
// regMu is held, so that the release cannot hand the arena (and its PD) to
// another connection meanwhile.
func (c *Conn) registerMem(size int, access Access, shared []byte) (*Region, error) {
	if c.ar == nil || c.dev == nil {
		return nil, net.ErrClosed
	}
	mem := shared
	if mem == nil {
		mapped := (size + page - 1) &^ (page - 1)
		var err error
		mem, err = unix.Mmap(-1, 0, mapped, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err != nil {
			return nil, &mmapError{need: mapped, err: os.NewSyscallError("mmap", err)}
		}
	}
	// On iWARP the response to our RDMA READ is a tagged write into the
	// memory it lands in, under the key the READ names, which the NIC
	// refuses unless that registration allows remote writes. A region
	// that grants no access gets one registration that does (no key of it
	// is handed out but in our READs); one that grants access without
	// remote writes gets a second registration for its READs to land in,
	// so that the key the peer is given allows no more than access says.
	iw := c.dev.iwarp && access&RemoteWrite == 0
	mr, err := c.ar.pd.RegMRAccess(mem[:size], access&RemoteRead != 0, access&RemoteWrite != 0 || iw && access == 0, access&RemoteAtomic != 0)
	var sink *ibv.MR
	if err == nil && iw && access != 0 {
		if sink, err = c.ar.pd.RegMRAccess(mem[:size], false, true, false); err != nil && retryDestroy(mr.Dereg) != nil {
			// Left registered, and so mapped (see arena.stuck).
			c.ar.stuck.Add(1)
			mem = nil
		}
	}
	if err != nil {
		if mem != nil && shared == nil {
			unix.Munmap(mem)
		}
		var lim unix.Rlimit
		if errors.Is(err, syscall.ENOMEM) && unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil && lim.Cur != unix.RLIM_INFINITY {
			return nil, &memlockError{need: size, limit: lim.Cur, err: err}
		}
		return nil, err
	}
	lkey := mr.LKey
	if sink != nil {
		lkey = sink.LKey
	}
	r := &Region{c: c, mem: mem, size: size, access: access, base: addrOf(mem), lkey: lkey,
		sys: regionSys{mr: mr, sink: sink}, unpinned: make(chan struct{}, 1)}
	if access != 0 {
		r.key = RemoteKey{Addr: r.base, Size: uint64(size), RKey: mr.RKey, Access: access}
	}
	c.dev.addRegistered(size)
	c.mu.Lock()
	c.st.RegisteredBytes += size
	c.mu.Unlock()
	return r, nil
}

// deregRegion deregisters a region, which ends the NIC's access to it
// (the peer's accesses fail). A registration that cannot be undone
// stays, counted as registered, and the connection's arena serves no
// other connection (see arena.stuck). A Region built without a
// registration (host tests) has none to undo.
func (c *Conn) deregRegion(r *Region) error {
	var err error
	stuck := 0
	for _, mr := range []*ibv.MR{r.sys.mr, r.sys.sink} {
		if mr == nil {
			continue
		}
		if e := retryDestroy(mr.Dereg); e != nil {
			stuck++
			err = e
		}
	}
	if stuck > 0 {
		c.ar.stuck.Add(int32(stuck))
		return err
	}
	if c.dev != nil {
		c.dev.addRegistered(-r.size)
	}
	return nil
}

// unmapMem unmaps a region's memory (nil: nothing).
func unmapMem(mem []byte) {
	if mem != nil {
		unix.Munmap(mem)
	}
}
