package rdmaprom

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goverbs/rdma"
)

// The series, one table per kind of thing registered: each row is a
// metric and the field of the library's stats it reads. The help texts
// say what the library's godoc says of the field, short.

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

type deviceMetric struct {
	desc  *prometheus.Desc
	value func(*rdma.DeviceStats) int
}

// Every device field is a level, not a count of events: gauges.
var deviceMetrics = []deviceMetric{
	{desc("rdma_device_connections", "Connections of this process using the RDMA device, including those being set up or torn down.", "device"),
		func(d *rdma.DeviceStats) int { return d.Connections }},
	{desc("rdma_device_cq_entries", "Entries of the completion queues this process has on the device, together.", "device"),
		func(d *rdma.DeviceStats) int { return d.CQEntries }},
	{desc("rdma_device_completion_queues", "Completion queues this process's connections share on the device.", "device"),
		func(d *rdma.DeviceStats) int { return d.CompletionQueues }},
	{desc("rdma_device_registered_bytes", "Memory this process has registered with the device.", "device"),
		func(d *rdma.DeviceStats) int { return d.RegisteredBytes }},
	{desc("rdma_device_pooled_bytes", "Memory of closed connections kept for the next ones on the device.", "device"),
		func(d *rdma.DeviceStats) int { return d.PooledBytes }},
	{desc("rdma_device_pooled_qps", "Queue pairs of closed dialed connections kept for the next dials on the device.", "device"),
		func(d *rdma.DeviceStats) int { return d.PooledQPs }},
	{desc("rdma_device_active_mtu_bytes", "Active MTU of the device's first port.", "device"),
		func(d *rdma.DeviceStats) int { return d.ActiveMTU }},
}

var (
	listenerAccepted = desc("rdma_listener_accepted_total",
		"Connections the listeners accepted, by transport (tcp: TCP fallback).", "name", "transport")
	listenerRefused = desc("rdma_listener_refused_total",
		"Connection requests the listeners refused, by reason.", "name", "reason")
	listenerEvicted = desc("rdma_listener_evicted_total",
		"Handshakes the listeners gave up to make room for new requests.", "name")
	listenerHalfOpen = desc("rdma_listener_half_open_connections",
		"Handshakes in progress on the listeners.", "name")
)

// refuseReasons are the reason label's values, indexed by
// rdma.RefuseReason; one the table lacks (a reason newer than it) is
// reported by number.
var refuseReasons = [...]string{
	rdma.RefusedUnknown:      "unknown",
	rdma.RefusedLockedMemory: "locked_memory",
	rdma.RefusedResources:    "resources",
	rdma.RefusedBacklog:      "backlog",
	rdma.RefusedShutdown:     "shutdown",
	rdma.RefusedProtocol:     "protocol",
	rdma.RefusedNoListener:   "no_listener",
	rdma.RefusedBusy:         "busy",
}

func refuseReason(r rdma.RefuseReason) string {
	if int(r) < len(refuseReasons) && refuseReasons[r] != "" {
		return refuseReasons[r]
	}
	return "reason_" + strconv.Itoa(int(r))
}

// Transports, the values of the transport label.
const (
	transportRDMA = "rdma"
	transportTCP  = "tcp"
	transportUDP  = "udp"
)

var (
	connOpen = desc("rdma_conn_open",
		"Connections registered now, by transport (tcp: not an RDMA connection, as a fallback's).", "name", "transport")
	connClosed = desc("rdma_conn_closed_total",
		"Connections removed (closed), by transport.", "name", "transport")
	connRegistered = desc("rdma_conn_registered_bytes",
		"Memory the open connections have registered with their devices.", "name")
	connWaits = desc("rdma_conn_waits_total",
		"Reads' and Writes' waits, by how they ended: polling the completion queue (spin) or parked (park).", "name", "mode")
	connCreditWait = desc("rdma_conn_credit_wait_seconds_total",
		"Time Writes spent waiting for the peer to free a receive.", "name")
)

type connCounter struct {
	desc  *prometheus.Desc
	value func(*rdma.ConnStats) uint64
}

