package rdma

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/wire"
)

// Conn.Stats over the fake QP (see conn_test.go).

func TestConnStatsExact(t *testing.T) {
	p := newFakeConnOpts(t, Options{BufferSize: 1024, SendDepth: 8, RecvDepth: 8, Poll: PollEvent, Messages: true}, true)
	p.c.Write(bytes.Repeat([]byte("w"), 2500)) // three messages
	p.c.Write([]byte("x"))                     // one
	p.ack()
	p.deliver(wire.Header{Type: wire.MsgDataMore, Credits: 4}, bytes.Repeat([]byte("r"), 1024))
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("rr"))
	b := make([]byte, 4096)
	n, err := p.c.Read(b)
	require.NoError(t, err)
	require.Equal(t, 1026, n)
	p.complete(ibv.WC{WRID: p.q.recvs[5].ID, Status: ibv.WCRetryExcErr})
	p.complete(ibv.WC{WRID: p.q.recvs[6].ID, Status: ibv.WCFlushErr})

	s := p.c.Stats()
	require.Equal(t, uint64(2501), s.BytesWritten)
	require.Equal(t, uint64(1026), s.BytesRead)
	require.Equal(t, uint64(4), s.MessagesSent)
	require.Equal(t, uint64(2), s.MessagesReceived)
	require.Equal(t, uint64(1), s.CompletionErrors, "a flush is no error")
	require.Equal(t, len(p.c.mem), s.RegisteredBytes)
	require.Equal(t, ConnStats{}, (*Conn)(nil).Stats())
}

func TestConnStatsCreditWaits(t *testing.T) {
	p := newFakeConn(t, 2, 64)
	p.c.SetNoDelay(true)
	p.c.Write([]byte("1"))
	p.c.Write([]byte("2"))
	p.ack()
	done := make(chan struct{})
	go func() {
		p.c.Write(bytes.Repeat([]byte("x"), 100)) // fills the pending buffer, then waits for a credit
		close(done)
	}()
	p.eventually(func(c *Conn) bool { return c.tx.pendLen == 64 })
	time.Sleep(5 * time.Millisecond)
	p.deliver(wire.Header{Type: wire.MsgCredit, Credits: 1}, nil)
	<-done
	s := p.c.Stats()
	require.Equal(t, uint64(1), s.CreditWaits)
	require.GreaterOrEqual(t, s.CreditWaitTime, 5*time.Millisecond)
	require.Positive(t, s.Parks, "PollEvent parks")
	require.Zero(t, s.Spins)

	// Reads: a credit message goes when the reader consumed a batch (two
	// messages: one alone waits for a reply to carry its credit).
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("a"))
	p.c.Read(make([]byte, 8))
	require.Zero(t, p.c.Stats().CreditMessagesSent)
	p.deliver(wire.Header{Type: wire.MsgData}, []byte("b"))
	p.c.Read(make([]byte, 8))
	require.Equal(t, uint64(1), p.c.Stats().CreditMessagesSent)
}
