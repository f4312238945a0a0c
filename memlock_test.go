package rdma_test

import (
	"bufio"
	"context"
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

// The locked-memory limit, as an unprivileged service meets it: the test
// runs one side as user nobody (no CAP_IPC_LOCK) with RLIMIT_MEMLOCK at
// 24 KiB, less than one idle connection registers with the default
// Options (32 KiB: its receive ring fits, its send ring does not).

const memlockLimit = 24 << 10

// lowMemlock returns a command that runs this test binary as a child in
// role, unprivileged and with the low limit.
func lowMemlock(t *testing.T, role string, env ...string) *exec.Cmd {
	t.Helper()
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
	cmd := exec.Command("prlimit", fmt.Sprintf("--memlock=%d:%d", memlockLimit, memlockLimit),
		"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", self)
	cmd.Env = append(os.Environ(), append(env, "RDMA_TEST_MEMLOCK_ROLE="+role)...)
	return cmd
}

// runMemlockChild is the unprivileged side: "server" listens and prints
// what its Refused hook hears; "client" dials and prints its error.
func runMemlockChild(role string) int {
	switch role {
	case "server":
		lc := rdma.ListenConfig{Refused: func(remote net.Addr, err error) {
			fmt.Printf("refused %v: %v\n", errors.Is(err, syscall.ENOMEM), err)
		}}
		ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("listening", ln.Addr())
		time.Sleep(20 * time.Second) // the parent kills it sooner
		return 0
	case "client":
		_, err := rdma.Dial("rdma", os.Getenv("RDMA_TEST_MEMLOCK_ADDR"))
		fmt.Printf("enomem=%v\n%v\n", errors.Is(err, syscall.ENOMEM), err)
		return 0
	}
	return 2
}

// TestMemlockServer: a server whose limit is too low refuses with that
// reason, the dialer's error says so (and wraps ECONNREFUSED and ENOMEM),
// and the server's Refused hook gets the error that names the limit, its
// value, the need and the knobs.
func TestMemlockServer(t *testing.T) {
	needDevice(t)
	cmd := lowMemlock(t, "server")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	lines := bufio.NewScanner(out)
	require.True(t, lines.Scan(), "the child's first line")
	first := lines.Text()
	require.True(t, strings.HasPrefix(first, "listening "), "child: %s", first)
	addr := strings.TrimPrefix(first, "listening ")

	_, err = (&rdma.Dialer{Timeout: 30 * time.Second}).Dial("rdma", addr)
	t.Logf("the dialer's error: %v", err)
	requireOpError(t, err, "dial")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.ErrorIs(t, err, syscall.ENOMEM)
	var re *rdma.RefusedError
	require.ErrorAs(t, err, &re)
	require.Equal(t, rdma.RefusedLockedMemory, re.Reason)
	require.ErrorContains(t, err, "locked memory")

	require.True(t, lines.Scan(), "the server's hook reports the refusal")
	hook := lines.Text()
	t.Logf("the server's hook: %s", hook)
	for _, want := range []string{"refused true:", "RLIMIT_MEMLOCK 24 KiB", registering(), "ulimit -l", "LimitMEMLOCK", "Options.BufferSize"} {
		require.Contains(t, hook, want)
	}
}

// TestMemlockClient: a dialer whose limit is too low gets an error that
// names the limit, its value, what the connection needed and the knobs.
func TestMemlockClient(t *testing.T) {
	needDevice(t)
	ln, err := rdma.Listen("rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	out, err := lowMemlock(t, "client", "RDMA_TEST_MEMLOCK_ADDR="+ln.Addr().String()).Output()
	require.NoError(t, err)
	msg := string(out)
	t.Logf("the dialer's error: %s", msg)
	require.True(t, strings.HasPrefix(msg, "enomem=true\n"), msg)
	for _, want := range []string{"dial rdma", "ibv_reg_mr", "RLIMIT_MEMLOCK 24 KiB", registering(), "ulimit -l", "LimitMEMLOCK", "Options.BufferSize"} {
		require.Contains(t, msg, want)
	}
}

// TestMoreCompletionQueues opens more connection ends than one completion
// queue of the device holds (rxe's max_cqe is 32,767 entries; with
// 1024-deep queues each end takes about 2,060, so 15 fit): the device
// takes another CQ, with its own poller, instead of failing or growing a
// CQ past its maximum, and every connection carries data.
func TestMoreCompletionQueues(t *testing.T) {
	needDevice(t)
	opts := rdma.Options{BufferSize: 256, SendDepth: 1024, RecvDepth: 1024}
	lc := rdma.ListenConfig{Options: opts}
	ln, err := lc.Listen(context.Background(), "rdma", net.JoinHostPort(testAddr, "0"))
	require.NoError(t, err)
	defer ln.Close()
	wg := serveEcho(ln)
	defer wg.Wait()
	defer ln.Close()
	d := rdma.Dialer{Options: opts, Timeout: 30 * time.Second}
	const pairs = 12
	var conns []net.Conn
	for i := 0; i < pairs; i++ {
		c, err := d.Dial("rdma", ln.Addr().String())
		require.NoError(t, err, "connection %d", i+1)
		defer c.Close()
		conns = append(conns, c)
	}
	for i, c := range conns {
		transfer(t, c, c, fmt.Sprintf("connection %d", i+1))
	}
	devs := rdma.Devices()
	require.Len(t, devs, 1)
	t.Logf("%d connection ends: %+v", 2*pairs, devs[0])
	require.GreaterOrEqual(t, devs[0].CompletionQueues, 2)
	require.GreaterOrEqual(t, devs[0].Connections, 2*pairs)
}

// registering is what the memlock error says a default connection
// registers: its two rings, and on iWARP its header slots.
func registering() string {
	if siw() {
		return "registering 40 KiB"
	}
	return "registering 32 KiB"
}
