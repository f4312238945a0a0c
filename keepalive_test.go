package rdma

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
)

func TestKeepAliveFrom(t *testing.T) {
	def := net.KeepAliveConfig{Enable: true, Idle: DefaultKeepAliveIdle, Interval: DefaultKeepAliveInterval, Count: DefaultKeepAliveCount}
	for _, tc := range []struct {
		name   string
		period time.Duration
		cfg    net.KeepAliveConfig
		want   net.KeepAliveConfig
	}{
		{"zero value: on, with the defaults", 0, net.KeepAliveConfig{}, def},
		{"a period sets Idle", 7 * time.Second, net.KeepAliveConfig{}, net.KeepAliveConfig{Enable: true, Idle: 7 * time.Second, Interval: DefaultKeepAliveInterval, Count: DefaultKeepAliveCount}},
		{"negative period: off", -1, net.KeepAliveConfig{}, net.KeepAliveConfig{}},
		{"an enabled config wins over the period", -1, net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: 2 * time.Second, Count: 5},
			net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: 2 * time.Second, Count: 5}},
		{"negative fields of a new config: the defaults", 0, net.KeepAliveConfig{Enable: true, Idle: -1, Interval: -1, Count: -1}, def},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, keepAliveFrom(tc.period, tc.cfg))
		})
	}
	cur := net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: 2 * time.Second, Count: 5}
	require.Equal(t, cur, normalizeKeepAlive(net.KeepAliveConfig{Enable: true, Idle: -1, Interval: -1, Count: -1}, cur),
		"negative fields keep the current values")
}

func TestKeepAliveTicks(t *testing.T) {
	cfg := net.KeepAliveConfig{Enable: true, Idle: 4 * time.Second, Interval: 3 * time.Second, Count: 2}
	k := keepalive{cfg: cfg}
	step := cfg.Idle / kaSteps

	// Heard between ticks: start over.
	act, next := k.tick(1, false)
	require.Equal(t, kaWait, act)
	require.Equal(t, step, next)
	// Quiet for kaSteps ticks (at least Idle): probe, then every Interval.
	for i := 1; i < kaSteps; i++ {
		act, next = k.tick(1, false)
		require.Equal(t, kaWait, act, "quiet tick %d", i)
		require.Equal(t, step, next)
	}
	act, next = k.tick(1, false)
	require.Equal(t, kaProbe, act)
	require.Equal(t, cfg.Interval, next)
	// The probe is still out (the NIC retransmits it): not sent again,
	// but it counts.
	act, _ = k.tick(1, true)
	require.Equal(t, kaWait, act)
	// Count probes unanswered: fail.
	act, _ = k.tick(1, true)
	require.Equal(t, kaFail, act)

	// An answer on the way resets everything.
	k = keepalive{cfg: cfg}
	k.tick(5, false)
	for i := 0; i < kaSteps; i++ {
		k.tick(5, false)
	}
	require.Equal(t, 1, k.probes)
	act, next = k.tick(6, false)
	require.Equal(t, kaWait, act)
	require.Equal(t, step, next)
	require.Zero(t, k.probes)
}

// probes returns the keepalive probes among wrs.
func probes(wrs []ibv.SendWR) []ibv.SendWR {
	var p []ibv.SendWR
	for _, wr := range wrs {
		if wr.Flags&ibv.SendEmptyWrite != 0 {
			p = append(p, wr)
		}
	}
	return p
}

func TestConnKeepAliveProbesAQuietPeer(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	cfg := net.KeepAliveConfig{Enable: true, Idle: 8 * time.Millisecond, Interval: 20 * time.Millisecond, Count: 3}
	require.NoError(t, p.c.SetKeepAliveConfig(cfg))
	defer p.c.SetKeepAlive(false)

	// The peer is quiet: a probe goes, signaled, carrying no payload.
	require.Eventually(t, func() bool { return len(probes(p.q.posted())) == 1 }, 5*time.Second, time.Millisecond)
	probe := probes(p.q.posted())[0]
	require.Zero(t, probe.Len)
	require.NotZero(t, probe.Flags&ibv.SendSignaled, "its completion tells the peer answered")
	p.c.mu.Lock()
	require.True(t, p.c.tx.probeOut())
	p.c.mu.Unlock()

	// Its NIC answers: the connection lives on and, quiet again, probes again.
	p.complete(ibv.WC{WRID: probe.ID})
	p.c.mu.Lock()
	require.False(t, p.c.tx.probeOut())
	p.c.mu.Unlock()
	require.Eventually(t, func() bool { return len(probes(p.q.posted())) == 2 }, 5*time.Second, time.Millisecond)
	_, err := p.c.Write([]byte("still open"))
	require.NoError(t, err)
	require.Equal(t, uint64(2), p.c.Stats().KeepAliveProbes)
}

