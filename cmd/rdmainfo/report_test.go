package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// The arithmetic and the rendering run on any host; main_test.go checks
// them against a device.

func TestPerConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts rdma.Options
		want OptionsInfo
	}{
		{"defaults", rdma.Options{},
			OptionsInfo{BufferSize: 64 << 10, SendDepth: 16, RecvDepth: 64, RegisteredBytes: 32 << 10, GrownBytes: 2080 << 10, CQEntries: 108}},
		// Two rings of two messages each; the depths cost no memory.
		{"small", rdma.Options{BufferSize: 4096, SendDepth: 8, RecvDepth: 32},
			OptionsInfo{BufferSize: 4096, SendDepth: 8, RecvDepth: 32, RegisteredBytes: 4 * 4096, GrownBytes: 4*4096 + 2*(64<<10), CQEntries: 68}},
		// Rings of 2 × 1000 bytes, rounded up to whole pages.
		{"odd size", rdma.Options{BufferSize: 1000, SendDepth: 8, RecvDepth: 32},
			OptionsInfo{BufferSize: 1000, SendDepth: 8, RecvDepth: 32, RegisteredBytes: 2 * 4096, GrownBytes: 2*4096 + 2*(16<<10), CQEntries: 68}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := perConnection(tc.opts)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			mem, err := tc.opts.RegisteredMemory()
			require.NoError(t, err)
			require.Equal(t, mem, got.RegisteredBytes)
		})
	}
	_, err := perConnection(rdma.Options{SendDepth: 1})
	require.ErrorContains(t, err, "SendDepth")
}

func TestMemlockFit(t *testing.T) {
	const perConn = 256 << 10 // the defaults: two rings of 128 KiB
	for _, tc := range []struct {
		name string
		soft Limit
		cap  bool
		want Limit
	}{
		{"8 MiB", Limit{N: 8 << 20}, false, Limit{N: 32}},
		{"exactly two", Limit{N: 2 * perConn}, false, Limit{N: 2}},
		{"one byte short of two", Limit{N: 2*perConn - 1}, false, Limit{N: 1}},
		{"128 KiB", Limit{N: 128 << 10}, false, Limit{N: 0}},
		{"64 GiB", Limit{N: 64 << 30}, false, Limit{N: 262144}},
		{"unlimited", unlimited, false, unlimited},
		{"CAP_IPC_LOCK", Limit{N: 64 << 10}, true, unlimited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, memlockFit(tc.soft, tc.cap, perConn))
		})
	}
}

func TestDeviceFit(t *testing.T) {
	rxe := Device{MaxCQ: 16384, MaxCQE: 32767, MaxQP: 1048560, MaxMR: 262144, MaxPD: 1048576}
	fit := func(d Device, cqe int) string {
		n, bound := deviceFit(d, cqe)
		return fmt.Sprintf("%d %s", n, bound)
	}
	require.Equal(t, "131072 max_mr", fit(rxe, 43)) // rxe, the defaults: two regions per connection
	few := rxe
	few.MaxCQ = 2
	require.Equal(t, "1524 max_cq × max_cqe", fit(few, 43))
	few.MaxQP = 100
	require.Equal(t, "100 max_qp", fit(few, 43))
	require.Equal(t, "0 max_cqe", fit(Device{MaxCQ: 4, MaxCQE: 40, MaxQP: 100, MaxMR: 100}, 43))
	require.Equal(t, "50 max_mr", fit(Device{MaxCQ: 4, MaxCQE: 4000, MaxQP: 100, MaxMR: 100, MaxPD: 100}, 43))
	require.Equal(t, "30 max_pd", fit(Device{MaxCQ: 4, MaxCQE: 4000, MaxQP: 100, MaxMR: 100, MaxPD: 30}, 43))
	require.Equal(t, "0 max_cqe", fit(rxe, 0))
}

func TestLimitJSON(t *testing.T) {
	for _, tc := range []struct {
		l    Limit
		json string
	}{{unlimited, `"unlimited"`}, {Limit{N: 8 << 20}, `8388608`}, {Limit{}, `0`}} {
		b, err := json.Marshal(tc.l)
		require.NoError(t, err)
		require.Equal(t, tc.json, string(b))
		var back Limit
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, tc.l, back)
	}
	var l Limit
	require.Error(t, json.Unmarshal([]byte(`"lots"`), &l))
}

