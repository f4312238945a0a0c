//go:build linux && cgo

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma"
)

// TestMain makes the test binary the command itself when asked to, so that
// a test can run it as another user under another limit.
func TestMain(m *testing.M) {
	if os.Getenv("RDMAINFO_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	if addr := os.Getenv("RDMAINFO_TEST_DIAL"); addr != "" {
		dialUntilRefused(addr)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Device tests run where RDMA_TEST_ADDR names the address of an interface
// with an RDMA device (the test bed sets it to its rxe netdev's address).
var testAddr = os.Getenv("RDMA_TEST_ADDR")

func needDevice(t *testing.T) {
	t.Helper()
	if testAddr == "" {
		t.Skip("no RDMA device: set RDMA_TEST_ADDR to an RDMA interface's IP (make test does, in the VM)")
	}
}

// testArgs are Options other than the defaults, so that the figures are
// checked against what was asked.
var (
	testArgs = []string{"-buffer", "4096", "-send-depth", "8", "-recv-depth", "32"}
	testOpts = rdma.Options{BufferSize: 4096, SendDepth: 8, RecvDepth: 32}
)

// runJSON runs the command with -json and decodes its document.
func runJSON(t *testing.T, args ...string) *Report {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"-json"}, args...), &stdout, &stderr)
	t.Logf("rdmainfo -json %s:\n%s", strings.Join(args, " "), stdout.String())
	require.Equal(t, 0, code, "exit status; stderr: %s", stderr.String())
	return decode(t, stdout.Bytes())
}

func decode(t *testing.T, doc []byte) *Report {
	t.Helper()
	// The schema's keys, as a consumer without these types reads them.
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(doc, &raw))
	for _, k := range []string{"devices", "memlock", "options"} {
		require.Contains(t, raw, k)
	}
	var r Report
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&r))
	return &r
}

// testPort finds the port whose GID is RDMA_TEST_ADDR.
func testPort(t *testing.T, r *Report) (Device, Port, GID) {
	t.Helper()
	for _, d := range r.Devices {
		for _, p := range d.Ports {
			for _, g := range p.GIDs {
				if g.IP == testAddr {
					return d, p, g
				}
			}
		}
	}
	require.FailNow(t, "no GID is "+testAddr)
	return Device{}, Port{}, GID{}
}

// TestDeviceJSON: the JSON document of the test bed: rxe0's port ACTIVE, a
// RoCE GID that is RDMA_TEST_ADDR on its netdev, MTU 4096, the limit
// reported, and the fits as the options say.
func TestDeviceJSON(t *testing.T) {
	needDevice(t)
	r := runJSON(t, testArgs...)
	require.Empty(t, r.DevicesError)
	d, p, g := testPort(t, r)
	require.Empty(t, d.Error)
	require.Equal(t, "ACTIVE", p.State)
	require.Equal(t, "LINK_UP", p.PhysState)
	require.Equal(t, 4096, p.ActiveMTU, "the test bed's netdev has jumbo frames")
	require.GreaterOrEqual(t, p.MaxMTU, p.ActiveMTU)
	require.Equal(t, "Ethernet", p.LinkLayer)
	require.Equal(t, "RoCE", d.Transport, "rxe is RoCE")
	require.Contains(t, []string{"RoCE v1", "RoCE v2"}, g.Type)
	require.NotEmpty(t, g.Netdev)
	require.Regexp(t, `^0000:0000:0000:0000:0000:ffff:[0-9a-f]{4}:[0-9a-f]{4}$`, g.GID)
	if a6 := os.Getenv("RDMA_TEST_ADDR6"); a6 != "" {
		var ips []string
		for _, g := range p.GIDs {
			ips = append(ips, g.IP)
		}
		require.Contains(t, ips, a6)
	}
	require.Regexp(t, `^[0-9a-f]{4}(:[0-9a-f]{4}){3}$`, d.NodeGUID)
	require.Positive(t, d.MaxCQE)
	require.Positive(t, d.MaxQP)
	require.Positive(t, d.MaxCQ)
	require.Positive(t, d.MaxMR)

	// Two rings of two 4 KiB messages; the depths cost no memory. CQ entries: the depths and 28 (see Options.CompletionQueueEntries).
	require.Equal(t, OptionsInfo{BufferSize: 4096, SendDepth: 8, RecvDepth: 32, RegisteredBytes: 4 * 4096, GrownBytes: 4*4096 + 2*(64<<10), CQEntries: 68}, r.Options)
	mem, err := testOpts.RegisteredMemory()
	require.NoError(t, err)
	require.Equal(t, mem, r.Options.RegisteredBytes)
	require.Positive(t, d.MaxPD)
	require.Equal(t, min(d.MaxCQ*(d.MaxCQE/51), d.MaxQP, d.MaxMR/2, d.MaxPD), d.Connections)

	// The test bed runs as root with ulimit -l unlimited.
	if os.Geteuid() == 0 {
		require.True(t, r.Memlock.CapIPCLock)
	}
	if r.Memlock.CapIPCLock || r.Memlock.Soft.Unlimited {
		require.Equal(t, unlimited, r.Memlock.Connections)
	} else {
		require.Equal(t, Limit{N: r.Memlock.Soft.N / uint64(mem)}, r.Memlock.Connections)
	}
}

