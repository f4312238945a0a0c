package rdma_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Two-host tests: the test bed's pair of VMs (testbed/vm.sh --pair) runs
// this binary on both. The driver (host a) runs the tests; the agent
// (host b) serves them: an RDMA echo server, an RDMA server that accepts
// and then never reads nor writes, and a TCP control port on which the
// driver asks it to dial back or to report how its connections ended.
// Faults are made on the driver's side: netem on its eth0 (loss,
// partitions), and the harness kills the agent's VM on request.

var peerAddr = os.Getenv("RDMA_TEST_PEER_ADDR")

const (
	agentControlPort = "7470"
	agentEchoPort    = "7471"
	agentStallPort   = "7472"
	agentPacketPort  = "7473"
	agentAtomicPort  = "7474"
)

// keepaliveBound is the default keepalive's promise: a peer that vanished
// fails a connection that only reads within 30 s.
const keepaliveBound = 30 * time.Second

func needPeer(t *testing.T) {
	t.Helper()
	if peerAddr == "" || testAddr == "" {
		t.Skip("no second host: set RDMA_TEST_PEER_ADDR (make test runs these in the test bed's pair of VMs)")
	}
}

// runAgent is host b's side: it serves until its VM is stopped.
func runAgent() int {
	addr := os.Getenv("RDMA_TEST_ADDR")
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "agent:", err)
		return 1
	}
	echo, err := rdma.Listen("rdma", net.JoinHostPort(addr, agentEchoPort))
	if err != nil {
		return fail(err)
	}
	stall, err := rdma.Listen("rdma", net.JoinHostPort(addr, agentStallPort))
	if err != nil {
		return fail(err)
	}
	packets, err := rdma.ListenPacket("rdma", net.JoinHostPort(addr, agentPacketPort))
	if err != nil {
		return fail(err)
	}
	go func() {
		// Echoes every datagram to its sender.
		buf := make([]byte, 65507)
		for {
			n, from, err := packets.ReadFrom(buf)
			if err != nil {
				return
			}
			packets.WriteTo(buf[:n], from)
		}
	}()
	atomics, err := rdma.Listen("rdma", net.JoinHostPort(addr, agentAtomicPort))
	if err != nil {
		return fail(err)
	}
	go serveCounter(atomics)
	ctl, err := net.Listen("tcp", net.JoinHostPort(addr, agentControlPort))
	if err != nil {
		return fail(err)
	}
	var mu sync.Mutex
	var results []string // how echoed connections ended: "raddr etimedout=bool error"
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				_, err := io.Copy(c, c)
				mu.Lock()
				results = append(results, fmt.Sprintf("%s etimedout=%v %v", c.RemoteAddr(), errors.Is(err, syscall.ETIMEDOUT), err))
				mu.Unlock()
				c.Close()
			}()
		}
	}()
	go func() {
		// Accepted connections stay open until the agent ends, never read
		// nor written: the peer's Writes stall.
		for {
			if _, err := stall.Accept(); err != nil {
				return
			}
		}
	}()
	fmt.Println("agent: serving")
	for {
		cc, err := ctl.Accept()
		if err != nil {
			return fail(err)
		}
		go func() {
			defer cc.Close()
			line, err := bufio.NewReader(cc).ReadString('\n')
			if err != nil {
				return
			}
			f := strings.Fields(line)
			switch {
			case len(f) == 2 && f[0] == "stream":
				// Dial back and write until the connection fails.
				c, err := rdma.Dial("rdma", f[1])
				if err != nil {
					fmt.Fprintf(cc, "error %v\n", err)
					return
				}
				fmt.Fprintln(cc, "ok")
				go func() {
					buf := make([]byte, 64<<10)
					for {
						if _, err := c.Write(buf); err != nil {
							c.Close()
							return
						}
					}
				}()
			case len(f) >= 3 && f[0] == "netem":
				// A fault on the agent's side of the link for a while
				// (the control connection cannot undo it meanwhile).
				// The reply goes first: it could not leave afterwards.
				d, err := time.ParseDuration(f[1])
				if err != nil {
					fmt.Fprintf(cc, "error %v\n", err)
					return
				}
				fmt.Fprintln(cc, "ok")
				cc.Close()
				time.Sleep(100 * time.Millisecond)
				if out, err := exec.Command("tc", append([]string{"qdisc", "replace", "dev", "eth0", "root", "netem"}, f[2:]...)...).CombinedOutput(); err != nil {
					fmt.Fprintf(os.Stderr, "agent: tc: %v: %s\n", err, out)
				}
				time.AfterFunc(d, func() { exec.Command("tc", "qdisc", "del", "dev", "eth0", "root").Run() })
			case len(f) == 1 && f[0] == "results":
				mu.Lock()
				for _, r := range results {
					fmt.Fprintln(cc, r)
				}
				mu.Unlock()
			default:
				fmt.Fprintf(cc, "error unknown command %q\n", line)
			}
		}()
	}
}

