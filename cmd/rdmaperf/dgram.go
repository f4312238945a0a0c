package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/goverbs/rdma"
)

// Datagram tests: a ping-pong of datagrams (dgram-lat) and a one-way blast
// of them (dgram-rate, dgram-bw), over this library's PacketConn (RDMA
// unreliable datagrams) or, with -net tcp, over Go's kernel UDP. Each test
// still opens a connection of the transport first, which carries the
// header and, at the end, the receiver's counts: the datagrams themselves
// go between a PacketConn (or a *net.UDPConn) that the server opens for
// the test, on the connection's local address and a free port, and one the
// client opens on its side of the connection's address. After the ready
// byte the server sends the port of its datagram end (dgramPortLen bytes).
//
// Datagrams may be lost. The ping-pong resends nothing: a round trip whose
// datagram or answer does not come back within dgramLostAfter is counted
// as lost and not timed. The blast's receiver counts what arrived, and the
// client reports both the rate it sent at and the rate that arrived.

const (
	dgramPortLen   = 2
	dgramCountsLen = 32 // the sink's reply: datagrams, bytes, span (ns), drops; big-endian
	// dgramLostAfter is how long a round trip waits for its answer before
	// it counts as lost.
	dgramLostAfter = time.Second
	// dgramSettle is how long the client waits after its last datagram
	// before it asks the sink for its counts: what is still in flight then
	// arrives in time to count.
	dgramSettle = 100 * time.Millisecond
	// maxDatagram is the largest datagram, UDP's over IPv4 and the
	// library's.
	maxDatagram = 65507
	// dgramReadBatch is how many datagrams the sink takes per ReadBatch.
	dgramReadBatch = 64
)

var dgramTests = []string{"dgram-lat", "dgram-rate", "dgram-bw"}

func isDgram(test string) bool { return slices.Contains(dgramTests, test) }

// dgramConn is a datagram end point of either transport, with batches.
type dgramConn interface {
	net.PacketConn
	// writeBatch sends each of bufs as one datagram to to; it returns how
	// many went.
	writeBatch(bufs [][]byte, to net.Addr) (int, error)
	// readBatch reads up to len(bufs) datagrams, at least one, into bufs
	// and their lengths into sizes.
	readBatch(bufs [][]byte, sizes []int) (int, error)
	// addr is the address of a peer's end point, in the type WriteTo
	// takes best.
	addr(ip net.IP, port int) net.Addr
	// drops is what the end point counted as dropped on receipt, if it
	// counts that.
	drops() uint64
}

// openDgram opens a datagram end point beside a connection of the
// transport: a PacketConn for an rdma connection, a UDP socket for a TCP
// one, on the connection's local IP address and a free port.
func openDgram(c net.Conn) (dgramConn, error) {
	switch c.(type) {
	case *rdma.Conn:
		a, ok := c.LocalAddr().(*rdma.Addr)
		if !ok {
			return nil, fmt.Errorf("unexpected local address %T", c.LocalAddr())
		}
		pc, err := rdma.ListenPacket("rdma", net.JoinHostPort(a.IP.String(), "0"))
		if err != nil {
			return nil, err
		}
		return &rdmaDgram{PacketConn: pc}, nil
	case *net.TCPConn:
		a := c.LocalAddr().(*net.TCPAddr)
		uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: a.IP, Zone: a.Zone})
		if err != nil {
			return nil, err
		}
		// Room for a blast's bursts, as a UDP server is usually given
		// (capped by net.core.rmem_max).
		uc.SetReadBuffer(4 << 20)
		uc.SetWriteBuffer(4 << 20)
		d := &udpDgram{UDPConn: uc}
		if a.IP.To4() != nil {
			p := ipv4.NewPacketConn(uc)
			d.wb, d.rb = p.WriteBatch, p.ReadBatch
		} else {
			p := ipv6.NewPacketConn(uc)
			d.wb, d.rb = p.WriteBatch, p.ReadBatch
		}
		return d, nil
	}
	return nil, fmt.Errorf("datagram tests need an rdma or tcp connection, not %T", c)
}

// rdmaDgram is this library's PacketConn, its batches through WriteBatch
// and ReadBatch.
type rdmaDgram struct {
	*rdma.PacketConn
	wms, rms []rdma.Message
}

func (d *rdmaDgram) writeBatch(bufs [][]byte, to net.Addr) (int, error) {
	if len(d.wms) < len(bufs) {
		d.wms = make([]rdma.Message, len(bufs))
	}
	ms := d.wms[:len(bufs)]
	for i := range ms {
		ms[i].Buffers, ms[i].Addr = bufs[i:i+1], to
	}
	return d.WriteBatch(ms, 0)
}

func (d *rdmaDgram) readBatch(bufs [][]byte, sizes []int) (int, error) {
	if len(d.rms) < len(bufs) {
		d.rms = make([]rdma.Message, len(bufs))
	}
	ms := d.rms[:len(bufs)]
	for i := range ms {
		ms[i].Buffers = bufs[i : i+1]
	}
	n, err := d.ReadBatch(ms, 0)
	for i := range n {
		sizes[i] = ms[i].N
	}
	return n, err
}