func TestGID(t *testing.T) {
	for _, tc := range []struct {
		addr     string
		roce     bool
		gid, ip  string
		rendered string
	}{
		{"::ffff:10.77.0.1", true, "0000:0000:0000:0000:0000:ffff:0a4d:0001", "10.77.0.1", ""},
		{"fd77::1", true, "fd77:0000:0000:0000:0000:0000:0000:0001", "fd77::1", ""},
		{"fe80::5054:ff:fe12:3456", true, "fe80:0000:0000:0000:5054:00ff:fe12:3456", "fe80::5054:ff:fe12:3456", ""},
		{"fe80::2:c903:a:1b2c", false, "fe80:0000:0000:0000:0002:c903:000a:1b2c", "", ""}, // InfiniBand: no IP
	} {
		g := netip.MustParseAddr(tc.addr).As16()
		require.Equal(t, tc.gid, gidString(g))
		require.Equal(t, tc.ip, gidIP(g, tc.roce))
	}
	require.Equal(t, "0002:c903:000a:1b2c", formatGUID(0x0002c903000a1b2c))
}

func TestBytesIEC(t *testing.T) {
	for n, want := range map[uint64]string{
		0: "0 B", 1000: "1000 B", 64 << 10: "64 KiB", 37 * 64 << 10: "2368 KiB", 256 << 10: "256 KiB", 8 << 20: "8 MiB",
		1_000_000: "976.6 KiB", 1<<64 - 1: "16.0 EiB", 3 << 30: "3 GiB", 3<<30 + 512<<20: "3584 MiB",
	} {
		require.Equal(t, want, bytesIEC(n), "%d", n)
	}
}

// testReport is what rdmainfo says of the test bed's rxe0 (abridged).
func testReport(soft Limit, capIPCLock bool) *Report {
	per, _ := perConnection(rdma.Options{})
	return &Report{
		Devices: []Device{{
			Name: "rxe0", NodeType: "InfiniBand channel adapter", VendorID: 0xffffff, NodeGUID: "5054:00ff:fe12:3456",
			MaxQP: 1048560, MaxQPWR: 1048576, MaxCQ: 16384, MaxCQE: 32767, MaxMR: 262144, MaxPD: 1048576, MaxMRSize: 1<<64 - 1,
			Connections: 131072,
			Ports: []Port{{
				Port: 1, State: "ACTIVE", PhysState: "LINK_UP", LinkLayer: "Ethernet", ActiveMTU: 1024, MaxMTU: 4096,
				ActiveWidth: "1X", ActiveSpeed: "2.5 Gbps",
				GIDs: []GID{
					{Index: 0, GID: "fe80:0000:0000:0000:5054:00ff:fe12:3456", Type: "RoCE v2", Netdev: "rd0", IP: "fe80::5054:ff:fe12:3456"},
					{Index: 1, GID: "0000:0000:0000:0000:0000:ffff:0a4d:0001", Type: "RoCE v2", Netdev: "rd0", IP: "10.77.0.1"},
				},
			}},
		}},
		Memlock: Memlock{Soft: soft, Hard: soft, CapIPCLock: capIPCLock, Connections: memlockFit(soft, capIPCLock, per.RegisteredBytes)},
		Options: per,
	}
}

func TestText(t *testing.T) {
	for _, tc := range []struct {
		name    string
		soft    Limit
		cap     bool
		fit     string
		advised bool
	}{
		{"root", unlimited, true, "unlimited within memlock, 131072 within rxe0's max_mr", false},
		{"8 MiB", Limit{N: 8 << 20}, false, "256 within memlock, 131072 within rxe0's max_mr", true},
		{"8 MiB with CAP_IPC_LOCK", Limit{N: 8 << 20}, true, "unlimited within memlock", false},
		{"enough", Limit{N: 1 << 40}, false, "33554432 within memlock", false},
		{"less than the device holds", Limit{N: 2 << 30}, false, "65536 within memlock", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			require.NoError(t, testReport(tc.soft, tc.cap).writeText(&b))
			out := b.String()
			t.Logf("\n%s", out)
			require.Contains(t, out, "  port 1: ACTIVE (LINK_UP), Ethernet, MTU 1024 (max 4096), 1X 2.5 Gbps\n")
			require.Contains(t, out, tc.fit)
			advice := "raise the memlock limit: ulimit -l unlimited, or LimitMEMLOCK=infinity for a systemd service; " +
				"each connection registers 32 KiB with these Options (2080 KiB while it streams)"
			require.Equal(t, tc.advised, strings.Contains(out, advice))
			// The GID columns line up.
			var cols []int
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "GID ") {
					cols = append(cols, strings.Index(line, "RoCE v2"))
				}
			}
			require.Len(t, cols, 2)
			require.Equal(t, cols[0], cols[1])
		})
	}
}