// TestDeviceText: the text form names the device, the port's state and the
// address.
func TestDeviceText(t *testing.T) {
	needDevice(t)
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, run(nil, &stdout, &stderr), "stderr: %s", stderr.String())
	out := stdout.String()
	t.Logf("rdmainfo:\n%s", out)
	d, p, _ := testPort(t, runJSON(t))
	require.Contains(t, out, fmt.Sprintf("%s: ", d.Name))
	require.Contains(t, out, fmt.Sprintf("port %d: ACTIVE", p.Port))
	require.Regexp(t, `GID \d+ +[0-9a-f:]+ +RoCE v\d +\S+ +`+strings.ReplaceAll(testAddr, ".", `\.`)+"\n", out)
	require.Contains(t, out, "memlock")
}

// dialUntilRefused dials addr with the default Options until a dial fails,
// keeping every connection, and prints how many succeeded and whether the
// failure wraps ENOMEM (the locked-memory limit).
func dialUntilRefused(addr string) {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for len(conns) < 1024 {
		c, err := (&rdma.Dialer{Timeout: 30 * time.Second}).Dial("rdma", addr)
		if err != nil {
			fmt.Printf("%d %v\n%v\n", len(conns), errors.Is(err, syscall.ENOMEM), err)
			return
		}
		conns = append(conns, c)
	}
	fmt.Printf("%d false\n", len(conns))
}

// TestDeviceUnprivileged: as user nobody with an 8 MiB limit (as a service
// without LimitMEMLOCK meets it), the limit is finite, the capability
// absent, 256 idle connection ends of 32 KiB fit, and the text advises
// raising it; and a process under that limit does dial 256 connections, the
// 257th failing for locked memory.
func TestDeviceUnprivileged(t *testing.T) {
	needDevice(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as another user")
	}
	for _, tool := range []string{"setpriv", "prlimit"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s (util-linux)", tool)
		}
	}
	self, err := os.Executable()
	require.NoError(t, err)
	const limit = 8 << 20
	child := func(env string, args ...string) []byte {
		cmd := exec.Command("prlimit", fmt.Sprintf("--memlock=%d:%d", limit, limit),
			"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", self)
		cmd.Args = append(cmd.Args, args...)
		cmd.Env = append(os.Environ(), env)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		require.NoError(t, err, "rdmainfo %s", strings.Join(args, " "))
		return out
	}

	doc := child("RDMAINFO_TEST_MAIN=1", "-json")
	t.Logf("rdmainfo -json as nobody:\n%s", doc)
	r := decode(t, doc)
	_, p, _ := testPort(t, r)
	require.Equal(t, "ACTIVE", p.State)
	require.Equal(t, Memlock{Soft: Limit{N: limit}, Hard: Limit{N: limit}, Connections: Limit{N: 256}}, r.Memlock)

	text := string(child("RDMAINFO_TEST_MAIN=1"))
	t.Logf("rdmainfo as nobody:\n%s", text)
	require.Contains(t, text, "soft 8 MiB, hard 8 MiB; CAP_IPC_LOCK no")
	require.Contains(t, text, "256 within memlock")
	require.Contains(t, text, "raise the memlock limit: ulimit -l unlimited, or LimitMEMLOCK=infinity for a systemd service; "+
		"each connection registers 32 KiB with these Options (2080 KiB while it streams)")

	// What the figure promises holds: 256 connections, then ENOMEM.
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	accepted := make(chan []net.Conn)
	go func() {
		var conns []net.Conn
		for {
			c, err := ln.Accept()
			if err != nil {
				accepted <- conns
				return
			}
			conns = append(conns, c)
		}
	}()
	dialed := string(child("RDMAINFO_TEST_DIAL=" + ln.Addr().String()))
	t.Logf("dialing as nobody under the 8 MiB limit: %s", dialed)
	ln.Close()
	for _, c := range <-accepted {
		c.Close()
	}
	require.True(t, strings.HasPrefix(dialed, fmt.Sprintf("%d true\n", r.Memlock.Connections.N)), "dialed: %s", dialed)
}