// serveCounter gives every connection it accepts the key of one 8-byte
// counter that all of them share (RemoteAtomic and RemoteRead), and holds
// the connection until the peer closes it.
func serveCounter(ln net.Listener) {
	var root *rdma.Region
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		c := nc.(*rdma.Conn)
		var r *rdma.Region
		if root == nil {
			r, err = c.RegisterRegion(4096, rdma.RemoteAtomic|rdma.RemoteRead)
			root = r
		} else {
			r, err = c.ShareRegion(root, rdma.RemoteAtomic|rdma.RemoteRead)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "agent: counter:", err)
			c.Close()
			continue
		}
		go func() {
			defer c.Close()
			kb, _ := r.Key().MarshalBinary()
			if _, err := c.Write(kb); err == nil {
				io.Copy(io.Discard, c)
			}
			if r != root {
				r.Close()
			}
		}()
	}
}

// agent sends one command to the agent and returns its reply, waiting for
// the agent to come up.
func agent(t *testing.T, cmd string) string {
	t.Helper()
	var c net.Conn
	var err error
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(peerAddr, agentControlPort), 5*time.Second)
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	require.NoError(t, err, "the agent's control port")
	defer c.Close()
	_, err = fmt.Fprintln(c, cmd)
	require.NoError(t, err)
	out, err := io.ReadAll(c)
	require.NoError(t, err)
	return string(out)
}

// netem sets (or, with no arguments, clears) a netem qdisc on the
// driver's link; the test's end clears it.
func netem(t *testing.T, args ...string) {
	t.Helper()
	cmd := append([]string{"qdisc", "replace", "dev", "eth0", "root", "netem"}, args...)
	if len(args) == 0 {
		cmd = []string{"qdisc", "del", "dev", "eth0", "root"}
	}
	out, err := exec.Command("tc", cmd...).CombinedOutput()
	require.NoError(t, err, "tc %v: %s", cmd, out)
}

func clearNetem(t *testing.T) {
	t.Cleanup(func() { exec.Command("tc", "qdisc", "del", "dev", "eth0", "root").Run() })
}

// dialPeer connects to one of the agent's services.
func dialPeer(t *testing.T, d *rdma.Dialer, port string) *rdma.Conn {
	t.Helper()
	agent(t, "results") // the agent is up
	if d == nil {
		d = &rdma.Dialer{}
	}
	d.Timeout = time.Minute
	nc, err := d.Dial("rdma", net.JoinHostPort(peerAddr, port))
	require.NoError(t, err)
	c := nc.(*rdma.Conn)
	t.Cleanup(func() { c.Close() })
	return c
}