func (d *rdmaDgram) addr(ip net.IP, port int) net.Addr { return &rdma.Addr{IP: ip, Port: port} }

func (d *rdmaDgram) drops() uint64 {
	s := d.Stats()
	return s.DropsNoReceive + s.DropsReassembly + s.DropsTruncated + s.DropsMalformed
}

// udpDgram is Go's UDP socket, its batches through golang.org/x/net's
// sendmmsg and recvmmsg (ipv4 or ipv6 PacketConn's WriteBatch and
// ReadBatch).
type udpDgram struct {
	*net.UDPConn
	wb, rb   func([]ipv4.Message, int) (int, error)
	wms, rms []ipv4.Message
}

func (d *udpDgram) writeBatch(bufs [][]byte, to net.Addr) (int, error) {
	if len(d.wms) < len(bufs) {
		d.wms = make([]ipv4.Message, len(bufs))
	}
	ms := d.wms[:len(bufs)]
	for i := range ms {
		ms[i].Buffers, ms[i].Addr = bufs[i:i+1], to
	}
	// sendmmsg may send fewer than asked: the rest go in the next calls.
	sent := 0
	for sent < len(ms) {
		n, err := d.wb(ms[sent:], 0)
		sent += n
		if err != nil {
			return sent, err
		}
	}
	return sent, nil
}

func (d *udpDgram) readBatch(bufs [][]byte, sizes []int) (int, error) {
	if len(d.rms) < len(bufs) {
		d.rms = make([]ipv4.Message, len(bufs))
	}
	ms := d.rms[:len(bufs)]
	for i := range ms {
		ms[i].Buffers = bufs[i : i+1]
	}
	n, err := d.rb(ms, 0)
	for i := range n {
		sizes[i] = ms[i].N
	}
	return n, err
}

func (d *udpDgram) addr(ip net.IP, port int) net.Addr { return &net.UDPAddr{IP: ip, Port: port} }

// drops: the socket's own drops are the kernel's (its UDP RcvbufErrors,
// for all sockets), not counted here.
func (d *udpDgram) drops() uint64 { return 0 }

// localPort is the port of a datagram end point.
func localPort(d dgramConn) int {
	switch a := d.LocalAddr().(type) {
	case *rdma.Addr:
		return a.Port
	case *net.UDPAddr:
		return a.Port
	}
	return 0
}

// remoteIP is the IP address of a connection's peer.
func remoteIP(c net.Conn) net.IP {
	switch a := c.RemoteAddr().(type) {
	case *rdma.Addr:
		return a.IP
	case *net.TCPAddr:
		return a.IP
	}
	return nil
}

// serveDgram is the server's side of a datagram test: it opens the
// datagram end point, sends its port, and echoes (kindDgramEcho) or counts
// (kindDgramSink) datagrams until the client closes its writing side of c;
// a sink then sends its counts.
func serveDgram(c net.Conn, size int, echo bool) error {
	d, err := openDgram(c)
	if err != nil {
		return err
	}
	defer d.Close()
	var port [dgramPortLen]byte
	binary.BigEndian.PutUint16(port[:], uint16(localPort(d)))
	if _, err := c.Write(port[:]); err != nil {
		return err
	}
	// The client's half-close (or its going away) ends the test: the
	// datagram end's reads are cut short by a deadline in the past.
	stopped := make(chan error, 1)
	go func() {
		var b [1]byte
		_, err := c.Read(b[:])
		if err == io.EOF {
			err = nil
		} else if err == nil {
			err = errors.New("data from the client during a datagram test")
		}
		d.SetReadDeadline(time.Unix(1, 0))
		stopped <- err
	}()
	if echo {
		buf := make([]byte, maxDatagram)
		for {
			n, from, err := d.ReadFrom(buf)
			if err != nil {
				break
			}
			if _, err := d.WriteTo(buf[:n], from); err != nil {
				break
			}
		}
		return <-stopped
	}
	bufs := make([][]byte, dgramReadBatch)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	sizes := make([]int, dgramReadBatch)
	var count, bytes uint64
	var first, last time.Time
	for {
		n, err := d.readBatch(bufs, sizes)
		if n > 0 {
			last = time.Now()
			if count == 0 {
				first = last
			}
			count += uint64(n)
			for _, s := range sizes[:n] {
				bytes += uint64(s)
			}
		}
		if err != nil {
			break
		}
	}
	if err := <-stopped; err != nil {
		return err
	}
	var reply [dgramCountsLen]byte
	binary.BigEndian.PutUint64(reply[0:], count)
	binary.BigEndian.PutUint64(reply[8:], bytes)
	binary.BigEndian.PutUint64(reply[16:], uint64(last.Sub(first)))
	binary.BigEndian.PutUint64(reply[24:], d.drops())
	_, err = c.Write(reply[:])
	return err
}

