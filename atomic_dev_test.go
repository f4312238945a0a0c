package rdma_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Device tests of remote atomics: many goroutines on many connections
// counting on one word, a lock made of compare-and-swap guarding a record
// that RDMA WRITEs update, the errors, and soft-iWARP's refusal.

const noAtomicsOnSiw = "siw has no remote atomics (atomic_cap 0): TestAtomicUnsupported checks its error"

// sendKey writes a region's key over c; recvKey reads one and returns the
// peer's region it names.
func sendKey(t *testing.T, c net.Conn, r *rdma.Region) {
	t.Helper()
	kb, err := r.Key().MarshalBinary()
	require.NoError(t, err)
	_, err = c.Write(kb)
	require.NoError(t, err)
}

func recvKey(t *testing.T, c *rdma.Conn) *rdma.RemoteRegion {
	t.Helper()
	b := make([]byte, rdma.RemoteKeyLen)
	_, err := io.ReadFull(c, b)
	require.NoError(t, err)
	var k rdma.RemoteKey
	require.NoError(t, k.UnmarshalBinary(b))
	return c.Remote(k)
}

// sharedPairs returns m connected pairs whose server ends all registered
// the same size bytes (the first registers them, the others share them,
// each with access), and the clients' views of them.
func sharedPairs(t *testing.T, m, size int, access rdma.Access) (*rdma.Region, []*rdma.Conn, []*rdma.RemoteRegion) {
	t.Helper()
	var root *rdma.Region
	clients := make([]*rdma.Conn, m)
	remotes := make([]*rdma.RemoteRegion, m)
	for i := range m {
		client, sc := pair(t, nil, nil)
		server := sc.(*rdma.Conn)
		var r *rdma.Region
		var err error
		if root == nil {
			r, err = server.RegisterRegion(size, access)
			root = r
		} else {
			r, err = server.ShareRegion(root, access)
		}
		require.NoError(t, err)
		t.Cleanup(func() { r.Close() })
		sendKey(t, server, r)
		clients[i], remotes[i] = client, recvKey(t, client)
	}
	return root, clients, remotes
}

