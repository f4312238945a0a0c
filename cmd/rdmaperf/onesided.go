package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goverbs/rdma"
)

// One-sided tests: RDMA WRITE and READ between registered regions
// (rdma.RemoteRegion's WriteAtContext and ReadAtContext), measured the way
// perftest's ib_write_lat, ib_read_lat, ib_write_bw and ib_read_bw measure
// them, so that the figures compare:
//
//   - write-lat is a ping-pong of WRITEs: the client writes its block into
//     the server's region, the server, polling the block's last word, writes
//     one back, and so on; half the round trip is reported, as ib_write_lat
//     does;
//   - read-lat times each READ from posting to completion, as ib_read_lat
//     does (no halving: a READ is a round trip);
//   - write-bw and read-bw keep oneSidedInFlight operations of -size bytes
//     in flight on one connection, all on the same bytes of both regions,
//     as perftest's bandwidth tests do, and report MB/s;
//   - atomic-lat times each fetch-and-add on the server's word from posting
//     to completion, as ib_atomic_lat does; atomic-rate keeps
//     oneSidedInFlight of them in flight, as ib_atomic_bw does, and reports
//     operations per second (-size does not apply: the word is 8 bytes).

// oneSidedInFlight is how many operations a bandwidth test keeps in flight:
// as many as a connection has slots for.
const oneSidedInFlight = 16

// oneSidedTests are the -test values of the one-sided tests.
var oneSidedTests = []string{"write-lat", "read-lat", "write-bw", "read-bw", "atomic-lat", "atomic-rate"}

func isOneSided(test string) bool { return slices.Contains(oneSidedTests, test) }

// seqWord is the 8-byte word at the end of a block (size a multiple of 8,
// the block 8-byte aligned) that a ping-pong's sides poll: RDMA WRITE
// places a block's bytes in order on the NICs this runs on (perftest's
// latency tests rely on the same), so once the word has changed the block
// has arrived.
func seqWord(block []byte) *uint64 {
	return (*uint64)(unsafe.Pointer(&block[len(block)-8]))
}

// serveRegion is the server's side of a one-sided test: a region of size
// bytes (twice that for the ping-pong: the block the client writes, then
// the block the server sends back), its key to the client, and then either
// nothing to do until the client hangs up or, for the ping-pong, an answer
// to each of the client's WRITEs.
func serveRegion(c net.Conn, size int, pong bool) error {
	rc, ok := c.(*rdma.Conn)
	if !ok {
		return fmt.Errorf("one-sided tests need rdma, not %T", c)
	}
	n := size
	if pong {
		n = 2 * size
	}
	// With the atomics' right where the device has them (not siw).
	reg, err := rc.RegisterRegion(n, rdma.RemoteRead|rdma.RemoteWrite|rdma.RemoteAtomic)
	if errors.Is(err, rdma.ErrUnsupported) {
		reg, err = rc.RegisterRegion(n, rdma.RemoteRead|rdma.RemoteWrite)
	}
	if err != nil {
		return err
	}
	defer reg.Close()
	key, err := reg.Key().MarshalBinary()
	if err != nil {
		return err
	}
	if _, err := c.Write(key); err != nil {
		return err
	}
	if !pong {
		_, err := io.Copy(io.Discard, c)
		return err
	}
	peer, err := readRemote(rc)
	if err != nil {
		return err
	}
	// The client hangs up when it is done; the spin below looks at stop.
	var stop atomic.Bool
	go func() {
		io.Copy(io.Discard, c)
		stop.Store(true)
	}()
	mem := reg.Bytes()
	in, out := seqWord(mem[:size]), seqWord(mem[size:])
	ctx := context.Background()
	for seq := uint64(1); ; seq++ {
		for atomic.LoadUint64(in) != seq {
			if stop.Load() {
				return nil
			}
		}
		atomic.StoreUint64(out, seq)
		if err := peer.WriteAtContext(ctx, reg, int64(size), size, int64(size)); err != nil {
			if stop.Load() {
				return nil
			}
			return err
		}
	}
}

// readRemote reads a region's key from c.
func readRemote(c *rdma.Conn) (*rdma.RemoteRegion, error) {
	b := make([]byte, rdma.RemoteKeyLen)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, fmt.Errorf("reading the region's key: %w", err)
	}
	var k rdma.RemoteKey
	if err := k.UnmarshalBinary(b); err != nil {
		return nil, err
	}
	return c.Remote(k), nil
}

