package rdmaprom_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	rdmaprom "github.com/goverbs/rdma/metrics/prometheus"

	"github.com/goverbs/rdma"
)

// Host tests: no RDMA here, so a listener with FallbackTCP is a TCP
// listener whose Stats count what it accepts, and a PacketConn with
// FallbackUDP a UDP socket.

// fallbackListener listens on loopback, over TCP alone.
func fallbackListener(t testing.TB) *rdma.Listener {
	t.Helper()
	lc := rdma.ListenConfig{FallbackTCP: true}
	nl, err := lc.Listen(context.Background(), "rdma", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { nl.Close() })
	return nl.(*rdma.Listener)
}

func registry(t testing.TB) (*rdmaprom.Collector, *prometheus.Registry) {
	col := rdmaprom.NewCollector()
	reg := prometheus.NewPedanticRegistry() // checks each metric against Describe
	require.NoError(t, reg.Register(col))
	return col, reg
}

// TestFallbackListener scrapes a listener and the connections it accepts
// as they come and go.
func TestFallbackListener(t *testing.T) {
	ln := fallbackListener(t)
	col, reg := registry(t)
	removeListener := col.AddListener("api", ln)
	s := newScraper(t, reg)

	sc := s.scrape()
	require.Zero(t, sc.value(t, "rdma_listener_accepted_total", "name", "api", "transport", "tcp"))
	require.Zero(t, sc.value(t, "rdma_listener_half_open_connections", "name", "api"))
	require.Equal(t, dto.MetricType_COUNTER, sc.kind("rdma_listener_accepted_total"))
	require.Equal(t, dto.MetricType_GAUGE, sc.kind("rdma_listener_half_open_connections"))
	require.NotContains(t, sc, "rdma_conn_open", "no connection registered under any name yet")
	require.NotContains(t, sc, "rdma_packet_conns")

	const n = 3
	var clients []net.Conn
	var removes []func()
	for range n {
		cc, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		clients = append(clients, cc)
		sc, err := ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { sc.Close() })
		require.False(t, rdma.IsRDMA(sc))
		removes = append(removes, col.AddConn("api", sc))
	}

	sc = s.scrape()
	require.Equal(t, float64(n), sc.value(t, "rdma_listener_accepted_total", "name", "api", "transport", "tcp"))
	require.Equal(t, float64(ln.Stats().AcceptedTCP), sc.value(t, "rdma_listener_accepted_total", "name", "api", "transport", "tcp"))
	require.Zero(t, sc.value(t, "rdma_listener_accepted_total", "name", "api", "transport", "rdma"))
	for _, reason := range []string{"unknown", "locked_memory", "resources", "backlog", "shutdown", "protocol", "no_listener"} {
		require.Zero(t, sc.value(t, "rdma_listener_refused_total", "name", "api", "reason", reason))
	}
	require.Equal(t, float64(n), sc.value(t, "rdma_conn_open", "name", "api", "transport", "tcp"))
	require.Zero(t, sc.value(t, "rdma_conn_open", "name", "api", "transport", "rdma"))
	require.Zero(t, sc.value(t, "rdma_conn_closed_total", "name", "api", "transport", "tcp"))
	require.Zero(t, sc.value(t, "rdma_conn_written_bytes_total", "name", "api"), "a TCP connection has no counters of its own")

	// One closes: the gauge falls, the counter of closed ones rises, and
	// removing it again changes nothing.
	require.NoError(t, clients[0].Close())
	removes[0]()
	removes[0]()
	sc = s.scrape()
	require.Equal(t, float64(n-1), sc.value(t, "rdma_conn_open", "name", "api", "transport", "tcp"))
	require.Equal(t, 1.0, sc.value(t, "rdma_conn_closed_total", "name", "api", "transport", "tcp"))

	// The listener removed: what it counted stays, what it accepts after
	// is not counted.
	removeListener()
	cc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer cc.Close()
	c, err := ln.Accept()
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, uint64(n+1), ln.Stats().AcceptedTCP)
	sc = s.scrape()
	require.Equal(t, float64(n), sc.value(t, "rdma_listener_accepted_total", "name", "api", "transport", "tcp"))
	for _, r := range removes[1:] {
		r()
	}
	sc = s.scrape()
	require.Zero(t, sc.value(t, "rdma_conn_open", "name", "api", "transport", "tcp"))
	require.Equal(t, float64(n), sc.value(t, "rdma_conn_closed_total", "name", "api", "transport", "tcp"))
}

