package rdmaprom_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// TestDevice scrapes a connection over RDMA while it carries known
// bytes, then after it closed: its counters stay in its name's, its
// gauges go to zero, and the devices' series go once the device is let
// go. The client's end is removed by the test, the server's by the
// listener's Tracer.
func TestDevice(t *testing.T) {
	needDevice(t)
	col, reg := registry(t)
	lc := rdma.ListenConfig{Tracer: &rdma.Tracer{ConnClosed: col.ConnClosed()}}
	nl, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer nl.Close()
	ln := nl.(*rdma.Listener)
	removeListener := col.AddListener("server", ln)
	s := newScraper(t, reg)

	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	client, err := rdma.Dial("rdma", ln.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	sc := <-accepted
	require.NotNil(t, sc)
	defer sc.Close()
	server := sc.(*rdma.Conn)
	removeClient := col.AddConn("client", client)
	removeServer := col.AddConn("server", server)

	// 100,000 bytes one way, 1,000 back.
	up, down := make([]byte, 100_000), make([]byte, 1_000)
	rand.Read(up)
	rand.Read(down)
	wrote := make(chan error, 1)
	go func() {
		_, err := client.Write(up)
		wrote <- err
	}()
	got := make([]byte, len(up))
	_, err = io.ReadFull(server, got)
	require.NoError(t, err)
	require.NoError(t, <-wrote)
	require.True(t, bytes.Equal(up, got))
	_, err = server.Write(down)
	require.NoError(t, err)
	got = make([]byte, len(down))
	_, err = io.ReadFull(client, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(down, got))

	csBefore, ssBefore := client.Stats(), server.Stats()
	m := s.scrape()
	cs, ss := client.Stats(), server.Stats()
	require.Equal(t, float64(len(up)), m.value(t, "rdma_conn_written_bytes_total", "name", "client"))
	require.Equal(t, float64(len(down)), m.value(t, "rdma_conn_read_bytes_total", "name", "client"))
	require.Equal(t, float64(len(up)), m.value(t, "rdma_conn_read_bytes_total", "name", "server"))
	require.Equal(t, float64(len(down)), m.value(t, "rdma_conn_written_bytes_total", "name", "server"))
	// Messages and posts may still move (a credit message on its way):
	// the scrape's lie between the readings around it.
	require.Positive(t, csBefore.MessagesSent)
	between(t, csBefore.MessagesSent, cs.MessagesSent, m.value(t, "rdma_conn_sent_messages_total", "name", "client"))
	between(t, ssBefore.MessagesReceived, ss.MessagesReceived, m.value(t, "rdma_conn_received_messages_total", "name", "server"))
	between(t, csBefore.SendPosts, cs.SendPosts, m.value(t, "rdma_conn_send_posts_total", "name", "client"))
	between(t, ssBefore.SendPosts, ss.SendPosts, m.value(t, "rdma_conn_send_posts_total", "name", "server"))
	between(t, ssBefore.CreditMessagesSent, ss.CreditMessagesSent, m.value(t, "rdma_conn_sent_credit_messages_total", "name", "server"))
	require.Zero(t, m.value(t, "rdma_conn_completion_errors_total", "name", "client"))
	require.Zero(t, m.value(t, "rdma_conn_completion_errors_total", "name", "server"))
	// The rings may shrink between a Stats call and the scrape (two
	// seconds idle): the gauge is one of the two readings around it.
	require.Contains(t, []float64{float64(csBefore.RegisteredBytes), float64(cs.RegisteredBytes)},
		m.value(t, "rdma_conn_registered_bytes", "name", "client"))
	require.Contains(t, []float64{float64(ssBefore.RegisteredBytes), float64(ss.RegisteredBytes)},
		m.value(t, "rdma_conn_registered_bytes", "name", "server"))
	require.Positive(t, m.value(t, "rdma_conn_registered_bytes", "name", "server"))
	for _, name := range []string{"client", "server"} {
		require.Equal(t, 1.0, m.value(t, "rdma_conn_open", "name", name, "transport", "rdma"))
		require.Zero(t, m.value(t, "rdma_conn_open", "name", name, "transport", "tcp"))
		require.Zero(t, m.value(t, "rdma_conn_closed_total", "name", name, "transport", "rdma"))
	}

	require.Equal(t, uint64(1), ln.Stats().Accepted)
	require.Equal(t, 1.0, m.value(t, "rdma_listener_accepted_total", "name", "server", "transport", "rdma"))
	require.Zero(t, m.value(t, "rdma_listener_accepted_total", "name", "server", "transport", "tcp"))
	require.Zero(t, m.value(t, "rdma_listener_refused_total", "name", "server", "reason", "backlog"))
	require.Zero(t, m.value(t, "rdma_listener_half_open_connections", "name", "server"))
	require.False(t, m.has("rdma_listener_accepted_total", "name", "client", "transport", "rdma"), "the client's name has no listener")

	perConn, err := rdma.Options{}.RegisteredMemory()
	require.NoError(t, err)
	devs := rdma.Devices()
	require.NotEmpty(t, devs)
	conns := 0
	for _, d := range devs {
		require.Equal(t, float64(d.Connections), m.value(t, "rdma_device_connections", "device", d.Name))
		require.Equal(t, float64(d.CQEntries), m.value(t, "rdma_device_cq_entries", "device", d.Name))
		require.Equal(t, float64(d.CompletionQueues), m.value(t, "rdma_device_completion_queues", "device", d.Name))
		require.Equal(t, float64(d.ActiveMTU), m.value(t, "rdma_device_active_mtu_bytes", "device", d.Name))
		require.Positive(t, d.ActiveMTU)
		// A grown ring may be on its way back to its first size while
		// the device and the connections are read (the device counts
		// its release before the connection does): the device holds at
		// least both ends' first registrations.
		require.GreaterOrEqual(t, m.value(t, "rdma_device_registered_bytes", "device", d.Name), float64(2*perConn))
		conns += d.Connections
	}
	require.Equal(t, 2, conns, "the client's and the server's ends")
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)

	// Closed and removed: the counters stay, the gauges fall.
	require.NoError(t, client.Close())
	_, err = server.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, server.Close())
	removeClient()
	require.Eventually(t, func() bool {
		return s.scrape().value(t, "rdma_conn_open", "name", "server", "transport", "rdma") == 0
	}, 10*time.Second, 10*time.Millisecond, "the Tracer's ConnClosed removes the server's end")
	removeServer() // too late: changes nothing
	m = s.scrape()
	require.Equal(t, float64(len(up)), m.value(t, "rdma_conn_written_bytes_total", "name", "client"))
	require.Equal(t, float64(len(up)), m.value(t, "rdma_conn_read_bytes_total", "name", "server"))
	require.Equal(t, float64(len(down)), m.value(t, "rdma_conn_written_bytes_total", "name", "server"))
	require.Equal(t, float64(client.Stats().MessagesSent), m.value(t, "rdma_conn_sent_messages_total", "name", "client"),
		"a closed connection's counters are folded as they were at its close")
	require.Equal(t, float64(server.Stats().SendPosts), m.value(t, "rdma_conn_send_posts_total", "name", "server"))
	for _, name := range []string{"client", "server"} {
		require.Zero(t, m.value(t, "rdma_conn_open", "name", name, "transport", "rdma"))
		require.Equal(t, 1.0, m.value(t, "rdma_conn_closed_total", "name", name, "transport", "rdma"), name)
		require.Zero(t, m.value(t, "rdma_conn_registered_bytes", "name", name))
	}
	require.Len(t, m["rdma_conn_written_bytes_total"].Metric, 2, "a series per name, none per connection")

	// The listener removed and closed: its counters stay; the device,
	// once let go, leaves the scrape.
	removeListener()
	require.NoError(t, ln.Close())
	require.Eventually(t, func() bool {
		return !s.scrape().has("rdma_device_connections", "device", devs[0].Name)
	}, 10*time.Second, 100*time.Millisecond, "the device's series go with the device")
	m = s.scrape()
	require.Equal(t, 1.0, m.value(t, "rdma_listener_accepted_total", "name", "server", "transport", "rdma"))
	require.Empty(t, rdma.Devices())
}

// between checks a counter's scraped value against readings of it before
// and after the scrape.
func between(t *testing.T, before, after uint64, got float64) {
	t.Helper()
	require.GreaterOrEqual(t, got, float64(before))
	require.LessOrEqual(t, got, float64(after))
}
