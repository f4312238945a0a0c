package rdma

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// A connection's reactions to its CM events over the fake connection
// manager (cm_test.go), on a transport without immediate data too,
// where the dialing side sends first (conn_cm.go).

// credits counts the credit messages among sends, as headers.
func credits(wrs []ibv.SendWR) int {
	n := 0
	for _, wr := range wrs {
		if wr.Flags&ibv.SendHeader != 0 && wire.HeaderOf(wr.Imm).Type == wire.MsgCredit {
			n++
		}
	}
	return n
}

// dialHeaders dials over the fake on a transport without immediate data.
func dialHeaders(t *testing.T) (*fakeCM, *Conn) {
	t.Helper()
	f := useFakeCM(t)
	f.headers = true
	f.peerHello.Flags = wire.HelloHeaders
	c, err := fakeDial(t, 5*time.Second)
	require.NoError(t, err)
	return f, c
}

// On iWARP the dialing side sends a credit message once connected, and
// repeats it while its peer says nothing, nudgeFirstRepeats times.
func TestDialSendsFirst(t *testing.T) {
	f, c := dialHeaders(t)
	q := f.qps[0]
	require.GreaterOrEqual(t, credits(q.sent()), 1, "the first message goes at once")
	require.Eventually(t, func() bool { return credits(q.sent()) == 1+nudgeFirstRepeats }, 5*time.Second, time.Millisecond)
	time.Sleep(2 * nudgeFirstAfter << (3 * (nudgeFirstRepeats - 1))) // twice the last pause
	require.Equal(t, 1+nudgeFirstRepeats, credits(q.sent()), "no more than the repeats")
	require.NoError(t, c.Close())
	f.waitReleased(t)
}

// The dialing side's repeats end once its peer is heard.
func TestDialSendsFirstUntilHeard(t *testing.T) {
	f, c := dialHeaders(t)
	q := f.qps[0]
	q.arrive(c, wire.Header{Type: wire.MsgCredit})
	require.Eventually(t, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.heardFirst
	}, 5*time.Second, time.Millisecond)
	n := credits(q.sent())
	time.Sleep(2 * nudgeFirstAfter << (3 * (nudgeFirstRepeats - 1))) // twice the last pause
	require.Equal(t, n, credits(q.sent()), "heard: no more repeats")
	require.NoError(t, c.Close())
	f.waitReleased(t)
}

// On iWARP an accepted connection is handed to Accept only once the
// dialing side's first message has arrived, and answers it; one whose
// peer goes first is dropped.
func TestAcceptAwaitsFirst(t *testing.T) {
	f := useFakeCM(t)
	f.headers = true
	l, _ := fakeListen(t, 4)
	hello := f.peerHello
	hello.Flags = wire.HelloHeaders
	id := f.request(l.handle, hello.Marshal())
	require.Eventually(t, func() bool { return len(id.callList()) >= 2 && len(f.qps) == 1 }, 5*time.Second, time.Millisecond)
	accepted := make(chan *Conn, 1)
	go func() {
		nc, err := l.Accept()
		if err == nil {
			accepted <- nc.(*Conn)
		}
		close(accepted)
	}()
	var c *Conn
	require.Eventually(t, func() bool {
		c = l.pendingConn()
		if c == nil {
			return false
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.awaitFirst
	}, 5*time.Second, time.Millisecond, "established, awaiting the first message")
	select {
	case <-accepted:
		t.Fatal("accepted before the dialing side's first message")
	case <-time.After(20 * time.Millisecond):
	}
	f.qps[0].arrive(c, wire.Header{Type: wire.MsgCredit})
	got := <-accepted
	require.Same(t, c, got)
	require.Eventually(t, func() bool { return credits(f.qps[0].sent()) == 1 }, 5*time.Second, time.Millisecond, "the first message is answered")

	// A second one's peer disconnects before its first message.
	id2 := f.request(l.handle, hello.Marshal())
	require.Eventually(t, func() bool {
		c := l.pendingConn()
		if c == nil {
			return false
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.awaitFirst
	}, 5*time.Second, time.Millisecond)
	id2.answer(rdmacm.EventDisconnected, 0, nil)
	require.Eventually(t, id2.isDestroyed, 5*time.Second, time.Millisecond, "dropped, never accepted")
	require.Equal(t, uint64(1), l.Stats().Accepted)

	require.NoError(t, got.Close())
	require.NoError(t, l.Close())
	f.waitReleased(t)
}

// Events an established connection gets while it waits for nothing: a
// TIMEWAIT_EXIT and other events change nothing.
func TestEstablishedIgnoresOtherEvents(t *testing.T) {
	f := useFakeCM(t)
	c, err := fakeDial(t, 5*time.Second)
	require.NoError(t, err)
	f.ids[0].answer(rdmacm.EventTimewaitExit, 0, nil)
	f.ids[0].answer(rdmacm.EventAddrChange, 0, nil)
	// The loop delivers in order: once a marker behind them reached its
	// handler, both are in the connection's inbox; then the inbox is
	// waited out.
	m := &markHandler{seen: make(chan struct{})}
	h := c.cm.register(m)
	f.post(rdmacm.Event{Type: rdmacm.EventAddrChange, Handle: h})
	<-m.seen
	c.cm.unregister(h)
	require.Eventually(t, func() bool {
		c.inbox.mu.Lock()
		defer c.inbox.mu.Unlock()
		return !c.inbox.running && len(c.inbox.evs) == 0
	}, 5*time.Second, time.Millisecond)
	c.mu.Lock()
	require.Equal(t, phaseEstablished, c.life.phase)
	require.NoError(t, c.life.werr)
	require.NoError(t, c.life.rerr)
	c.mu.Unlock()
	require.NoError(t, c.Close())
	f.waitReleased(t)
}

// markHandler is a CM handler that says when its first event came.
type markHandler struct {
	once sync.Once
	seen chan struct{}
}

func (m *markHandler) cmEvent(rdmacm.Event) { m.once.Do(func() { close(m.seen) }) }
func (m *markHandler) cmLost(error)         {}
