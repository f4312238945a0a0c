package rdma_test

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// Device tests of the receive side: message-oriented Reads and their
// boundaries, zero-length Writes, and Reads after the writer closed.

// messageSize draws a message size from 1 B to 4 MiB, most of them small,
// as a request/response protocol's are.
func messageSize(r *rand.Rand) int {
	switch p := r.Intn(100); {
	case p < 60:
		return 1 + r.Intn(4<<10)
	case p < 95:
		return 1 + r.Intn(256<<10)
	default:
		return 1 + r.Intn(4<<20)
	}
}

// readMessage reads one message of want bytes into buf, which has room for
// it plus readLen. A stream reader just reads want bytes. A message-oriented
// reader Reads readLen bytes at a time and must never get bytes past the
// message's end, and must get all the rest of it whenever readLen leaves
// room for it.
func readMessage(c net.Conn, messages bool, buf []byte, readLen, want int) ([]byte, error) {
	if !messages {
		_, err := io.ReadFull(c, buf[:want])
		return buf[:want], err
	}
	for got := 0; got < want; {
		n, err := c.Read(buf[got : got+readLen])
		if err != nil {
			return nil, err
		}
		left := want - got
		switch {
		case n > left:
			return nil, fmt.Errorf("a Read returned %d bytes, past the message's end %d bytes on", n, left)
		case n < left && readLen >= left:
			return nil, fmt.Errorf("a Read with room for the last %d bytes of the message returned %d", left, n)
		}
		got += n
	}
	return buf[:want], nil
}

// TestMessages runs a message protocol with no framing of its own: each
// Write is one request or reply of a random size from 1 B to 4 MiB, each
// Read on a message-oriented side must return exactly one, over several
// connections and goroutines; payloads are checksummed.
func TestMessages(t *testing.T) {
	needDevice(t)
	conns, perConn := 4, 40
	if testing.Short() {
		conns, perConn = 2, 12
	}
	for _, tc := range []struct {
		name           string
		server, client bool // Options.Messages
		readBuf        int  // the message-oriented Reads' buffer
	}{
		{"both sides", true, true, 4 << 20},
		{"server only", true, false, 4 << 20},
		{"client only", false, true, 4 << 20},
		{"small read buffers", true, true, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make(chan error, 2*conns)
			for i := range conns {
				lc := &rdma.ListenConfig{Options: rdma.Options{Messages: tc.server}}
				d := &rdma.Dialer{Options: rdma.Options{Messages: tc.client}}
				client, server := pair(t, lc, d)
				seed := int64(i + 1)
				wg.Add(2)
				// The server reads each request and writes it back as one
				// reply; the client checks both directions.
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewSource(seed))
					buf := make([]byte, 4<<20+tc.readBuf)
					for k := range perConn {
						want := messageSize(r)
						msg, err := readMessage(server, tc.server, buf, tc.readBuf, want)
						if err != nil {
							errs <- fmt.Errorf("conn %d, request %d (%d B): %w", seed, k, want, err)
							return
						}
						if _, err := server.Write(msg); err != nil {
							errs <- err
							return
						}
					}
				}()
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewSource(seed))
					data := rand.New(rand.NewSource(-seed))
					out := make([]byte, 4<<20)
					buf := make([]byte, 4<<20+tc.readBuf)
					for k := range perConn {
						want := messageSize(r)
						data.Read(out[:want])
						sum := sha256.Sum256(out[:want])
						if _, err := client.Write(out[:want]); err != nil {
							errs <- err
							return
						}
						msg, err := readMessage(client, tc.client, buf, tc.readBuf, want)
						if err != nil {
							errs <- fmt.Errorf("conn %d, reply %d (%d B): %w", seed, k, want, err)
							return
						}
						if sha256.Sum256(msg) != sum {
							errs <- fmt.Errorf("conn %d, reply %d: checksum mismatch", seed, k)
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
		})
	}
}

// TestMessagesBoundaries pins the boundaries exactly: Writes of known
// sizes, back to back (so that a stream peer would merge them), each come
// out of one Read.
func TestMessagesBoundaries(t *testing.T) {
	client, server := pair(t, &rdma.ListenConfig{Options: rdma.Options{Messages: true, BufferSize: 4096}}, nil)
	sizes := []int{1, 2, 4095, 4096, 4097, 3, 100000, 1, 64}
	go func() {
		for i, n := range sizes {
			b := make([]byte, n)
			for j := range b {
				b[j] = byte(i)
			}
			client.Write(b)
		}
		client.Write(nil) // sends nothing
		client.Close()
	}()
	buf := make([]byte, 1<<20)
	for i, n := range sizes {
		got, err := server.Read(buf)
		require.NoError(t, err)
		require.Equal(t, n, got, "Write %d", i)
		for _, c := range buf[:got] {
			require.Equal(t, byte(i), c)
		}
	}
	_, err := server.Read(buf)
	require.Equal(t, io.EOF, err, "the zero-length Write was no message")
}

