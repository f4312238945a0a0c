package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Device tests of one-sided RDMA: regions registered on a connection, read
// and written by the peer with RDMA READ and WRITE.

// regionPair returns a connected pair whose server side registered a
// region of size bytes with access, and sent its key over the connection;
// the client side has it as a RemoteRegion.
func regionPair(t *testing.T, size int, access rdma.Access) (client, server *rdma.Conn, region *rdma.Region, remote *rdma.RemoteRegion) {
	t.Helper()
	client, sc := pair(t, nil, nil)
	server = sc.(*rdma.Conn)
	region, err := server.RegisterRegion(size, access)
	require.NoError(t, err)
	t.Cleanup(func() { region.Close() })
	key, err := region.Key().MarshalBinary()
	require.NoError(t, err)
	_, err = server.Write(key)
	require.NoError(t, err)
	b := make([]byte, rdma.RemoteKeyLen)
	_, err = io.ReadFull(client, b)
	require.NoError(t, err)
	var k rdma.RemoteKey
	require.NoError(t, k.UnmarshalBinary(b))
	require.Equal(t, region.Key(), k)
	return client, server, region, client.Remote(k)
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	r.Read(b)
	return b
}

// TestRegionRoundTrip reads and writes the peer's region between
// registered regions at various offsets and sizes, and compares the bytes
// at both ends.
func TestRegionRoundTrip(t *testing.T) {
	needDevice(t)
	const size = 1 << 20
	rng := rand.New(rand.NewSource(1))
	client, _, region, remote := regionPair(t, size, rdma.RemoteRead|rdma.RemoteWrite)
	local, err := client.RegisterRegion(size, 0)
	require.NoError(t, err)
	defer local.Close()
	require.Equal(t, rdma.RemoteKey{}, local.Key(), "a local region has no key")
	ctx := context.Background()
	for _, tc := range []struct{ localOff, off, n int }{
		{0, 0, 1}, {5, 7, 100}, {4095, 4095, 4097}, {0, 0, size}, {size - 1, size - 1, 1},
		{100, 123457, 65536 + 3}, {0, size - 300000, 300000},
	} {
		want := randomBytes(rng, tc.n)
		copy(region.Bytes()[tc.off:], want)
		require.NoError(t, remote.ReadAtContext(ctx, local, int64(tc.localOff), tc.n, int64(tc.off)), "%+v", tc)
		require.True(t, bytes.Equal(want, local.Bytes()[tc.localOff:tc.localOff+tc.n]), "READ %+v", tc)

		want = randomBytes(rng, tc.n)
		copy(local.Bytes()[tc.localOff:], want)
		require.NoError(t, remote.WriteAtContext(ctx, local, int64(tc.localOff), tc.n, int64(tc.off)), "%+v", tc)
		if siw() {
			// iWARP completes an RDMA WRITE once it is on the wire: the
			// bytes land at the peer a moment later.
			require.Eventually(t, func() bool { return bytes.Equal(want, region.Bytes()[tc.off:tc.off+tc.n]) }, 5*time.Second, time.Millisecond, "WRITE %+v", tc)
		} else {
			require.True(t, bytes.Equal(want, region.Bytes()[tc.off:tc.off+tc.n]), "WRITE %+v", tc)
		}
	}
	require.NoError(t, remote.ReadAtContext(ctx, local, 0, 0, 0), "an empty read")

	// Many at once: more than the slots of the connection.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- remote.ReadAtContext(ctx, local, int64(i*4096), 4096, int64(i*4096))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.True(t, bytes.Equal(region.Bytes()[:64*4096], local.Bytes()[:64*4096]))
}

