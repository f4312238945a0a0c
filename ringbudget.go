package rdma

import "time"

// A peer decides when this side registers a ring: its offer of a receive
// ring bigger than the arena's send ring makes this side register a send
// ring to match (and, once the peer moves on, deregister it), and its
// stream of large messages makes this side register a bigger receive
// ring. A ring is up to 1 MiB (32 MiB at the largest BufferSize), and
// registering and deregistering it pin and unpin every page: a peer that
// offered and withdrew rings as fast as its messages go would keep a
// core and the device's memory tables busy for as long as it liked. An
// honest peer changes rings at most about once per shrinkIdle (a grown
// ring is given back only after that long without data), so a budget of
// ringBurst registrations, refilled at one per ringRefill, never stands
// in its way, and caps a hostile one at a registration per ringRefill.

// ringBurst and ringRefill size a connection's budget of ring
// registrations caused by its peer. ringRefill is a variable for the
// tests.
const ringBurst = 8

var ringRefill = time.Second

// ringBudget is a token bucket of ring registrations: it holds up to
// ringBurst, starts full, and gains one per ringRefill. The zero value is
// a full bucket.
type ringBudget struct {
	used  int       // tokens taken and not refilled yet
	since time.Time // when the oldest of them began to refill
}

// take spends a token at now and reports whether there was one.
func (b *ringBudget) take(now time.Time) bool {
	if b.used > 0 && ringRefill > 0 {
		n := int(now.Sub(b.since) / ringRefill)
		if n >= b.used {
			b.used = 0
		} else if n > 0 {
			b.used -= n
			b.since = b.since.Add(time.Duration(n) * ringRefill)
		}
	}
	if b.used >= ringBurst {
		return false
	}
	if b.used == 0 {
		b.since = now
	}
	b.used++
	return true
}
