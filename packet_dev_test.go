package rdma_test

import (
	"bytes"
	"errors"
	"math/rand"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Device tests of PacketConn: datagrams over UD between PacketConns of the
// test bed's device.

// listenPacketPair opens two PacketConns on the test bed's address.
func listenPacketPair(t *testing.T) (*rdma.PacketConn, *rdma.PacketConn) {
	t.Helper()
	a, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	b, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	if err != nil {
		a.Close()
	}
	require.NoError(t, err)
	return a, b
}

// TestPacketSizes sends datagrams of every interesting size, from empty
// through one message of the MTU to the largest (fragmented), and each is
// read whole, from the sender's address, and answered to that address.
func TestPacketSizes(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD (TestPacketIWARP)")
	}
	a, b := listenPacketPair(t)
	defer a.Close()
	defer b.Close()
	sizes := []int{0, 1, 64, 1000, 4092, 4093, 4096, 8000, 16384, 65507}
	rnd := rand.New(rand.NewSource(1))
	buf := make([]byte, 70000)
	for _, n := range sizes {
		msg := make([]byte, n)
		rnd.Read(msg)
		require.NoError(t, a.SetDeadline(time.Now().Add(10*time.Second)))
		require.NoError(t, b.SetDeadline(time.Now().Add(10*time.Second)))
		w, err := a.WriteTo(msg, b.LocalAddr())
		require.NoError(t, err, "size %d", n)
		require.Equal(t, n, w)
		r, from, err := b.ReadFrom(buf)
		require.NoError(t, err, "size %d", n)
		require.Equal(t, n, r, "size %d", n)
		require.True(t, bytes.Equal(msg, buf[:r]), "size %d: bytes differ", n)
		require.Equal(t, a.LocalAddr().String(), from.String())
		// The reply goes to the address ReadFrom returned.
		_, err = b.WriteTo(msg, from)
		require.NoError(t, err)
		r, from, err = a.ReadFrom(buf)
		require.NoError(t, err)
		require.Equal(t, n, r)
		require.True(t, bytes.Equal(msg, buf[:r]))
		require.Equal(t, b.LocalAddr().String(), from.String())
	}
	st := b.Stats()
	require.Equal(t, uint64(len(sizes)), st.DatagramsReceived)
	require.Equal(t, uint64(1), st.PeerMisses)
	require.Zero(t, st.DropsMalformed+st.DropsReassembly+st.DropsNoReceive+st.DropsTruncated)
}

// TestPacketManyPeers: many PacketConns send to one, which answers each;
// every datagram arrives from the right peer.
func TestPacketManyPeers(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD")
	}
	srv, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer srv.Close()
	const peers, rounds = 16, 20
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv.ReadFrom(buf)
			if err != nil {
				return
			}
			srv.WriteTo(buf[:n], from)
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, peers)
	for i := 0; i < peers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			pc, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
			if err != nil {
				errs <- err
				return
			}
			defer pc.Close()
			pc.SetDeadline(time.Now().Add(20 * time.Second))
			buf := make([]byte, 2048)
			for r := 0; r < rounds; r++ {
				msg := []byte{byte(i), byte(r), 1, 2, 3}
				if _, err := pc.WriteTo(msg, srv.LocalAddr()); err != nil {
					errs <- err
					return
				}
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(buf[:n], msg) || from.String() != srv.LocalAddr().String() {
					errs <- errors.New("wrong echo")
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, uint64(peers*rounds), srv.Stats().DatagramsReceived)
}

// TestPacketDeadlineAndClose: a read past its deadline times out as net's
// do, and Close wakes a blocked read with net.ErrClosed.
func TestPacketDeadlineAndClose(t *testing.T) {
	needDevice(t)
	if siw() {
		t.Skip("siw has no UD")
	}
	pc, err := rdma.ListenPacket("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	pc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, _, err = pc.ReadFrom(make([]byte, 10))
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	pc.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, _, err := pc.ReadFrom(make([]byte, 10))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, pc.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, net.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake ReadFrom")
	}
	_, err = pc.WriteTo([]byte("x"), pc.LocalAddr())
	require.ErrorIs(t, err, net.ErrClosed)
}