// TestRegionReaderAt: RemoteRegion as io.ReaderAt and io.WriterAt.
func TestRegionReaderAt(t *testing.T) {
	needDevice(t)
	const size = 600 << 10 // more than the bounce memory
	rng := rand.New(rand.NewSource(2))
	_, _, region, remote := regionPair(t, size, rdma.RemoteRead|rdma.RemoteWrite)
	copy(region.Bytes(), randomBytes(rng, size))
	require.EqualValues(t, size, remote.Size())

	p := make([]byte, size)
	n, err := remote.ReadAt(p, 0)
	require.NoError(t, err)
	require.Equal(t, size, n)
	require.True(t, bytes.Equal(region.Bytes(), p))

	n, err = remote.ReadAt(p[:1000], size-10)
	require.Equal(t, io.EOF, err, "past the end: what there is, and io.EOF")
	require.Equal(t, 10, n)
	require.Equal(t, region.Bytes()[size-10:], p[:10])
	n, err = remote.ReadAt(p[:1], size)
	require.Equal(t, io.EOF, err)
	require.Zero(t, n)

	want := randomBytes(rng, 300<<10)
	n, err = remote.WriteAt(want, 3)
	require.NoError(t, err)
	require.Equal(t, len(want), n)
	require.True(t, bytes.Equal(want, region.Bytes()[3:3+len(want)]))

	n, err = remote.WriteAt(make([]byte, 11), size-10)
	require.ErrorIs(t, err, rdma.ErrOutOfBounds)
	requireOpError(t, err, "write")
	require.Zero(t, n)
	_, err = remote.ReadAt(p, -1)
	require.ErrorIs(t, err, rdma.ErrOutOfBounds)

	// io.SectionReader over it, as a user would.
	got, err := io.ReadAll(io.NewSectionReader(remote, 1000, 70000))
	require.NoError(t, err)
	require.True(t, bytes.Equal(region.Bytes()[1000:71000], got))
}

// TestRegionRefusedBeforePosting: bounds, a key without the access, a
// region of another connection, a closed region: refused before anything
// is posted, so the connection goes on working.
func TestRegionRefusedBeforePosting(t *testing.T) {
	needDevice(t)
	const size = 64 << 10
	client, server, _, remote := regionPair(t, size, rdma.RemoteRead)
	local, err := client.RegisterRegion(size, 0)
	require.NoError(t, err)
	defer local.Close()
	other, _ := pair(t, nil, nil)
	foreign, err := other.RegisterRegion(4096, 0)
	require.NoError(t, err)
	defer foreign.Close()
	closed, err := client.RegisterRegion(4096, 0)
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	require.ErrorIs(t, closed.Close(), net.ErrClosed)

	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		op     func() error
		target error
	}{
		{"past the local region", func() error { return remote.ReadAtContext(ctx, local, size-10, 11, 0) }, rdma.ErrOutOfBounds},
		{"past the peer's region", func() error { return remote.ReadAtContext(ctx, local, 0, 11, size-10) }, rdma.ErrOutOfBounds},
		{"negative offset", func() error { return remote.ReadAtContext(ctx, local, 0, 1, -1) }, rdma.ErrOutOfBounds},
		{"negative length", func() error { return remote.ReadAtContext(ctx, local, 0, -1, 0) }, rdma.ErrOutOfBounds},
		{"a write to a read-only key", func() error { return remote.WriteAtContext(ctx, local, 0, 1, 0) }, rdma.ErrRemoteAccess},
		{"another connection's region", func() error { return remote.ReadAtContext(ctx, foreign, 0, 1, 0) }, syscall.EINVAL},
		{"a closed region", func() error { return remote.ReadAtContext(ctx, closed, 0, 1, 0) }, net.ErrClosed},
		{"a zero key", func() error { return client.Remote(rdma.RemoteKey{}).ReadAtContext(ctx, local, 0, 1, 0) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			require.Error(t, err)
			var oe *net.OpError
			require.ErrorAs(t, err, &oe)
			if tc.target != nil {
				require.ErrorIs(t, err, tc.target)
			}
		})
	}
	transfer(t, client, server, "still connected")
	require.NoError(t, remote.ReadAtContext(ctx, local, 0, size, 0))
}