// TestAtomicCounter: N goroutines on each of M connections add to one word
// K times each: the word ends at exactly N·M·K, and the values the adds
// returned are every value from 0 to N·M·K-1, once each.
func TestAtomicCounter(t *testing.T) {
	needDevice(t)
	needNotSiw(t, noAtomicsOnSiw)
	const m, n = 4, 4
	k := 250
	if testing.Short() {
		k = 50
	}
	root, _, remotes := sharedPairs(t, m, 4096, rdma.RemoteAtomic|rdma.RemoteRead)
	ctx := context.Background()
	var mu sync.Mutex
	seen := make(map[uint64]int, n*m*k)
	var wg sync.WaitGroup
	errs := make(chan error, n*m)
	for _, remote := range remotes {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got := make([]uint64, 0, k)
				for range k {
					prev, err := remote.FetchAdd(ctx, 8, 1)
					if err != nil {
						errs <- err
						return
					}
					got = append(got, prev)
				}
				mu.Lock()
				for _, v := range got {
					seen[v]++
				}
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	total := uint64(n * m * k)
	require.Equal(t, total, binary.NativeEndian.Uint64(root.Bytes()[8:]), "the owner reads the word in its own byte order")
	require.Len(t, seen, int(total), "every add returned a value no other add did")
	for v := range total {
		require.Equal(t, 1, seen[v], "value %d", v)
	}
	require.Zero(t, binary.NativeEndian.Uint64(root.Bytes()[:8]), "the word beside it is untouched")

	// A compare-and-swap swaps only when the word holds the old value,
	// and returns what it held either way; a delta wraps modulo 2^64.
	prev, err := remotes[0].CompareAndSwap(ctx, 8, total+1, 7)
	require.NoError(t, err)
	require.Equal(t, total, prev, "no swap")
	prev, err = remotes[1].CompareAndSwap(ctx, 8, total, 7)
	require.NoError(t, err)
	require.Equal(t, total, prev, "swapped")
	prev, err = remotes[2].FetchAdd(ctx, 8, ^uint64(0))
	require.NoError(t, err)
	require.Equal(t, uint64(7), prev)
	require.Equal(t, uint64(6), binary.NativeEndian.Uint64(root.Bytes()[8:]))
	// The owner's CPU sets the word while no peer uses it; the peers see it.
	binary.NativeEndian.PutUint64(root.Bytes()[4088:], 1<<63)
	prev, err = remotes[3].FetchAdd(ctx, 4088, 1<<63)
	require.NoError(t, err)
	require.Equal(t, uint64(1<<63), prev)
	require.Zero(t, binary.NativeEndian.Uint64(root.Bytes()[4088:]))
}

// TestAtomicLock: a test-and-set lock of compare-and-swap on one word
// guards a 4 KiB record beside it, which the holder reads and rewrites
// with RDMA READ and WRITE: over thousands of rounds from several
// connections no holder ever reads a torn record, and no update is lost.
func TestAtomicLock(t *testing.T) {
	needDevice(t)
	needNotSiw(t, noAtomicsOnSiw)
	const m, recOff, recLen = 4, 64, 4096
	rounds := 500
	if testing.Short() {
		rounds = 100
	}
	root, clients, remotes := sharedPairs(t, m, recOff+recLen, rdma.RemoteAtomic|rdma.RemoteRead|rdma.RemoteWrite)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, m)
	var contended [m]int
	for i, remote := range remotes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := uint64(i + 1)
			local, err := clients[i].RegisterRegion(recLen, 0)
			if err != nil {
				errs <- err
				return
			}
			defer local.Close()
			rec := local.Bytes()
			for round := range rounds {
				for {
					prev, err := remote.CompareAndSwap(ctx, 0, 0, id)
					if err != nil {
						errs <- err
						return
					}
					if prev == 0 {
						break
					}
					contended[i]++
				}
				if err := remote.ReadAtContext(ctx, local, 0, recLen, recOff); err != nil {
					errs <- err
					return
				}
				seq := binary.NativeEndian.Uint64(rec)
				fill := rec[8]
				if !bytes.Equal(rec[8:], bytes.Repeat([]byte{fill}, recLen-8)) {
					errs <- errors.New("a torn record: its bytes differ")
					return
				}
				binary.NativeEndian.PutUint64(rec, seq+1)
				for j := 8; j < recLen; j++ {
					rec[j] = byte(int(id)*31 + round)
				}
				if err := remote.WriteAtContext(ctx, local, 0, recLen, recOff); err != nil {
					errs <- err
					return
				}
				prev, err := remote.CompareAndSwap(ctx, 0, id, 0)
				if err != nil {
					errs <- err
					return
				}
				if prev != id {
					errs <- errors.New("the lock was not held by its holder at release")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Logf("%d rounds on %d connections; lock found taken %v times", m*rounds, m, contended)
	b := root.Bytes()
	require.Zero(t, binary.NativeEndian.Uint64(b), "the lock is free")
	require.Equal(t, uint64(m*rounds), binary.NativeEndian.Uint64(b[recOff:]), "no update lost")
	require.Equal(t, bytes.Repeat(b[recOff+8:recOff+9], recLen-8), b[recOff+8:recOff+recLen], "the record is whole")
}

// TestAtomicErrors: what is refused before posting leaves the connection
// working; what the peer's NIC refuses (a region without the right, a
// revoked one) fails the operation with ErrRemoteAccess and breaks the
// connection on both ends.
func TestAtomicErrors(t *testing.T) {
	needDevice(t)
	needNotSiw(t, noAtomicsOnSiw)
	ctx := context.Background()
	t.Run("before posting", func(t *testing.T) {
		client, server, _, remote := regionPair(t, 4096, rdma.RemoteAtomic)
		_, err := remote.FetchAdd(ctx, 4, 1)
		require.ErrorContains(t, err, "8-byte aligned")
		_, err = remote.FetchAdd(ctx, 4096, 1)
		require.ErrorIs(t, err, rdma.ErrOutOfBounds)
		_, err = remote.CompareAndSwap(ctx, -8, 0, 1)
		require.ErrorIs(t, err, rdma.ErrOutOfBounds)
		readOnly := remote.Key()
		readOnly.Access = rdma.RemoteRead
		_, err = client.Remote(readOnly).FetchAdd(ctx, 0, 1)
		require.ErrorIs(t, err, rdma.ErrRemoteAccess)
		expired, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel()
		_, err = remote.FetchAdd(expired, 0, 1)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		var ne net.Error
		require.ErrorAs(t, err, &ne)
		require.True(t, ne.Timeout())
		prev, err := remote.FetchAdd(ctx, 0, 3)
		require.NoError(t, err, "the connection still works")
		require.Zero(t, prev)
		transfer(t, client, server, "still connected")
	})
	for _, tc := range []struct {
		name   string
		access rdma.Access
		revoke bool
	}{
		{"a region without the right", rdma.RemoteRead | rdma.RemoteWrite, false},
		{"a revoked region", rdma.RemoteAtomic, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server, region, remote := regionPair(t, 4096, tc.access)
			key := remote.Key()
			key.Access |= rdma.RemoteAtomic // as a peer that lies about its key
			if tc.revoke {
				require.NoError(t, region.Close())
			}
			_, err := client.Remote(key).FetchAdd(ctx, 0, 1)
			require.ErrorIs(t, err, rdma.ErrRemoteAccess)
			require.ErrorIs(t, err, syscall.ECONNRESET)
			var oe *net.OpError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, "fetch-add", oe.Op)
			_, err = client.Write([]byte("x"))
			require.Error(t, err, "the client's end is broken")
			server.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = io.ReadAll(server)
			require.Error(t, err, "the server's end is broken too")
			require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "and says so: %v", err)
		})
	}
}