// TestZeroLengthWrites: zero-length Writes send nothing, in either mode, so
// a stream reader never sees a Read return (0, nil) (which would make a
// bufio.Reader fail with io.ErrNoProgress after 100 of them).
func TestZeroLengthWrites(t *testing.T) {
	needDevice(t)
	for _, messages := range []bool{false, true} {
		t.Run(fmt.Sprintf("messages=%v", messages), func(t *testing.T) {
			client, server := pair(t, &rdma.ListenConfig{Options: rdma.Options{Messages: messages}}, nil)
			go func() {
				for range 120 {
					client.Write(nil)
				}
				client.Write([]byte("hello\n"))
				client.Close()
			}()
			line, err := bufio.NewReader(server).ReadString('\n')
			require.NoError(t, err)
			require.Equal(t, "hello\n", line)
			require.Equal(t, uint64(1), client.Stats().MessagesSent)
		})
	}
}

// TestMessagesBursts drives the corked posts of message-oriented
// connections (back-to-back Writes while the peer is behind share one
// post): both sides at once, each in one goroutine, write a burst of small
// messages and then read the peer's burst, so each side's Writes wait
// unposted exactly while the other is busy writing too; bursts vary from
// one message to more than the peer's credits. Every message must come
// out of one Read, in order and intact, and the exchange must finish.
func TestMessagesBursts(t *testing.T) {
	needDevice(t)
	rounds := 300
	if testing.Short() {
		rounds = 60
	}
	opts := rdma.Options{Messages: true, RecvDepth: 8, SendDepth: 8, BufferSize: 4096}
	client, server := pair(t, &rdma.ListenConfig{Options: opts}, &rdma.Dialer{Options: opts})
	side := func(c net.Conn, mine, theirs int64) error {
		r := rand.New(rand.NewSource(mine))       // this side's bursts
		other := rand.New(rand.NewSource(theirs)) // the peer's, to check them
		buf := make([]byte, 8192)
		for k := range rounds {
			n := 1 + r.Intn(opts.RecvDepth)
			for i := range n {
				m := make([]byte, 1+r.Intn(300))
				for j := range m {
					m[j] = byte(k + i + j)
				}
				if _, err := c.Write(m); err != nil {
					return fmt.Errorf("round %d, write %d: %w", k, i, err)
				}
			}
			want := 1 + other.Intn(opts.RecvDepth)
			for i := range want {
				size := 1 + other.Intn(300)
				got, err := c.Read(buf)
				if err != nil {
					return fmt.Errorf("round %d, read %d: %w", k, i, err)
				}
				if got != size {
					return fmt.Errorf("round %d, read %d: %d B, want %d", k, i, got, size)
				}
				for j := range got {
					if buf[j] != byte(k+i+j) {
						return fmt.Errorf("round %d, read %d: byte %d corrupt", k, i, j)
					}
				}
			}
		}
		return nil
	}
	errs := make(chan error, 2)
	go func() { errs <- side(client, 1, 2) }()
	go func() { errs <- side(server, 2, 1) }()
	timeout := time.After(2 * time.Minute)
	for range 2 {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-timeout:
			t.Fatal("the bursts stalled: corked Writes never went")
		}
	}
	for _, c := range []*rdma.Conn{client, server.(*rdma.Conn)} {
		st := c.Stats()
		require.Less(t, st.SendPosts, st.MessagesSent+st.CreditMessagesSent, "Writes to a peer that was behind shared posts")
	}
}

// A message-oriented reader whose writer Closed in the middle of a large
// Write gets the fragments that arrived and then io.EOF. That Read used to
// spin with the connection's lock held, and with it the CM goroutine that
// delivered the writer's disconnect: every Dial and Close of the process
// hung.
func TestMessagesReadAfterWriterClosedMidWrite(t *testing.T) {
	needDevice(t)
	lc := &rdma.ListenConfig{Options: rdma.Options{Messages: true}}
	c, s := pair(t, lc, nil)
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 1<<20))
		wrote <- err
	}()
	time.Sleep(500 * time.Millisecond)
	within(t, 20*time.Second, "the writer's Close", func() error { c.Close(); return nil })
	require.ErrorIs(t, <-wrote, net.ErrClosed, "Close ends the Write in progress")

	b := make([]byte, 2<<20)
	require.NoError(t, s.SetReadDeadline(time.Now().Add(20*time.Second)))
	var n int
	var err error
	within(t, 30*time.Second, "the reader's Read", func() error { n, err = s.Read(b); return nil })
	require.NoError(t, err)
	require.Positive(t, n, "the fragments that arrived")
	require.Less(t, n, 1<<20)
	_, err = s.Read(b)
	require.Equal(t, io.EOF, err)

	// Connection setup and teardown go on.
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	acc := acceptAll(ln)
	within(t, 20*time.Second, "a Dial, round trip and Close after it", func() error {
		return roundTripNew(ln.Addr().String(), acc, "after")
	})
}