// TestRegionRefusedByPeer: what the peer's NIC refuses (an access the
// region does not grant, a key that was never registered, a region
// revoked) fails the operation with ErrRemoteAccess and breaks the
// connection: both ends fail with a clear error, neither hangs.
func TestRegionRefusedByPeer(t *testing.T) {
	needDevice(t)
	for _, tc := range []struct {
		name   string
		access rdma.Access
		op     string
		off    int64
		key    func(k rdma.RemoteKey, r *rdma.Region) rdma.RemoteKey
	}{
		{"write to a read-only region", rdma.RemoteRead, "write", 4096, func(k rdma.RemoteKey, _ *rdma.Region) rdma.RemoteKey {
			k.Access |= rdma.RemoteWrite
			return k
		}},
		{"read of a write-only region", rdma.RemoteWrite, "read", 4096, func(k rdma.RemoteKey, _ *rdma.Region) rdma.RemoteKey {
			k.Access |= rdma.RemoteRead
			return k
		}},
		{"a key never registered", rdma.RemoteRead | rdma.RemoteWrite, "read", 4096, func(k rdma.RemoteKey, _ *rdma.Region) rdma.RemoteKey {
			k.RKey ^= 0x5a5a5a00
			return k
		}},
		{"past the region's end, as the key lies", rdma.RemoteRead | rdma.RemoteWrite, "write", 64<<10 - 1024, func(k rdma.RemoteKey, _ *rdma.Region) rdma.RemoteKey {
			k.Size += 1 << 20
			return k
		}},
		{"a revoked region", rdma.RemoteRead | rdma.RemoteWrite, "read", 4096, func(k rdma.RemoteKey, r *rdma.Region) rdma.RemoteKey {
			require.NoError(t, r.Close())
			return k
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "read of a write-only region" {
				needNotSiw(t, "siw checks no access right on the memory an RDMA READ reads (its transmit path checks the READ response's source with no permission bits), so the READ succeeds")
			}
			client, server, region, remote := regionPair(t, 64<<10, tc.access)
			local, err := client.RegisterRegion(64<<10, 0)
			require.NoError(t, err)
			defer local.Close()
			remote = client.Remote(tc.key(remote.Key(), region))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var opErr error
			start := time.Now()
			if tc.op == "read" {
				opErr = remote.ReadAtContext(ctx, local, 0, 4096, tc.off)
			} else {
				opErr = remote.WriteAtContext(ctx, local, 0, 4096, tc.off)
			}
			t.Logf("%s: %v after %v", tc.op, opErr, time.Since(start))
			if siw() {
				// iWARP completes an RDMA WRITE once it is on the wire,
				// and its responder refuses a bad access by terminating
				// the connection: the operation may still succeed, or
				// fail as the connection does; the connection fails.
				if opErr != nil {
					requireOpError(t, opErr, tc.op)
				}
			} else {
				requireOpError(t, opErr, tc.op)
				require.ErrorIs(t, opErr, rdma.ErrRemoteAccess)
				require.ErrorIs(t, opErr, syscall.ECONNRESET)
			}

			// Both connections fail, each with an error that says so.
			client.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = client.Read(make([]byte, 10))
			t.Logf("the client's Read: %v", err)
			requireOpError(t, err, "read")
			if !siw() {
				require.ErrorIs(t, err, rdma.ErrRemoteAccess)
			}
			require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the client's connection did not fail: %v", err)
			server.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = server.Read(make([]byte, 10))
			t.Logf("the server's Read: %v", err)
			requireOpError(t, err, "read")
			require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the server's connection did not fail: %v", err)
			// And later operations fail at once.
			err = remote.ReadAtContext(ctx, local, 0, 1, 0)
			require.Error(t, err)
			t.Logf("then: %v", err)
		})
	}
}

// TestRegionCancel: a context done before the operation posts nothing; one
// done while it is in flight returns at once, and the local region stays
// mapped until the completion arrives (Close waits for it).
func TestRegionCancel(t *testing.T) {
	needDevice(t)
	const size = 32 << 20
	client, server, _, remote := regionPair(t, size, rdma.RemoteRead|rdma.RemoteWrite)
	local, err := client.RegisterRegion(size, 0)
	require.NoError(t, err)

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	err = remote.ReadAtContext(canceled, local, 0, size, 0)
	requireOpError(t, err, "read")
	require.ErrorIs(t, err, context.Canceled)

	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	start := time.Now()
	err = remote.ReadAtContext(ctx, local, 0, size, 0)
	took := time.Since(start)
	t.Logf("a %d MiB READ with a 1ms deadline: %v after %v", size>>20, err, took)
	if err == nil {
		t.Skip("the READ completed within its deadline: nothing to cancel")
	}
	requireOpError(t, err, "read")
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	require.Less(t, took, time.Second)

	start = time.Now()
	require.NoError(t, local.Close(), "Close waits for the abandoned READ")
	t.Logf("Close of the target waited %v", time.Since(start))
	// The connection is intact.
	transfer(t, client, server, "after a cancellation")
	p := make([]byte, 10)
	_, err = remote.ReadAt(p, 0)
	require.NoError(t, err)
}

