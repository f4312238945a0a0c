package rdma

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/rdmacm"
)

// A PacketConn's resolution of a destination over the fake connection
// manager (cm_test.go).

// fakeResolve runs one resolution on a loop of the fake; the fake's ids
// have no device (nil), which is the device the resolution wants.
func fakeResolve(t *testing.T, parent context.Context, timeout time.Duration) (*rdmacm.UDParam, error) {
	t.Helper()
	cm, err := acquireCM()
	require.NoError(t, err)
	defer cm.release()
	return resolveUD(parent, cm, netip.Addr{}, netip.MustParseAddrPort("127.0.0.1:9000"), timeout, nil, func() error { return errReleasedForTest })
}

var errReleasedForTest = errors.New("released")

// A resolution runs its three steps on an id of its own, and returns
// where datagrams go; the id goes after.
func TestResolveSequence(t *testing.T) {
	f := useFakeCM(t)
	ud, err := fakeResolve(t, context.Background(), time.Second)
	require.NoError(t, err)
	require.Equal(t, uint32(0x123), ud.QPNum)
	require.Equal(t, []string{"ResolveAddr", "ResolveRoute", "ConnectUD", "Destroy"}, f.ids[0].callList())
	f.waitReleased(t)
}

// Every way a resolution fails has its error, and leaves nothing behind.
func TestResolveFailures(t *testing.T) {
	post := func(ty rdmacm.EventType, status int) func(*fakeID, []byte) error {
		return func(id *fakeID, _ []byte) error {
			id.answer(ty, status, nil)
			return nil
		}
	}
	silent := func(*fakeID, []byte) error { return nil }
	for _, tc := range []struct {
		name   string
		call   string
		answer func(*fakeID, []byte) error
		check  func(*testing.T, error)
	}{
		{"address unresolved", "ResolveAddr", post(rdmacm.EventAddrError, -int(syscall.EHOSTUNREACH)),
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.EHOSTUNREACH) }},
		{"no device", "ResolveAddr", func(*fakeID, []byte) error { return os.NewSyscallError("rdma_resolve_addr", syscall.ENODEV) },
			func(t *testing.T, err error) { require.ErrorIs(t, err, ErrNoDevice) }},
		{"route unresolved", "ResolveRoute", post(rdmacm.EventRouteError, -int(syscall.ENETUNREACH)),
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.ENETUNREACH) }},
		{"device removed", "ResolveRoute", post(rdmacm.EventDeviceRemoval, 0),
			func(t *testing.T, err error) { require.ErrorIs(t, err, ErrNoDevice) }},
		{"nothing listens", "ConnectUD", post(rdmacm.EventUnreachable, sidrUnsupported),
			func(t *testing.T, err error) { require.ErrorIs(t, err, errNoListener) }},
		{"rejected", "ConnectUD", post(rdmacm.EventRejected, 0),
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.ECONNREFUSED) }},
		{"unreachable", "ConnectUD", post(rdmacm.EventUnreachable, -int(syscall.ETIMEDOUT)),
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.ETIMEDOUT) }},
		{"no answer", "ConnectUD", silent, // within the short timeout below
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.ETIMEDOUT) }},
		{"no UD parameters", "ConnectUD", post(rdmacm.EventEstablished, 0),
			func(t *testing.T, err error) { require.ErrorIs(t, err, syscall.EPROTO) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := useFakeCM(t)
			f.on(tc.call, tc.answer)
			timeout := 5 * time.Second // an answer comes at once
			if tc.name == "no answer" {
				timeout = 50 * time.Millisecond
			}
			_, err := fakeResolve(t, context.Background(), timeout)
			tc.check(t, err)
			f.waitReleased(t)
		})
	}
}

// A resolution cut short by the release returns the release's error; one
// that reaches another device than the PacketConn's says so.
func TestResolveCutShortAndOtherDevice(t *testing.T) {
	f := useFakeCM(t)
	f.on("ResolveRoute", func(*fakeID, []byte) error { return nil })
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel)
	_, err := fakeResolve(t, ctx, 5*time.Second)
	require.ErrorIs(t, err, errReleasedForTest)
	f.waitReleased(t)

	f = useFakeCM(t)
	cm, err := acquireCM()
	require.NoError(t, err)
	var other byte
	_, err = resolveUD(context.Background(), cm, netip.Addr{}, netip.MustParseAddrPort("127.0.0.1:9000"), time.Second, unsafe.Pointer(&other), nil)
	require.ErrorIs(t, err, errOtherDevice)
	cm.release()
	f.waitReleased(t)
}