// echoTransfer writes size random bytes to an echoing connection while
// reading them back, both directions at once, and checks that what came
// back is what went. It returns the time taken, or the first error.
func echoTransfer(c net.Conn, size int) (time.Duration, error) {
	data := make([]byte, size)
	rand.New(rand.NewSource(int64(size))).Read(data)
	start := time.Now()
	werr := make(chan error, 1)
	go func() {
		for off := 0; off < size; off += 64 << 10 {
			if _, err := c.Write(data[off:min(size, off+64<<10)]); err != nil {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	h := sha256.New()
	if _, err := io.CopyN(h, c, int64(size)); err != nil {
		return time.Since(start), err
	}
	took := time.Since(start)
	if err := <-werr; err != nil {
		return took, err
	}
	if want := sha256.Sum256(data); !bytes.Equal(h.Sum(nil), want[:]) {
		return took, errors.New("the data came back changed")
	}
	return took, nil
}

func mbps(size int, d time.Duration) float64 { return float64(size) / d.Seconds() / 1e6 }

func TestTwoHostEcho(t *testing.T) {
	needPeer(t)
	c := dialPeer(t, nil, agentEchoPort)
	const size = 8 << 20
	took, err := echoTransfer(c, size)
	require.NoError(t, err)
	t.Logf("8 MiB echoed across hosts (both directions at once) in %v: %.2f MB/s each way", took.Round(time.Millisecond), mbps(size, took))
}

// TestTwoHostLoss: with packets lost on the driver's link, checksummed
// transfers in both directions at once arrive intact and finish; the rate
// under each loss rate is reported.
func TestTwoHostLoss(t *testing.T) {
	needPeer(t)
	clearNetem(t)
	for _, tc := range []struct {
		loss string
		size int
	}{
		{"1%", 16 << 20},
		{"5%", 1 << 20},
	} {
		t.Run(tc.loss, func(t *testing.T) {
			c := dialPeer(t, nil, agentEchoPort)
			netem(t, "loss", tc.loss)
			took, err := echoTransfer(c, tc.size)
			netem(t)
			require.NoError(t, err)
			t.Logf("loss %s: %d MiB echoed intact in %v: %.3f MB/s each way", tc.loss, tc.size>>20, took.Round(time.Millisecond), mbps(tc.size, took))
		})
	}
}

// partition cuts the link both ways for d: the agent drops what it sends
// for d, and so does this side (the caller lifts its own side).
func partition(t *testing.T, d time.Duration) {
	t.Helper()
	require.Equal(t, "ok\n", agent(t, fmt.Sprintf("netem %v loss 100%%", d)))
	netem(t, "loss", "100%")
}

// TestTwoHostPartition: a 5 s partition in the middle of a transfer is
// survived, with the data intact.
func TestTwoHostPartition(t *testing.T) {
	needPeer(t)
	clearNetem(t)
	c := dialPeer(t, nil, agentEchoPort)
	const size = 16 << 20
	done := make(chan error, 1)
	var took time.Duration
	go func() {
		var err error
		took, err = echoTransfer(c, size)
		done <- err
	}()
	time.Sleep(time.Second)
	partition(t, 5*time.Second)
	time.Sleep(5 * time.Second)
	netem(t)
	select {
	case err := <-done:
		require.NoError(t, err, "the transfer across the partition")
	case <-time.After(3 * time.Minute):
		t.Fatal("the transfer did not finish after the partition")
	}
	t.Logf("16 MiB echoed intact across a 5 s partition in %v", took.Round(time.Millisecond))
}

// TestTwoHostLongPartition: a partition longer than the keepalive bound
// fails the connection on both sides with ETIMEDOUT, within the bound.
func TestTwoHostLongPartition(t *testing.T) {
	needPeer(t)
	clearNetem(t)
	c := dialPeer(t, nil, agentEchoPort)
	laddr := c.LocalAddr().String()
	done := make(chan error, 1)
	go func() {
		_, err := echoTransfer(c, 1<<30) // longer than the test
		done <- err
	}()
	time.Sleep(time.Second)
	partition(t, keepaliveBound+10*time.Second)
	start := time.Now()
	var err error
	select {
	case err = <-done:
	case <-time.After(keepaliveBound + 10*time.Second):
		t.Fatal("the partitioned connection did not fail within the bound")
	}
	took := time.Since(start)
	netem(t)
	require.ErrorIs(t, err, syscall.ETIMEDOUT)
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "rdma", oe.Net)
	require.LessOrEqual(t, took, keepaliveBound)
	t.Logf("partitioned: this side failed after %v: %v", took.Round(time.Millisecond), err)

	// The agent's side of it failed too, the same way.
	var theirs string
	require.Eventually(t, func() bool {
		for _, l := range strings.Split(agent(t, "results"), "\n") {
			if strings.HasPrefix(l, laddr+" ") {
				theirs = l
				return true
			}
		}
		return false
	}, keepaliveBound, 500*time.Millisecond, "the agent's connection did not end")
	require.Contains(t, theirs, " etimedout=true ", "the agent's side wraps ETIMEDOUT: %s", theirs)
	t.Logf("the agent's side: %s", theirs)
}

// TestTwoHostPeerKilled kills the agent's VM (no disconnect, no goodbye)
// while this side has a connection that only reads, one whose Writes are
// blocked, one that is being streamed to, and one with keepalive off. It
// must run last: the agent does not come back.
func TestTwoHostPeerKilled(t *testing.T) {
	needPeer(t)
	control := os.Getenv("RDMA_TEST_CONTROL")
	if control == "" {
		t.Skip("no way to kill the peer: set RDMA_TEST_CONTROL (testbed/vm.sh --pair does)")
	}
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	require.Equal(t, "ok\n", agent(t, "stream "+ln.Addr().String()))
	streamed, err := ln.Accept()
	require.NoError(t, err)
	defer streamed.Close()
	_, err = io.ReadFull(streamed, make([]byte, 1<<20))
	require.NoError(t, err)

	reader := dialPeer(t, nil, agentStallPort)
	writer := dialPeer(t, nil, agentStallPort)
	noKeepalive := dialPeer(t, &rdma.Dialer{KeepAlive: -1}, agentStallPort)

	type ending struct {
		name string
		err  error
		at   time.Time
	}
	ended := make(chan ending, 4)
	go func() { // only reads
		_, err := reader.Read(make([]byte, 1))
		ended <- ending{"reader", err, time.Now()}
	}()
	go func() { // writes until blocked: the agent never reads
		buf := make([]byte, 64<<10)
		for {
			if _, err := writer.Write(buf); err != nil {
				ended <- ending{"writer", err, time.Now()}
				return
			}
		}
	}()
	go func() { // was being streamed to
		_, err := io.Copy(io.Discard, streamed)
		ended <- ending{"streamed", err, time.Now()}
	}()
	nkDone := make(chan error, 1)
	go func() {
		_, err := noKeepalive.Read(make([]byte, 1))
		nkDone <- err
	}()
	time.Sleep(2 * time.Second) // the writer fills the agent's credits

	require.NoError(t, os.WriteFile(filepath.Join(control, "kill-peer"), nil, 0o644))
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(control, "peer-killed"))
		return err == nil
	}, time.Minute, 100*time.Millisecond, "the harness did not kill the peer")
	killed := time.Now()

	for range 3 {
		select {
		case e := <-ended:
			took := e.at.Sub(killed)
			t.Logf("%s: failed %v after the peer was killed: %v", e.name, took.Round(time.Millisecond), e.err)
			require.ErrorIs(t, e.err, syscall.ETIMEDOUT, e.name)
			require.LessOrEqual(t, took, keepaliveBound, e.name)
		case <-time.After(keepaliveBound + 15*time.Second):
			t.Fatal("a connection to the killed peer did not fail within the keepalive bound")
		}
	}
	select {
	case err := <-nkDone:
		t.Fatalf("a connection with keepalive off noticed the dead peer: %v", err)
	default:
	}
	require.NoError(t, noKeepalive.Close())
	require.ErrorIs(t, <-nkDone, net.ErrClosed)

	// The listener keeps serving.
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var d rdma.Dialer
	nc, err := d.DialContext(ctx, "rdma", ln.Addr().String())
	require.NoError(t, err)
	defer nc.Close()
	_, err = echoTransfer(nc, 1<<20)
	require.NoError(t, err, "the listener serves a new client after the peer died")
}