// TestRegionConnClose: closing a connection with operations in flight
// fails them (no hang), revokes its regions and gives their registrations
// back; a region's memory stays mapped until its own Close.
func TestRegionConnClose(t *testing.T) {
	needDevice(t)
	baseConns, baseReg := deviceTotals()
	const size = 16 << 20
	client, _, _, remote := regionPair(t, size, rdma.RemoteRead|rdma.RemoteWrite)
	local, err := client.RegisterRegion(size, 0)
	require.NoError(t, err)
	st := client.Stats()
	require.GreaterOrEqual(t, st.RegisteredBytes, size, "the region counts as the connection's registered memory")

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs <- remote.ReadAtContext(context.Background(), local, int64(i)*(size/4), size/4, int64(i)*(size/4))
		}()
		go func() {
			defer wg.Done()
			_, err := remote.ReadAt(make([]byte, 1<<20), int64(i)<<20)
			errs <- err
		}()
	}
	time.Sleep(5 * time.Millisecond)
	require.NoError(t, client.Close())
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Logf("in flight at Close: %v", err)
	}
	require.Len(t, local.Bytes(), size, "Close of the connection revoked its regions, and left their memory mapped")
	local.Bytes()[0] = 1
	require.NoError(t, local.Close(), "the region's Close unmaps it")
	require.Nil(t, local.Bytes())
	require.ErrorIs(t, local.Close(), net.ErrClosed)
	_, err = client.RegisterRegion(4096, 0)
	require.ErrorIs(t, err, net.ErrClosed)
	waitDeviceTotalsAbove(t, baseConns, baseReg)
}

// waitDeviceTotalsAbove waits until the device totals are no more than
// base (the pair's server end may still be open).
func waitDeviceTotalsAbove(t *testing.T, baseConns, baseReg int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		conns, reg := deviceTotals()
		if conns <= baseConns+1 && reg <= baseReg+registered(t, rdma.Options{})+(16<<20) {
			return
		}
	}
	conns, reg := deviceTotals()
	t.Fatalf("device totals: %d connections, %d bytes registered; base %d, %d", conns, reg, baseConns, baseReg)
}

// TestRegionBlockStore runs the block store of Example_blockStore.
func TestRegionBlockStore(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- serveBlocks(ln) }()
	defer func() {
		ln.Close()
		<-served
	}()
	bc, err := dialBlocks(ln.Addr().String())
	require.NoError(t, err)
	defer bc.Close()
	rng := rand.New(rand.NewSource(3))
	want := make(map[int][]byte)
	for range 50 {
		i := rng.Intn(blockCount)
		want[i] = randomBytes(rng, blockSize)
		require.NoError(t, bc.writeBlock(i, want[i]))
	}
	got := make([]byte, blockSize)
	for i, b := range want {
		require.NoError(t, bc.readBlock(i, got))
		require.Equal(t, b, got, "block %d", i)
	}
	require.ErrorIs(t, bc.readBlock(blockCount, got), io.EOF, "past the last block")
}

// TestRegionSteadyStateAllocs: a one-sided operation between registered
// regions, and a ReadAt or WriteAt once the bounce memory exists, allocate
// nothing.
func TestRegionSteadyStateAllocs(t *testing.T) {
	needDevice(t)
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	client, _, _, remote := regionPair(t, 64<<10, rdma.RemoteRead|rdma.RemoteWrite)
	local, err := client.RegisterRegion(64<<10, 0)
	require.NoError(t, err)
	defer local.Close()
	ctx := context.Background()
	p := make([]byte, 4096)
	for name, op := range map[string]func() error{
		"ReadAtContext":  func() error { return remote.ReadAtContext(ctx, local, 0, 4096, 0) },
		"WriteAtContext": func() error { return remote.WriteAtContext(ctx, local, 0, 4096, 0) },
		"ReadAt": func() error {
			_, err := remote.ReadAt(p, 0)
			return err
		},
		"WriteAt": func() error {
			_, err := remote.WriteAt(p, 0)
			return err
		},
	} {
		require.NoError(t, op(), name)
		allocs := testing.AllocsPerRun(100, func() {
			if err := op(); err != nil {
				panic(err)
			}
		})
		require.Zero(t, allocs, "%s allocates", name)
	}
}