// oneSided runs a one-sided test.
func (r *run) oneSided(test string) (map[string]float64, error) {
	pong := test == "write-lat"
	k := kindRegion
	if pong {
		k = kindRegionPong
	}
	c, err := r.open(header{kind: k, size: r.size})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	rc, ok := c.(*rdma.Conn)
	if !ok {
		return nil, errors.New("one-sided tests need -net rdma")
	}
	peer, err := readRemote(rc)
	if err != nil {
		return nil, err
	}
	switch test {
	case "write-lat":
		return r.writePingPong(rc, peer)
	case "read-lat":
		return r.readLatency(rc, peer)
	case "atomic-lat":
		ctx := context.Background()
		return r.timeOps(func() error {
			_, err := peer.FetchAdd(ctx, 0, 1)
			return err
		}, false, "operation")
	}
	return r.oneSidedBandwidth(rc, peer, test)
}

// writePingPong is write-lat: see the top of the file.
func (r *run) writePingPong(c *rdma.Conn, peer *rdma.RemoteRegion) (map[string]float64, error) {
	size := r.size
	local, err := c.RegisterRegion(2*size, rdma.RemoteWrite)
	if err != nil {
		return nil, err
	}
	defer local.Close()
	key, err := local.Key().MarshalBinary()
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(key); err != nil {
		return nil, err
	}
	mem := local.Bytes()
	out, in := seqWord(mem[:size]), seqWord(mem[size:])
	ctx := context.Background()
	seq := uint64(0)
	roundTrip := func() error {
		seq++
		atomic.StoreUint64(out, seq)
		if err := peer.WriteAtContext(ctx, local, 0, size, 0); err != nil {
			return err
		}
		// The answer comes within a round trip; a server that died
		// would leave the spin to run for ever.
		for i := 0; atomic.LoadUint64(in) != seq; i++ {
			if i%(1<<16) == 0 && i > 0 && c.Stats().CompletionErrors > 0 {
				return errors.New("the connection failed during the ping-pong")
			}
		}
		return nil
	}
	return r.timeOps(roundTrip, true, "operation")
}

// readLatency is read-lat: each READ of -size bytes timed alone.
func (r *run) readLatency(c *rdma.Conn, peer *rdma.RemoteRegion) (map[string]float64, error) {
	local, err := c.RegisterRegion(r.size, 0)
	if err != nil {
		return nil, err
	}
	defer local.Close()
	ctx := context.Background()
	return r.timeOps(func() error { return peer.ReadAtContext(ctx, local, 0, r.size, 0) }, false, "operation")
}

// oneSidedBandwidth is write-bw, read-bw and atomic-rate:
// oneSidedInFlight goroutines, each with one operation in flight at a time.
func (r *run) oneSidedBandwidth(c *rdma.Conn, peer *rdma.RemoteRegion, test string) (map[string]float64, error) {
	local, err := c.RegisterRegion(r.size, 0)
	if err != nil {
		return nil, err
	}
	defer local.Close()
	ctx := context.Background()
	size := r.size
	op := func() error {
		switch test {
		case "write-bw":
			return peer.WriteAtContext(ctx, local, 0, r.size, 0)
		case "atomic-rate":
			_, err := peer.FetchAdd(ctx, 0, 1)
			return err
		}
		return peer.ReadAtContext(ctx, local, 0, r.size, 0)
	}
	if test == "atomic-rate" {
		size = rdma.AtomicSize
	}
	for range min(r.warmup, 10) {
		if err := op(); err != nil {
			return nil, err
		}
	}
	var (
		wg    sync.WaitGroup
		ops   atomic.Int64
		errMu sync.Mutex
		first error
	)
	cpu0 := cpuNow()
	start := time.Now()
	deadline := start.Add(r.duration)
	per := 0
	if r.count > 0 {
		per = max(1, r.count/oneSidedInFlight)
	}
	for range oneSidedInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; (per > 0 && i < per) || (per == 0 && time.Now().Before(deadline)); i++ {
				if err := op(); err != nil {
					errMu.Lock()
					first = cmpOr(first, err)
					errMu.Unlock()
					return
				}
				ops.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if first != nil {
		return nil, first
	}
	n := ops.Load()
	return map[string]float64{
		"mb_s":    float64(n) * float64(size) / elapsed.Seconds() / 1e6,
		"msg_s":   float64(n) / elapsed.Seconds(),
		"count":   float64(n),
		"seconds": elapsed.Seconds(),
		"cpu_s":   r.cpuSince(cpu0),
	}, nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
