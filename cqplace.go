package rdma

// A device's connections share completion queues: one CQ at first, grown
// as connections come (ibv_resize_cq), and more CQs, each with its own
// poller goroutine and completion channel, once one has reached the
// device's max_cqe (32,767 entries on rxe: 306 connections with the
// default Options). placeCQ decides where a new connection goes; it is
// pure arithmetic, so that every branch is tested without a device.

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
// CQs are created at the maximum instead, so that each serves as many
// connections as a grown one would.
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
		return cqPlacement{-1, maxCQE}, nil
	}
	for i, l := range loads {
		if need := l.reserved + cqe; need <= maxCQE {
			return cqPlacement{i, min(max(need, 2*l.cap), maxCQE)}, nil
		}
	}
	return cqPlacement{-1, min(max(initial, cqe), maxCQE)}, nil
}