func TestConnKeepAliveFailsASilentPeer(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	cfg := net.KeepAliveConfig{Enable: true, Idle: 8 * time.Millisecond, Interval: 10 * time.Millisecond, Count: 2}
	// The keepalive's clock starts with the setter: so does the test's,
	// or the bound below is missed by the setter's own time.
	start := time.Now()
	require.NoError(t, p.c.SetKeepAliveConfig(cfg))

	// A Read that only waits learns of it, within Idle + Count × Interval
	// (and a tick).
	_, err := p.c.Read(make([]byte, 8))
	took := time.Since(start)
	require.ErrorIs(t, err, syscall.ETIMEDOUT)
	requireNetOpError(t, err, "read")
	require.ErrorContains(t, err, "keepalive")
	require.GreaterOrEqual(t, took, cfg.Idle+time.Duration(cfg.Count)*cfg.Interval)
	require.Len(t, probes(p.q.posted()), 1, "one probe, unanswered: the NIC retransmits it")
	_, err = p.c.Write([]byte("x"))
	require.ErrorIs(t, err, syscall.ETIMEDOUT)
}

func TestConnKeepAliveOff(t *testing.T) {
	p := newFakeConn(t, 4, 64)
	require.NoError(t, p.c.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 4 * time.Millisecond, Interval: time.Millisecond, Count: 1}))
	require.NoError(t, p.c.SetKeepAlive(false))
	time.Sleep(30 * time.Millisecond)
	require.Empty(t, probes(p.q.posted()), "no probe once off")
	p.c.mu.Lock()
	require.Nil(t, p.c.life.rerr)
	require.Equal(t, 4*time.Millisecond, p.c.ka.cfg.Idle, "off keeps the settings for SetKeepAlive(true)")
	p.c.mu.Unlock()

	// On again with the kept settings; SetKeepAlivePeriod changes Idle only.
	require.NoError(t, p.c.SetKeepAlivePeriod(time.Hour))
	p.c.mu.Lock()
	require.Equal(t, net.KeepAliveConfig{Enable: true, Idle: time.Hour, Interval: time.Millisecond, Count: 1}, p.c.ka.cfg)
	p.c.mu.Unlock()
	require.NoError(t, p.c.SetKeepAlive(false))

	p.c.mu.Lock()
	p.c.life.set(shutClosed)
	p.c.mu.Unlock()
	require.ErrorIs(t, p.c.SetKeepAlive(true), net.ErrClosed)
}

// A connection whose send side failed (a post failed) cannot probe; it
// must not then count the probes it could not send as unanswered and fail
// its reads. One whose message-oriented Write was cut still probes.
func TestConnKeepAliveNeedsASendSide(t *testing.T) {
	cfg := net.KeepAliveConfig{Enable: true, Idle: 4 * time.Millisecond, Interval: 2 * time.Millisecond, Count: 1}

	p := newFakeConn(t, 4, 64)
	p.c.mu.Lock()
	p.c.life.failWrite(syscall.EIO)
	p.c.mu.Unlock()
	require.NoError(t, p.c.SetKeepAliveConfig(cfg))
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, p.c.SetKeepAlive(false))
	p.c.mu.Lock()
	require.Nil(t, p.c.life.rerr, "reads still work")
	p.c.mu.Unlock()
	require.Empty(t, probes(p.q.posted()))

	p = newFakeConn(t, 4, 64)
	p.c.mu.Lock()
	p.c.life.cut = true
	p.c.mu.Unlock()
	require.NoError(t, p.c.SetKeepAliveConfig(cfg))
	defer p.c.SetKeepAlive(false)
	require.Eventually(t, func() bool { return len(probes(p.q.posted())) == 1 }, 5*time.Second, time.Millisecond)
}