// openDgramTest opens the test's connection with header h, the client's
// datagram end point, and the address of the server's.
func (r *run) openDgramTest(h header) (net.Conn, dgramConn, net.Addr, error) {
	c, err := r.open(h)
	if err != nil {
		return nil, nil, nil, err
	}
	var port [dgramPortLen]byte
	if _, err := io.ReadFull(c, port[:]); err != nil {
		c.Close()
		return nil, nil, nil, fmt.Errorf("waiting for the server's datagram port (an older server closes the connection here): %w", err)
	}
	d, err := openDgram(c)
	if err != nil {
		c.Close()
		return nil, nil, nil, err
	}
	to := d.addr(remoteIP(c), int(binary.BigEndian.Uint16(port[:])))
	r.obs.connect(d.LocalAddr(), to)
	return c, d, to, nil
}

// errLost is a round trip that timed out: counted, not timed.
var errLost = errors.New("datagram lost")

// dgramLatency measures ping-pong round trips of size-byte datagrams and
// reports half of each, as ib_send_lat does. Each datagram carries its
// sequence number (in its first 8 bytes, if it has them), so a late answer
// to a lost round trip is told apart from the current one.
func (r *run) dgramLatency() (map[string]float64, error) {
	c, d, to, err := r.openDgramTest(header{kind: kindDgramEcho, size: r.size})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	defer d.Close()
	msg := make([]byte, r.size)
	back := make([]byte, maxDatagram)
	var seq uint64
	var lost int
	var deadline time.Time
	roundTrip := func() error {
		seq++
		if len(msg) >= 8 {
			binary.BigEndian.PutUint64(msg, seq)
		}
		// A deadline per round trip would cost a timer reset each:
		// refreshed only when less than dgramLostAfter is left.
		if now := time.Now(); deadline.Sub(now) < dgramLostAfter {
			deadline = now.Add(2 * dgramLostAfter)
			if err := d.SetReadDeadline(deadline); err != nil {
				return err
			}
		}
		if _, err := d.WriteTo(msg, to); err != nil {
			return err
		}
		for {
			n, _, err := d.ReadFrom(back)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				lost++
				deadline = time.Time{}
				return errLost
			}
			if err != nil {
				return err
			}
			if n == len(msg) && (n < 8 || binary.BigEndian.Uint64(back) == seq) {
				return nil
			}
		}
	}
	m, err := r.timeOps(roundTrip, true, "round trip")
	if err != nil {
		return nil, err
	}
	m["lost"] = float64(lost)
	return m, nil
}

// dgramStream sends size-byte datagrams to the server's sink for the
// test's duration (or count), r.batch to a WriteBatch (one WriteTo each
// with a batch of 1), then asks the sink what arrived. It reports the rate
// sent (msg_s, mb_s) and the rate received (recv_msg_s, recv_mb_s: what
// arrived over the longer of the sending time and the time from the first
// arrival to the last), and the share lost.
func (r *run) dgramStream() (map[string]float64, error) {
	c, d, to, err := r.openDgramTest(header{kind: kindDgramSink, size: r.size})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	defer d.Close()
	batch := max(r.batch, 1)
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = make([]byte, r.size)
	}
	var sent uint64
	cpu0 := cpuNow()
	start := time.Now()
	deadline := start.Add(r.duration)
	for i := 0; r.more(i, deadline); i++ {
		if batch == 1 {
			if _, err := d.WriteTo(bufs[0], to); err != nil {
				return nil, err
			}
			sent++
			continue
		}
		n, err := d.writeBatch(bufs, to)
		sent += uint64(n)
		if err != nil {
			return nil, err
		}
	}
	elapsed := time.Since(start)
	cpu := r.cpuSince(cpu0)
	time.Sleep(dgramSettle)
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return nil, fmt.Errorf("%T cannot close its writing side", c)
	}
	if err := cw.CloseWrite(); err != nil {
		return nil, err
	}
	var reply [dgramCountsLen]byte
	if _, err := io.ReadFull(c, reply[:]); err != nil {
		return nil, fmt.Errorf("waiting for the sink's counts: %w", err)
	}
	got := binary.BigEndian.Uint64(reply[0:])
	gotBytes := binary.BigEndian.Uint64(reply[8:])
	span := time.Duration(binary.BigEndian.Uint64(reply[16:]))
	recvSecs := max(elapsed, span).Seconds()
	if r.obs != nil {
		r.obs.dgram = &sinkCounts{datagrams: int64(got), bytes: int64(gotBytes), seconds: recvSecs}
	}
	m := map[string]float64{
		"msg_s":      float64(sent) / elapsed.Seconds(),
		"mb_s":       float64(sent) * float64(r.size) / elapsed.Seconds() / 1e6,
		"recv_msg_s": float64(got) / recvSecs,
		"recv_mb_s":  float64(gotBytes) / recvSecs / 1e6,
		"count":      float64(sent),
		"recv_count": float64(got),
		"loss_pct":   0,
		"drops":      float64(binary.BigEndian.Uint64(reply[24:])),
		"seconds":    elapsed.Seconds(),
		"cpu_s":      cpu,
	}
	if sent > 0 {
		m["loss_pct"] = 100 * (1 - float64(got)/float64(sent))
	}
	return m, nil
}