// TestConnState serves HTTP with the Collector's ConnState: the server's
// connections are counted while they live, without the handler's help.
func TestConnState(t *testing.T) {
	ln := fallbackListener(t)
	col, reg := registry(t)
	defer col.AddListener("web", ln)()
	srv := &http.Server{
		Handler:   http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ConnState: col.ConnState("web"),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Close()
		require.ErrorIs(t, <-served, http.ErrServerClosed)
	}()
	s := newScraper(t, reg)

	tr := &http.Transport{MaxIdleConnsPerHost: 2}
	client := &http.Client{Transport: tr}
	get := func() {
		resp, err := client.Get("http://" + ln.Addr().String() + "/")
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, "ok", string(b))
	}
	// Two requests at once open two connections; both stay idle after.
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 2 {
		wg.Go(func() { <-start; get() })
	}
	close(start)
	wg.Wait()
	sc := s.scrape()
	accepted := sc.value(t, "rdma_listener_accepted_total", "name", "web", "transport", "tcp")
	require.GreaterOrEqual(t, accepted, 1.0)
	require.Equal(t, accepted, sc.value(t, "rdma_conn_open", "name", "web", "transport", "tcp"), "every connection accepted is open")

	tr.CloseIdleConnections()
	require.Eventually(t, func() bool {
		sc := s.scrape()
		return sc.value(t, "rdma_conn_open", "name", "web", "transport", "tcp") == 0 &&
			sc.value(t, "rdma_conn_closed_total", "name", "web", "transport", "tcp") == accepted
	}, 5*time.Second, 10*time.Millisecond, "the server's closes are seen through ConnState")
}

// TestPacketConn scrapes a PacketConn that fell back to UDP.
func TestPacketConn(t *testing.T) {
	lc := rdma.ListenConfig{FallbackUDP: true}
	npc, err := lc.ListenPacket(context.Background(), "rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer npc.Close()
	pc := npc.(*rdma.PacketConn)
	require.True(t, pc.IsUDP())
	col, reg := registry(t)
	remove := col.AddPacketConn("dns", pc)
	s := newScraper(t, reg)

	sc := s.scrape()
	require.Equal(t, 1.0, sc.value(t, "rdma_packet_conns", "name", "dns", "transport", "udp"))
	require.Zero(t, sc.value(t, "rdma_packet_conns", "name", "dns", "transport", "rdma"))
	st := pc.Stats()
	require.Equal(t, float64(st.DatagramsSent), sc.value(t, "rdma_packet_sent_datagrams_total", "name", "dns"))
	require.Equal(t, float64(st.DropsNoReceive), sc.value(t, "rdma_packet_dropped_datagrams_total", "name", "dns", "reason", "no_receive"))
	require.Equal(t, float64(st.PeerHits), sc.value(t, "rdma_packet_peer_lookups_total", "name", "dns", "result", "hit"))
	require.NotContains(t, sc, "rdma_listener_accepted_total", "no listener registered")
	remove()
	sc = s.scrape()
	require.Zero(t, sc.value(t, "rdma_packet_conns", "name", "dns", "transport", "udp"))
}

// TestLint runs Prometheus's linter over every family a scrape of all
// kinds has (the devices' are linted by the device test, and by
// TestDeviceMetricsLint without one).
func TestLint(t *testing.T) {
	ln := fallbackListener(t)
	col, reg := registry(t)
	defer col.AddListener("api", ln)()
	lc := rdma.ListenConfig{FallbackUDP: true}
	pc, err := lc.ListenPacket(context.Background(), "rdma", "127.0.0.1:0")
	require.NoError(t, err)
	defer pc.Close()
	defer col.AddPacketConn("api", pc.(*rdma.PacketConn))()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	defer col.AddConn("api", a)()

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
	n, err := testutil.GatherAndCount(reg)
	require.NoError(t, err)
	require.Equal(t, 12+16+19, n, "the series of a listener (one refusal series per reason), a PacketConn and a connection's name")
}

// TestConcurrent registers, removes and scrapes at once (under -race, the
// check is the race detector's).
func TestConcurrent(t *testing.T) {
	ln := fallbackListener(t)
	col, reg := registry(t)
	defer col.AddListener("api", ln)()
	const workers, rounds = 4, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			name := fmt.Sprint("w", w%2)
			for range rounds {
				col.AddConn(name, a)()
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for range rounds / 10 {
				_, err := reg.Gather()
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	sc := newScraper(t, reg).scrape()
	for _, name := range []string{"w0", "w1"} {
		require.Equal(t, float64(workers/2*rounds), sc.value(t, "rdma_conn_closed_total", "name", name, "transport", "tcp"))
		require.Zero(t, sc.value(t, "rdma_conn_open", "name", name, "transport", "tcp"))
	}
	require.Len(t, sc["rdma_conn_open"].Metric, 4, "two names, two transports each")
}

// A second Collector reports the same metrics: the registry refuses it.
func TestRegisterTwice(t *testing.T) {
	_, reg := registry(t)
	err := reg.Register(rdmaprom.NewCollector())
	require.ErrorAs(t, err, new(prometheus.AlreadyRegisteredError))
}

func BenchmarkAddConn(b *testing.B) {
	col := rdmaprom.NewCollector()
	c, d := net.Pipe()
	defer c.Close()
	defer d.Close()
	b.ReportAllocs()
	for b.Loop() {
		col.AddConn("api", c)()
	}
}