// TestTwoHostDatagrams: datagrams of every size class to the agent's
// PacketConn, which echoes them, with packets lost on the driver's link:
// datagrams may be lost (a fragmented one with any of its fragments), but
// each that comes back is one that was sent, whole and unchanged, and
// none comes back twice.
func TestTwoHostDatagrams(t *testing.T) {
	needPeer(t)
	clearNetem(t)
	agent(t, "results") // the agent is up
	pc, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer pc.Close()
	dst, err := rdma.ResolveAddr("rdma", net.JoinHostPort(peerAddr, agentPacketPort))
	require.NoError(t, err)
	sizes := []int{16, 64, 1000, 4000, 9000, 30000, 65507}
	for _, loss := range []string{"", "5%"} {
		name := "no loss"
		if loss != "" {
			name = "loss " + loss
			netem(t, "loss", loss)
		}
		t.Run(name, func(t *testing.T) {
			const count = 300
			sent := map[uint32][]byte{}
			rnd := rand.New(rand.NewSource(int64(len(loss))))
			back := map[uint32]bool{}
			var mu sync.Mutex
			var bad []string
			done := make(chan struct{})
			go func() {
				defer close(done)
				buf := make([]byte, 70000)
				for {
					pc.SetReadDeadline(time.Now().Add(3 * time.Second))
					n, _, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					mu.Lock()
					if n < 4 {
						bad = append(bad, fmt.Sprintf("a datagram of %d bytes", n))
					} else {
						seq := uint32(buf[0])<<24 | uint32(buf[1])<<16 | uint32(buf[2])<<8 | uint32(buf[3])
						switch want, ok := sent[seq]; {
						case !ok:
							bad = append(bad, fmt.Sprintf("datagram %d was never sent", seq))
						case back[seq]:
							bad = append(bad, fmt.Sprintf("datagram %d came back twice", seq))
						case !bytes.Equal(want, buf[:n]):
							bad = append(bad, fmt.Sprintf("datagram %d came back changed (%d bytes, sent %d)", seq, n, len(want)))
						}
						back[seq] = true
					}
					mu.Unlock()
				}
			}()
			for i := uint32(0); i < count; i++ {
				m := make([]byte, sizes[int(i)%len(sizes)])
				rnd.Read(m)
				m[0], m[1], m[2], m[3] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
				mu.Lock()
				sent[i] = m
				mu.Unlock()
				pc.SetWriteDeadline(time.Now().Add(10 * time.Second))
				_, err := pc.WriteTo(m, dst)
				require.NoError(t, err)
				time.Sleep(time.Millisecond) // a pace the echo keeps up with
			}
			<-done
			mu.Lock()
			defer mu.Unlock()
			require.Empty(t, bad)
			t.Logf("%s: %d of %d datagrams (16 B to 65,507 B) came back intact; %+v", name, len(back), count, pc.Stats())
			if loss == "" {
				require.Greater(t, len(back), count*9/10, "without loss nearly all come back")
			} else {
				require.NotZero(t, len(back))
			}
		})
	}
}

