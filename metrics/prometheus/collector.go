package rdmaprom

import (
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goverbs/rdma"
)

// Collector is a prometheus.Collector of the process's RDMA devices and
// of the listeners, PacketConns and connections registered with it. Its
// methods may be called from several goroutines at once, Collect too.
// The zero Collector is ready to use.
type Collector struct {
	mu     sync.Mutex
	groups map[string]*group
	// byConn holds ConnState's registrations, to find at StateClosed the
	// registration StateNew made.
	byConn map[net.Conn]*connReg
	// byAddr holds the RDMA connections registered since ConnClosed was
	// first called, by their addresses (connKey), for the Tracer's
	// ConnClosed to find; nil until then, so that AddConn formats no
	// address for a Collector whose ConnClosed is unused.
	byAddr map[string]*connReg
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a Collector with nothing registered: it reports
// the devices only.
func NewCollector() *Collector { return new(Collector) }

// group is what is registered under one name, and what its removed
// members counted: those stay in the name's counters, which so never go
// back.
type group struct {
	name                            string
	listeners                       map[*listenerReg]struct{}
	packets                         map[*packetReg]struct{}
	conns                           map[*connReg]struct{}
	hasListener, hasPacket, hasConn bool

	goneListener rdma.ListenerStats // HalfOpen unused
	gonePacket   rdma.PacketStats
	goneConn     rdma.ConnStats // RegisteredBytes unused
	closed       [2]uint64      // connections removed, by transport: rdma, tcp
}

type listenerReg struct{ l *rdma.Listener }

type packetReg struct {
	pc  *rdma.PacketConn
	udp bool
}

// connReg is a registered connection; c is nil for one that is not this
// package's RDMA connection (a fallback's TCP connection), which is only
// counted.
type connReg struct {
	c   *rdma.Conn
	g   *group
	key string // its byAddr key, if it has one
}

// connKey identifies a connection among those open in the process: no two
// have both addresses the same.
func connKey(local, remote net.Addr) string {
	if local == nil || remote == nil {
		return ""
	}
	return local.String() + " " + remote.String()
}

func (r *connReg) transport() int {
	if r.c == nil {
		return 1
	}
	return 0
}

// group returns name's group, made on first use; c.mu is held.
func (c *Collector) group(name string) *group {
	g := c.groups[name]
	if g == nil {
		if c.groups == nil {
			c.groups = make(map[string]*group)
		}
		g = &group{
			name:      name,
			listeners: make(map[*listenerReg]struct{}),
			packets:   make(map[*packetReg]struct{}),
			conns:     make(map[*connReg]struct{}),
		}
		c.groups[name] = g
	}
	return g
}

// AddListener reports l's counters under name (summed with any other
// listener of that name) until the function it returns is called; that
// function may be called more than once. What l counted until then stays
// in name's counters. Register a listener before it accepts, or what it
// accepted before is counted at the first scrape as if it had just
// happened.
func (c *Collector) AddListener(name string, l *rdma.Listener) (remove func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.group(name)
	g.hasListener = true
	r := &listenerReg{l}
	g.listeners[r] = struct{}{}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := g.listeners[r]; ok {
			delete(g.listeners, r)
			addListener(&g.goneListener, r.l.Stats())
		}
	}
}

// AddPacketConn reports pc's counters under name (summed with any other
// PacketConn of that name) until the function it returns is called; that
// function may be called more than once. What pc counted until then stays
// in name's counters.
func (c *Collector) AddPacketConn(name string, pc *rdma.PacketConn) (remove func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.group(name)
	g.hasPacket = true
	r := &packetReg{pc: pc, udp: pc.IsUDP()}
	g.packets[r] = struct{}{}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := g.packets[r]; ok {
			delete(g.packets, r)
			addPacket(&g.gonePacket, r.pc.Stats())
		}
	}
}

// AddConn counts conn among name's open connections, and its counters in
// name's, until the function it returns is called: call it once the
// connection is closed (a defer before the one that closes it), and what
// the connection counted stays in name's counters. The function may be
// called more than once. conn is an *rdma.Conn or a wrapper that gives
// one back with a NetConn method (a *tls.Conn); any other connection (the
// *net.TCPConn of a fallback) is counted with transport "tcp" and has no
// other counters.
func (c *Collector) AddConn(name string, conn net.Conn) (remove func()) {
	c.mu.Lock()
	r := c.addConn(name, conn)
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.removeConn(r)
	}
}

// ConnState returns a function for http.Server.ConnState that registers
// each connection the server takes under name, as AddConn does, and
// removes it when the server closes it or a handler hijacks it (what a
// hijacked connection does after is not counted). A server that has a
// ConnState function of its own calls this one from it.
func (c *Collector) ConnState(name string) func(net.Conn, http.ConnState) {
	return func(conn net.Conn, state http.ConnState) {
		c.mu.Lock()
		defer c.mu.Unlock()
		switch state {
		case http.StateNew:
			if c.byConn == nil {
				c.byConn = make(map[net.Conn]*connReg)
			}
			c.byConn[conn] = c.addConn(name, conn)
		case http.StateClosed, http.StateHijacked:
			if r := c.byConn[conn]; r != nil {
				delete(c.byConn, conn)
				c.removeConn(r)
			}
		}
	}
}

