package rdma

import "sync/atomic"

// qpTable maps QP numbers to the completers their completions go to. The
// completion path looks a QP up for every batch it dispatches, so lookups
// take no lock: the table is a radix tree of four levels of 256 atomic
// pointers (a QP number is 24 bits on every device, 32 in the type), and
// a lookup is four atomic loads. Changes (a connection's setup and
// teardown) are made under the poller's connsMu, one writer at a time; a
// change that must not race a dispatch in progress waits for it apart
// (see poller.remove).
//
// An RWMutex around a map did the same with two atomic additions per
// batch on one cache line that every poller and spinner of the CQ
// writes: a READ over the zero-cost provider took 6 % less without it.
type qpTable struct {
	root qpNode
	n    int // entries, under connsMu
}

// qpNode is a level of the tree: the inner levels point to nodes, the
// last one to entries.
type qpNode struct {
	next [256]atomic.Pointer[qpNode]
	ent  *[256]atomic.Pointer[qpEntry] // the last level's, else nil
}

// qpEntry holds a completer: an interface value cannot be stored
// atomically, a pointer to one can.
type qpEntry struct{ c completer }

// retiredEntry is the one entry of every retired QP (see retiredQP).
var retiredEntry = &qpEntry{retiredQP{}}

// slot returns the entry pointer of qpNum, creating the path to it when
// create is set (under connsMu), or nil where there is none.
func (t *qpTable) slot(qpNum uint32, create bool) *atomic.Pointer[qpEntry] {
	n := &t.root
	for shift := 24; shift > 0; shift -= 8 {
		i := byte(qpNum >> shift)
		next := n.next[i].Load()
		if next == nil {
			if !create {
				return nil
			}
			next = &qpNode{}
			if shift == 8 {
				next.ent = new([256]atomic.Pointer[qpEntry])
			}
			n.next[i].Store(next)
		}
		n = next
	}
	return &n.ent[byte(qpNum)]
}

// get returns qpNum's completer, or nil.
func (t *qpTable) get(qpNum uint32) completer {
	if s := t.slot(qpNum, false); s != nil {
		if e := s.Load(); e != nil {
			return e.c
		}
	}
	return nil
}

// set makes c qpNum's completer (connsMu held).
func (t *qpTable) set(qpNum uint32, c completer) {
	e := retiredEntry
	if _, retired := c.(retiredQP); !retired {
		e = &qpEntry{c}
	}
	if t.slot(qpNum, true).Swap(e) == nil {
		t.n++
	}
}

// del removes qpNum's completer, if any (connsMu held). The tree's nodes
// stay: QP numbers come back (siw hands the same ones out again at once).
func (t *qpTable) del(qpNum uint32) {
	if s := t.slot(qpNum, false); s != nil && s.Swap(nil) != nil {
		t.n--
	}
}

// each calls f for every completer (connsMu held).
func (t *qpTable) each(f func(completer)) {
	if t.n == 0 {
		return
	}
	var walk func(n *qpNode)
	walk = func(n *qpNode) {
		if n.ent != nil {
			for i := range n.ent {
				if e := n.ent[i].Load(); e != nil {
					f(e.c)
				}
			}
			return
		}
		for i := range n.next {
			if next := n.next[i].Load(); next != nil {
				walk(next)
			}
		}
	}
	walk(&t.root)
}