// TestTwoHostAtomics: goroutines on two connections to the other host add
// to one counter its NIC keeps: the adds return distinct consecutive
// values, and the counter, read back, holds their sum.
func TestTwoHostAtomics(t *testing.T) {
	needPeer(t)
	const conns, goroutines, adds = 2, 4, 100
	remotes := make([]*rdma.RemoteRegion, conns)
	for i := range remotes {
		c := dialPeer(t, nil, agentAtomicPort)
		b := make([]byte, rdma.RemoteKeyLen)
		_, err := io.ReadFull(c, b)
		require.NoError(t, err)
		var k rdma.RemoteKey
		require.NoError(t, k.UnmarshalBinary(b))
		remotes[i] = c.Remote(k)
	}
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[uint64]bool{}
	errs := make(chan error, conns*goroutines)
	var wg sync.WaitGroup
	start := time.Now()
	for _, remote := range remotes {
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range adds {
					prev, err := remote.FetchAdd(ctx, 0, 1)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					seen[prev] = true
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	const total = conns * goroutines * adds
	require.Len(t, seen, total, "every add returned a value no other did")
	base := ^uint64(0)
	for v := range seen {
		base = min(base, v)
	}
	for v := range uint64(total) {
		require.True(t, seen[base+v], "value %d", base+v)
	}
	word := make([]byte, 8)
	_, err := remotes[1].ReadAt(word, 0)
	require.NoError(t, err)
	require.Equal(t, base+total, binary.NativeEndian.Uint64(word), "the counter holds every add")
	t.Logf("%d fetch-and-adds across hosts from %d goroutines on %d connections in %v (%.1f µs each, in parallel)",
		total, conns*goroutines, conns, took.Round(time.Millisecond), float64(took.Microseconds())/total)
}
