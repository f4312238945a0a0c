package rdma

import "time"

// Counting is always on: the counters are plain fields under the
// connection's mutex, so a Stats call costs a lock and keeping them
// nothing measurable.

// ConnStats are a connection's counters since it was set up, as
// Conn.Stats returns them.
type ConnStats struct {
	BytesWritten     uint64 // payload bytes Writes accepted
	BytesRead        uint64 // payload bytes Reads returned
	MessagesSent     uint64 // data messages posted (a Write larger than a message is several)
	MessagesReceived uint64 // data messages received
	// CreditMessagesSent counts messages that only returned credits: when
	// the reverse direction has no data to carry them.
	CreditMessagesSent uint64
	// SendPosts counts ibv_post_send calls (a system call each on rxe):
	// fewer than the messages when several go in one chain (a Write of
	// several messages, or Writes to a message-oriented peer that waited
	// for its answer while it was behind; see SetNoDelay).
	SendPosts uint64
	// CreditWaits counts the Writes that waited for the peer: it had no
	// receive free and the pending message was full, or its receive ring
	// had no room for the next message (it had not read what was there);
	// CreditWaitTime is how long they waited in all.
	CreditWaits    uint64
	CreditWaitTime time.Duration
	// CompletionErrors counts work completions that failed, not counting
	// the flushed ones every teardown produces.
	CompletionErrors uint64
	// RegisteredBytes is the memory the connection has registered with the
	// device: its rings (see Options.RegisteredMemory) and its regions
	// (see RegisterRegion), and 256 KiB once RemoteRegion.ReadAt or
	// WriteAt has been used.
	RegisteredBytes int
	// KeepAliveProbes counts the keepalive probes sent (see
	// SetKeepAliveConfig): one per quiet spell of the peer.
	KeepAliveProbes uint64
	// RingGrowths and RingShrinks count the moves of the connection's
	// receive ring to a big one, while the peer streamed to it, and back to
	// the small one once it was idle (see Options.RegisteredMemory).
	RingGrowths, RingShrinks uint64
	// Spins and Parks count the waits of Reads and Writes that ended while
	// the waiter was polling the completion queue itself, and those that
	// parked first (see PollMode).
	Spins, Parks uint64
}

// Stats returns the connection's counters. On a nil or zero Conn it
// returns zeros.
func (c *Conn) Stats() ConnStats {
	if !c.ok() {
		return ConnStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.RegisteredBytes += len(c.mem) + c.rs.ownedBytes() // the rings; c.st counts the regions
	return s
}

// ListenerStats are a listener's counters since it started, as
// Listener.Stats returns them.
type ListenerStats struct {
	Accepted uint64 // connections established and queued for Accept
	// Refused counts the connection requests refused, indexed by
	// reason: Refused[RefusedBacklog], say.
	Refused [NumRefuseReasons]uint64
	// Evicted counts handshakes given up to make room for new requests
	// (their dialer never confirmed the connection).
	Evicted uint64
	// HalfOpen is how many handshakes are in progress now.
	HalfOpen int
	// AcceptedTCP counts the TCP connections accepted by a listener with
	// ListenConfig.FallbackTCP.
	AcceptedTCP uint64
}

// Stats returns the listener's counters: connections accepted, requests
// refused by reason, handshakes evicted, and those in progress. On a nil or
// zero Listener it returns zeros.
func (l *Listener) Stats() ListenerStats {
	if !l.ok() {
		return ListenerStats{}
	}
	l.statsMu.Lock()
	s := l.st
	l.statsMu.Unlock()
	s.HalfOpen = l.halfOpenNow()
	return s
}

// DeviceStats are the totals of one RDMA device that connections of this
// process use.
type DeviceStats struct {
	Name        string // the device, e.g. "rxe0" or "mlx5_0"
	Connections int    // connections using it, including those being set up or torn down
	CQEntries   int    // the size of its completion queues, together
	// CompletionQueues is how many CQs its connections share: one until
	// it reaches the device's max_cqe, then as many as needed.
	CompletionQueues int
	// RegisteredBytes is the memory registered by those connections, and
	// any of theirs whose deregistration failed (it stays registered, and
	// counted, as long as the device is in use).
	RegisteredBytes int
	// PooledBytes is memory of closed connections kept for the next ones
	// while the device is in use: their registered memory (at most 32 MiB
	// unless SetDevicePool says otherwise) and, under a bound of its own
	// of the same size, the memory of the rings they grew while
	// streaming, mapped but no longer registered.
	PooledBytes int
	// PooledQPs is the QPs of closed dialed connections kept with that
	// memory, reset, for the next dials to reuse instead of creating their
	// own (at most 256 unless SetDevicePool says otherwise; none on
	// iWARP; accepted connections create theirs).
	PooledQPs int
	// ActiveMTU is its first port's active MTU in bytes: the packets
	// RDMA messages are cut into (4096 on RoCE fabrics with jumbo frames).
	ActiveMTU int
}

// Devices returns the totals of every device in use by this process; none
// when no connection has used one for half a second.
func Devices() []DeviceStats { return devicesStats() }

// countWait records how a Read's or Write's wait ended; mu is held.
func (c *Conn) countWait(spun bool) {
	if spun {
		c.st.Spins++
	} else {
		c.st.Parks++
	}
}