// TestAtomicUnsupported: soft-iWARP has no remote atomics: a region that
// would grant them is refused, and so is an atomic aimed at a peer's
// region, before anything is posted; the connection goes on.
func TestAtomicUnsupported(t *testing.T) {
	needDevice(t)
	if !siw() {
		t.Skip("only on siw, the provider without remote atomics (the others' atomics are TestAtomicCounter's)")
	}
	client, server, _, remote := regionPair(t, 4096, rdma.RemoteRead)
	_, err := server.RegisterRegion(4096, rdma.RemoteAtomic|rdma.RemoteRead)
	require.ErrorIs(t, err, rdma.ErrUnsupported)
	require.ErrorContains(t, err, "siw0 has no remote atomics")
	key := remote.Key()
	key.Access |= rdma.RemoteAtomic
	_, err = client.Remote(key).FetchAdd(context.Background(), 0, 1)
	require.ErrorIs(t, err, rdma.ErrUnsupported)
	_, err = client.Remote(key).CompareAndSwap(context.Background(), 0, 0, 1)
	require.ErrorIs(t, err, rdma.ErrUnsupported)
	transfer(t, client, server, "still connected")
}

// TestAtomicLockService runs the lock service of
// ExampleRemoteRegion_CompareAndSwap: three clients take the lock in turn
// many times, and no two ever hold it at once.
func TestAtomicLockService(t *testing.T) {
	needDevice(t)
	needNotSiw(t, noAtomicsOnSiw)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	served := make(chan error, 1)
	go func() { served <- serveLock(ln) }()
	defer func() {
		ln.Close()
		require.ErrorIs(t, <-served, net.ErrClosed)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var holders, turns atomic.Int32
	errs := make(chan error, 3)
	for id := range uint64(3) {
		lc, err := dialLock(ln.Addr().String(), id+1)
		require.NoError(t, err)
		defer lc.Close()
		go func() {
			for range 50 {
				if err := lc.lock(ctx); err != nil {
					errs <- err
					return
				}
				if holders.Add(1) != 1 {
					errs <- errors.New("two clients hold the lock")
					return
				}
				turns.Add(1)
				holders.Add(-1)
				if err := lc.unlock(ctx); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
	require.Equal(t, int32(150), turns.Load())
}