// ConnClosed returns a function for rdma.Tracer.ConnClosed that removes
// each connection registered with AddConn or ConnState when the library
// has released it, as the function AddConn returned would: a connection
// whose removal the application missed, or that failed while nobody was
// reading it, leaves the open ones then. Set it on the Tracer of the
// ListenConfig and Dialer whose connections are registered, and call it
// before registering them (those registered before are not looked for):
//
//	lc := rdma.ListenConfig{Tracer: &rdma.Tracer{ConnClosed: col.ConnClosed()}}
//
// It ignores the connections not registered. A removal the application
// makes as well, before or after, changes nothing more.
func (c *Collector) ConnClosed() func(rdma.ConnClosedInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byAddr == nil {
		c.byAddr = make(map[string]*connReg)
	}
	return func(info rdma.ConnClosedInfo) {
		key := connKey(info.Local, info.Remote)
		c.mu.Lock()
		defer c.mu.Unlock()
		if r := c.byAddr[key]; r != nil {
			c.removeConn(r)
		}
	}
}

// addConn registers conn under name; c.mu is held.
func (c *Collector) addConn(name string, conn net.Conn) *connReg {
	g := c.group(name)
	g.hasConn = true
	r := &connReg{c: rdmaConn(conn), g: g}
	g.conns[r] = struct{}{}
	if c.byAddr != nil && r.c != nil {
		if r.key = connKey(r.c.LocalAddr(), r.c.RemoteAddr()); r.key != "" {
			c.byAddr[r.key] = r
		}
	}
	return r
}

// removeConn folds r's counters into its group's; c.mu is held. Stats is
// read here, under the lock, so that no Collect sees the connection both
// open and removed.
func (c *Collector) removeConn(r *connReg) {
	g := r.g
	if _, ok := g.conns[r]; !ok {
		return
	}
	delete(g.conns, r)
	if r.key != "" && c.byAddr[r.key] == r {
		delete(c.byAddr, r.key)
	}
	g.closed[r.transport()]++
	if r.c != nil {
		addConn(&g.goneConn, r.c.Stats())
	}
}

// maxUnwrap bounds the wrappers rdmaConn looks through, in case one gives
// back itself.
const maxUnwrap = 8

// rdmaConn returns the RDMA connection conn is or wraps, or nil.
func rdmaConn(conn net.Conn) *rdma.Conn {
	for range maxUnwrap {
		switch v := conn.(type) {
		case *rdma.Conn:
			if !rdma.IsRDMA(v) {
				return nil
			}
			return v
		case interface{ NetConn() net.Conn }:
			conn = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// Describe sends the descriptions of every metric Collect may send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range deviceMetrics {
		ch <- m.desc
	}
	for _, d := range []*prometheus.Desc{
		listenerAccepted, listenerRefused, listenerEvicted, listenerHalfOpen,
		connOpen, connClosed, connRegistered, connWaits, connCreditWait,
		packetOpen, packetDropped, packetPeerLookups,
	} {
		ch <- d
	}
	for _, m := range connCounters {
		ch <- m.desc
	}
	for _, m := range packetCounters {
		ch <- m.desc
	}
}

// snapshot is a group's sums at one Collect.
type snapshot struct {
	name                            string
	hasListener, hasPacket, hasConn bool
	listener                        rdma.ListenerStats
	packet                          rdma.PacketStats
	conn                            rdma.ConnStats
	open, closed                    [2]uint64 // connections by transport: rdma, tcp
	packets                         [2]uint64 // PacketConns by transport: rdma, udp
}

// Collect sends the devices' gauges and each name's series. The sums are
// taken under the Collector's lock, one Stats call per registered member,
// and sent after it is released, so that a slow reader of ch holds up no
// registration.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	collect(ch, rdma.Devices(), c.snapshots())
}

func collect(ch chan<- prometheus.Metric, devs []rdma.DeviceStats, snaps []snapshot) {
	for i := range devs {
		d := &devs[i]
		for _, m := range deviceMetrics {
			gauge(ch, m.desc, float64(m.value(d)), d.Name)
		}
	}
	for i := range snaps {
		s := &snaps[i]
		if s.hasListener {
			collectListener(ch, s.name, &s.listener)
		}
		if s.hasPacket {
			collectPacket(ch, s)
		}
		if s.hasConn {
			collectConn(ch, s)
		}
	}
}