var connCounters = []connCounter{
	{desc("rdma_conn_written_bytes_total", "Payload bytes Writes accepted.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.BytesWritten }},
	{desc("rdma_conn_read_bytes_total", "Payload bytes Reads returned.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.BytesRead }},
	{desc("rdma_conn_sent_messages_total", "Data messages posted.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.MessagesSent }},
	{desc("rdma_conn_received_messages_total", "Data messages received.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.MessagesReceived }},
	{desc("rdma_conn_sent_credit_messages_total", "Messages sent that only returned credits.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.CreditMessagesSent }},
	{desc("rdma_conn_send_posts_total", "Calls to post sends (a message chain each).", "name"),
		func(s *rdma.ConnStats) uint64 { return s.SendPosts }},
	{desc("rdma_conn_credit_waits_total", "Writes that waited for the peer to free a receive.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.CreditWaits }},
	{desc("rdma_conn_completion_errors_total", "Work completions that failed, not counting teardown's flushes.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.CompletionErrors }},
	{desc("rdma_conn_keepalive_probes_total", "Keepalive probes sent.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.KeepAliveProbes }},
	{desc("rdma_conn_ring_growths_total", "Moves of a receive ring to a big one while the peer streamed.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.RingGrowths }},
	{desc("rdma_conn_ring_shrinks_total", "Moves of a receive ring back to the small one once idle.", "name"),
		func(s *rdma.ConnStats) uint64 { return s.RingShrinks }},
}

var (
	packetOpen = desc("rdma_packet_conns",
		"PacketConns registered now, by transport (udp: the UDP fallback).", "name", "transport")
	packetDropped = desc("rdma_packet_dropped_datagrams_total",
		"Datagrams dropped, by reason.", "name", "reason")
	packetPeerLookups = desc("rdma_packet_peer_lookups_total",
		"Writes that found their destination's address handle cached (hit) or resolved it (miss).", "name", "result")
)

type packetCounter struct {
	desc  *prometheus.Desc
	value func(*rdma.PacketStats) uint64
}

var packetCounters = []packetCounter{
	{desc("rdma_packet_sent_datagrams_total", "Datagrams sent.", "name"),
		func(s *rdma.PacketStats) uint64 { return s.DatagramsSent }},
	{desc("rdma_packet_received_datagrams_total", "Datagrams received.", "name"),
		func(s *rdma.PacketStats) uint64 { return s.DatagramsReceived }},
	{desc("rdma_packet_sent_bytes_total", "Payload bytes of the datagrams sent.", "name"),
		func(s *rdma.PacketStats) uint64 { return s.BytesSent }},
	{desc("rdma_packet_received_bytes_total", "Payload bytes of the datagrams received.", "name"),
		func(s *rdma.PacketStats) uint64 { return s.BytesReceived }},
	{desc("rdma_packet_dropped_stale_fragments_total", "Fragments dropped that could complete no datagram.", "name"),
		func(s *rdma.PacketStats) uint64 { return s.DropsStaleFragments }},
	{desc("rdma_packet_peer_resolution_failures_total", "Resolutions of a destination that failed.", "name"),
		func(s *rdma.PacketStats) uint64 { return s.PeerFailures }},
	{desc("rdma_packet_send_errors_total", "Sends the device completed with an error.", "name"),
		func(s *rdma.PacketStats) uint64 { return s.SendErrors }},
}

// packetDrops are the reason label's values of packetDropped.
var packetDrops = []struct {
	reason string
	value  func(*rdma.PacketStats) uint64
}{
	{"no_receive", func(s *rdma.PacketStats) uint64 { return s.DropsNoReceive }},
	{"truncated", func(s *rdma.PacketStats) uint64 { return s.DropsTruncated }},
	{"reassembly", func(s *rdma.PacketStats) uint64 { return s.DropsReassembly }},
	{"malformed", func(s *rdma.PacketStats) uint64 { return s.DropsMalformed }},
	{"no_listener", func(s *rdma.PacketStats) uint64 { return s.DropsNoListener }},
}
