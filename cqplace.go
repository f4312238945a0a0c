package rdma

// A device's connections share completion queues: one CQ at first, grown
// as connections come (ibv_resize_cq), and more CQs, each with its own
// poller goroutine and completion channel, once one has reached the
// device's max_cqe (32,767 entries on rxe: 306 connections with the
// default Options). placeCQ decides where a new connection goes; it is
// pure arithmetic, so that every branch is tested without a device.

// fixedCQE is the size of each CQ of a device that cannot resize them:
// rxe's maximum (32,768 entries, 1 MiB of completions on siw), not the
// device's own (siw's is 3,276,800: 100 MiB of kernel memory per CQ).
// On siw the first CQ of this size also keeps a bug of libsiw (rdma-core
// up to at least v44) away: it takes the mmap offset 0x90000 for its
// "invalid key", so the QP or CQ whose queue the kernel maps at page 144
// of the context fails to create (EINVAL, the 19th connection pair of a
// process); a first CQ of 257 pages, created before any QP, holds that
// page for as long as the device is open.
const fixedCQE = 32768

// cqLoad is what placement knows of one CQ: its size and the entries its
// connections have reserved.
type cqLoad struct{ cap, reserved int }

// cqPlacement is where a connection's CQ entries go: the CQ at index
// (grown to size first if size is above its cap), or, with index -1, a new
// CQ of size entries.
type cqPlacement struct{ index, size int }

// placeCQ places a connection needing cqe entries on CQs loaded as loads,
// none of which may pass maxCQE entries; a new CQ starts at initial
// entries (or cqe, if more). A CQ with room is preferred to growing one,
// and growing one (doubling, so that resizes stay rare) to creating one.
// Only a connection that alone needs more than maxCQE does not fit. A
// device that cannot resize a CQ (siw) gets no growth (grow unset): its
// CQs are created at fixedCQE instead (or its maximum, if less), so that
// each serves as many connections as a grown one would on rxe.
func placeCQ(loads []cqLoad, cqe, maxCQE, initial int, grow bool) (cqPlacement, error) {
	if cqe > maxCQE {
		return cqPlacement{}, &cqLimitError{need: cqe, max: maxCQE}
	}
	for i, l := range loads {
		if l.reserved+cqe <= l.cap {
			return cqPlacement{i, l.cap}, nil
		}
	}
	if !grow {
		return cqPlacement{-1, min(max(fixedCQE, cqe), maxCQE)}, nil
	}
	for i, l := range loads {
		if need := l.reserved + cqe; need <= maxCQE {
			return cqPlacement{i, min(max(need, 2*l.cap), maxCQE)}, nil
		}
	}
	return cqPlacement{-1, min(max(initial, cqe), maxCQE)}, nil
}