// snapshots sums each group's members and what its removed ones counted.
func (c *Collector) snapshots() []snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	snaps := make([]snapshot, 0, len(c.groups))
	for _, g := range c.groups {
		s := snapshot{
			name: g.name, hasListener: g.hasListener, hasPacket: g.hasPacket, hasConn: g.hasConn,
			listener: g.goneListener, packet: g.gonePacket, conn: g.goneConn, closed: g.closed,
		}
		for r := range g.listeners {
			ls := r.l.Stats()
			addListener(&s.listener, ls)
			s.listener.HalfOpen += ls.HalfOpen
		}
		for r := range g.packets {
			addPacket(&s.packet, r.pc.Stats())
			if r.udp {
				s.packets[1]++
			} else {
				s.packets[0]++
			}
		}
		for r := range g.conns {
			s.open[r.transport()]++
			if r.c != nil {
				cs := r.c.Stats()
				addConn(&s.conn, cs)
				s.conn.RegisteredBytes += cs.RegisteredBytes
			}
		}
		snaps = append(snaps, s)
	}
	return snaps
}

func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func collectListener(ch chan<- prometheus.Metric, name string, s *rdma.ListenerStats) {
	counter(ch, listenerAccepted, s.Accepted, name, transportRDMA)
	counter(ch, listenerAccepted, s.AcceptedTCP, name, transportTCP)
	for r, n := range s.Refused {
		counter(ch, listenerRefused, n, name, refuseReason(rdma.RefuseReason(r)))
	}
	counter(ch, listenerEvicted, s.Evicted, name)
	gauge(ch, listenerHalfOpen, float64(s.HalfOpen), name)
}

func collectPacket(ch chan<- prometheus.Metric, s *snapshot) {
	gauge(ch, packetOpen, float64(s.packets[0]), s.name, transportRDMA)
	gauge(ch, packetOpen, float64(s.packets[1]), s.name, transportUDP)
	for _, m := range packetCounters {
		counter(ch, m.desc, m.value(&s.packet), s.name)
	}
	for _, d := range packetDrops {
		counter(ch, packetDropped, d.value(&s.packet), s.name, d.reason)
	}
	counter(ch, packetPeerLookups, s.packet.PeerHits, s.name, "hit")
	counter(ch, packetPeerLookups, s.packet.PeerMisses, s.name, "miss")
}

func collectConn(ch chan<- prometheus.Metric, s *snapshot) {
	gauge(ch, connOpen, float64(s.open[0]), s.name, transportRDMA)
	gauge(ch, connOpen, float64(s.open[1]), s.name, transportTCP)
	counter(ch, connClosed, s.closed[0], s.name, transportRDMA)
	counter(ch, connClosed, s.closed[1], s.name, transportTCP)
	gauge(ch, connRegistered, float64(s.conn.RegisteredBytes), s.name)
	for _, m := range connCounters {
		counter(ch, m.desc, m.value(&s.conn), s.name)
	}
	counter(ch, connWaits, s.conn.Spins, s.name, "spin")
	counter(ch, connWaits, s.conn.Parks, s.name, "park")
	ch <- prometheus.MustNewConstMetric(connCreditWait, prometheus.CounterValue, s.conn.CreditWaitTime.Seconds(), s.name)
}

// addListener adds s's counters to sum's; HalfOpen, a gauge, is left out.
func addListener(sum *rdma.ListenerStats, s rdma.ListenerStats) {
	sum.Accepted += s.Accepted
	for r := range s.Refused {
		sum.Refused[r] += s.Refused[r]
	}
	sum.Evicted += s.Evicted
	sum.AcceptedTCP += s.AcceptedTCP
}

func addPacket(sum *rdma.PacketStats, s rdma.PacketStats) {
	sum.DatagramsSent += s.DatagramsSent
	sum.DatagramsReceived += s.DatagramsReceived
	sum.BytesSent += s.BytesSent
	sum.BytesReceived += s.BytesReceived
	sum.DropsNoReceive += s.DropsNoReceive
	sum.DropsTruncated += s.DropsTruncated
	sum.DropsReassembly += s.DropsReassembly
	sum.DropsMalformed += s.DropsMalformed
	sum.DropsStaleFragments += s.DropsStaleFragments
	sum.PeerHits += s.PeerHits
	sum.PeerMisses += s.PeerMisses
	sum.PeerFailures += s.PeerFailures
	sum.SendErrors += s.SendErrors
	sum.DropsNoListener += s.DropsNoListener
}

// addConn adds s's counters to sum's; RegisteredBytes, a gauge, is left
// out.
func addConn(sum *rdma.ConnStats, s rdma.ConnStats) {
	sum.BytesWritten += s.BytesWritten
	sum.BytesRead += s.BytesRead
	sum.MessagesSent += s.MessagesSent
	sum.MessagesReceived += s.MessagesReceived
	sum.CreditMessagesSent += s.CreditMessagesSent
	sum.SendPosts += s.SendPosts
	sum.CreditWaits += s.CreditWaits
	sum.CreditWaitTime += s.CreditWaitTime
	sum.CompletionErrors += s.CompletionErrors
	sum.KeepAliveProbes += s.KeepAliveProbes
	sum.RingGrowths += s.RingGrowths
	sum.RingShrinks += s.RingShrinks
	sum.Spins += s.Spins
	sum.Parks += s.Parks
}
