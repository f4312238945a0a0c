package rdma

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/goverbs/rdma/internal/ibv"
	"github.com/goverbs/rdma/internal/rdmacm"
	"github.com/goverbs/rdma/internal/wire"
)

// A fake connection manager for the control path's host tests: fakeCM is
// the event channel, fakeID an id on it, and cmTestQP the QP of the data
// path fakeDataPath builds. By default the fake answers every step as a
// connection manager with a willing peer would (the address and the route
// resolve, a connect is established with a server's hello, an accept is
// established, a disconnect is answered); a test replaces the answer of
// one call with its own (fakeCM.on). The real loop (cm.go), the real
// dial, accept and release sequences and the real event handling run over
// it.

type fakeCM struct {
	events chan rdmacm.Event
	stop   chan struct{}

	mu        sync.Mutex
	stopped   bool
	destroyed bool
	ids       []*fakeID
	reqs      map[uintptr]*fakeID // connect requests' new ids, by the event's Handle
	nextReq   uintptr
	answers   map[string]func(id *fakeID, private []byte) error
	newIDErr  error
	qps       []*cmTestQP
	peerHello wire.Hello // what a dialed server announces
	headers   bool       // the transport has no immediate data
}

// useFakeCM makes the process's connection manager a fake one and its
// data paths fakes, until the test ends.
func useFakeCM(t *testing.T) *fakeCM {
	t.Helper()
	releasing.Wait()
	cmMu.Lock()
	running := theCM != nil
	cmMu.Unlock()
	require.False(t, running, "a connection manager loop is still running")
	f := &fakeCM{events: make(chan rdmacm.Event, 256), stop: make(chan struct{}), reqs: map[uintptr]*fakeID{},
		answers:   map[string]func(*fakeID, []byte) error{},
		peerHello: wire.Hello{RecvDepth: 8, CtrlDepth: wire.CtrlDepth, BufSize: 1024, RingSize: 1 << 16, RingAddr: testRAddr, RKey: testRKey}}
	oldOpen, oldPath := openEventChannel, fakeDataPath
	openEventChannel = func() (eventChannel, error) {
		// A new loop's handles start again at 1: what an earlier loop
		// left unread must not reach the new loop's handlers.
		for len(f.events) > 0 {
			<-f.events
		}
		f.mu.Lock()
		f.stopped, f.destroyed = false, false
		f.stop = make(chan struct{})
		f.mu.Unlock()
		return f, nil
	}
	fakeDataPath = f.dataPath
	t.Cleanup(func() {
		releasing.Wait()
		openEventChannel, fakeDataPath = oldOpen, oldPath
		// A test that failed midway may have left a connection or a
		// listener on the fake's loop: the next test, and the device
		// tests, must not find it as the process's loop.
		cmMu.Lock()
		left := theCM != nil && theCM.ch == eventChannel(f)
		if left {
			theCM = nil
		}
		cmMu.Unlock()
		if left && !t.Failed() {
			t.Error("the test left the fake connection manager's loop running")
		}
	})
	return f
}

// on replaces the fake's answer to call (a cmID method's name).
func (f *fakeCM) on(call string, answer func(id *fakeID, private []byte) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers[call] = answer
}

func (f *fakeCM) post(ev rdmacm.Event) { f.events <- ev }

func (f *fakeCM) Run(handle func(rdmacm.Event)) error {
	f.mu.Lock()
	stop := f.stop
	f.mu.Unlock()
	for {
		select {
		case ev := <-f.events:
			handle(ev)
		case <-stop:
			return nil
		}
	}
}

func (f *fakeCM) Interrupt() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.stopped {
		f.stopped = true
		close(f.stop)
	}
}

func (f *fakeCM) Destroy() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroyed = true
}

func (f *fakeCM) Quiet(fn func()) { fn() }

func (f *fakeCM) newID(handle uintptr) (cmID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.newIDErr != nil {
		return nil, f.newIDErr
	}
	id := &fakeID{cm: f, handle: handle}
	f.ids = append(f.ids, id)
	return id, nil
}

func (f *fakeCM) requestID(ev rdmacm.Event) cmID {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id := f.reqs[ev.Handle]; id != nil {
		return id
	}
	return nil
}

func (f *fakeCM) newUDPID(handle uintptr) (udID, error) {
	id, err := f.newID(handle)
	if err != nil {
		return nil, err
	}
	return id.(*fakeID), nil
}

// request sends the listener whose id has handle a connect request with
// private data hello, and returns the request's new id.
func (f *fakeCM) request(listenHandle uintptr, hello []byte) *fakeID {
	f.mu.Lock()
	f.nextReq++
	key := f.nextReq
	id := &fakeID{cm: f, handle: listenHandle, peer: netip.MustParseAddrPort("127.0.0.2:40000")}
	f.reqs[key] = id
	f.ids = append(f.ids, id)
	f.mu.Unlock()
	f.post(rdmacm.Event{Type: rdmacm.EventConnectRequest, Handle: key, ListenHandle: listenHandle, PrivateData: hello, Initiator: 1, Responder: 1})
	return id
}

// released reports whether the fake's loop went with its last reference.
func (f *fakeCM) released() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.destroyed
}

// undestroyed are the ids not destroyed yet.
func (f *fakeCM) undestroyed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, id := range f.ids {
		if !id.isDestroyed() {
			n++
		}
	}
	return n
}

// dataPath builds a data path over a cmTestQP whose completions go to comp.
// With headers set it is a transport without immediate data (iWARP's).
func (f *fakeCM) dataPath(opts Options, comp completer) (layout, dataPath, error) {
	lay := newLayout(opts)
	if f.headers {
		lay = lay.withHeaders()
	}
	q := &cmTestQP{comp: comp}
	f.mu.Lock()
	f.qps = append(f.qps, q)
	f.mu.Unlock()
	return lay, dataPath{qp: q, mem: make([]byte, lay.size()), sendBase: testBase + uint64(lay.sendOff()), sendLKey: testLKey,
		recvRKey: 0x77, recvLKey: 0x78, sp: nopSpinner{}}, nil
}

// fakeID is an id of the fake connection manager; it records the calls
// made of it.
type fakeID struct {
	cm *fakeCM

	mu        sync.Mutex
	handle    uintptr
	calls     []string
	private   [][]byte // what each connect, accept and reject carried
	destroyed bool
	peer      netip.AddrPort
}

func (id *fakeID) record(call string, private []byte) (func(*fakeID, []byte) error, uintptr) {
	id.mu.Lock()
	id.calls = append(id.calls, call)
	if private != nil {
		id.private = append(id.private, append([]byte(nil), private...))
	}
	h := id.handle
	id.mu.Unlock()
	id.cm.mu.Lock()
	defer id.cm.mu.Unlock()
	return id.cm.answers[call], h
}

// step records call and gives its answer: the test's, or the default,
// which posts ev (if it has a type) for the id.
func (id *fakeID) step(call string, private []byte, ev *rdmacm.Event) error {
	answer, h := id.record(call, private)
	if answer != nil {
		return answer(id, private)
	}
	if ev != nil {
		ev.Handle = h
		id.cm.post(*ev)
	}
	return nil
}

// answer posts an event of type ty, with status and private data, for the id.
func (id *fakeID) answer(ty rdmacm.EventType, status int, private []byte) {
	id.mu.Lock()
	h := id.handle
	id.mu.Unlock()
	id.cm.post(rdmacm.Event{Type: ty, Status: status, Handle: h, PrivateData: private})
}

func (id *fakeID) callList() []string {
	id.mu.Lock()
	defer id.mu.Unlock()
	return append([]string(nil), id.calls...)
}

func (id *fakeID) isDestroyed() bool {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.destroyed
}

func (id *fakeID) Bind(netip.AddrPort) error { return id.step("Bind", nil, nil) }
func (id *fakeID) Listen(int) error          { return id.step("Listen", nil, nil) }
func (id *fakeID) ResolveAddr(netip.Addr, netip.AddrPort, int) error {
	return id.step("ResolveAddr", nil, &rdmacm.Event{Type: rdmacm.EventAddrResolved})
}
func (id *fakeID) ResolveRoute(int) error {
	return id.step("ResolveRoute", nil, &rdmacm.Event{Type: rdmacm.EventRouteResolved})
}
func (id *fakeID) SetAckTimeout(uint8) error { return id.step("SetAckTimeout", nil, nil) }
func (id *fakeID) ConnectRead(private []byte, _, _ uint8) error {
	return id.step("ConnectRead", private, &rdmacm.Event{Type: rdmacm.EventEstablished, PrivateData: id.cm.peerHello.Marshal()})
}
func (id *fakeID) AcceptRead(private []byte, _, _ uint8) error {
	return id.step("AcceptRead", private, &rdmacm.Event{Type: rdmacm.EventEstablished})
}
func (id *fakeID) Reject(private []byte) error { return id.step("Reject", private, nil) }
func (id *fakeID) AcceptUD(uint32) error       { return id.step("AcceptUD", nil, nil) }

// ConnectUD's default answer is the service ID resolution's: the peer's
// QP number and Q_Key.
func (id *fakeID) ConnectUD() error {
	return id.step("ConnectUD", nil, &rdmacm.Event{Type: rdmacm.EventEstablished, UD: &rdmacm.UDParam{QPNum: 0x123, QKey: 0x11111111}})
}
func (id *fakeID) JoinMulticast(netip.Addr) error { return id.step("JoinMulticast", nil, nil) }
func (id *fakeID) PortNum() uint8                 { return 1 }

// Disconnect flushes the QP and is answered, as a connection manager
// whose peer answers the disconnect request does.
func (id *fakeID) Disconnect() error {
	id.flush()
	return id.step("Disconnect", nil, &rdmacm.Event{Type: rdmacm.EventDisconnected})
}

func (id *fakeID) ErrorQP() error {
	id.flush()
	return id.step("ErrorQP", nil, nil)
}

// flush moves the connection's QP to the error state.
func (id *fakeID) flush() {
	id.cm.mu.Lock()
	qps := append([]*cmTestQP(nil), id.cm.qps...)
	id.cm.mu.Unlock()
	for _, q := range qps {
		if q.comp == nil {
			continue
		}
		if c, ok := q.comp.(*Conn); ok && c.id == cmID(id) {
			q.setError()
		}
	}
}

func (id *fakeID) SetHandle(h uintptr) {
	id.mu.Lock()
	defer id.mu.Unlock()
	id.handle = h
}
func (id *fakeID) CreateQP(unsafe.Pointer, unsafe.Pointer, int, int, int) (unsafe.Pointer, int, error) {
	return nil, 0, errors.New("fake: no QPs")
}
func (id *fakeID) AdoptQP(unsafe.Pointer) error { return errors.New("fake: no QPs") }
func (id *fakeID) DestroyQP() error             { return nil }
func (id *fakeID) ReleaseQP() error             { return nil }
func (id *fakeID) Verbs() unsafe.Pointer        { return nil }
func (id *fakeID) LocalAddr() netip.AddrPort    { return netip.MustParseAddrPort("127.0.0.1:40001") }
func (id *fakeID) PeerAddr() netip.AddrPort {
	if id.peer.IsValid() {
		return id.peer
	}
	return netip.MustParseAddrPort("127.0.0.1:7471")
}
func (id *fakeID) Destroy() error {
	id.step("Destroy", nil, nil)
	id.mu.Lock()
	defer id.mu.Unlock()
	id.destroyed = true
	return nil
}

// cmTestQP is a QP whose peer's NIC acknowledges every send at once, and
// which, once in the error state, flushes every work request posted to
// it. Its completions arrive off the posting goroutine, as a poller's do.
type cmTestQP struct {
	comp completer

	mu     sync.Mutex
	broken bool
	recvs  []ibv.RecvWR // receives posted and not completed, in order
	sends  []ibv.SendWR
}

func (q *cmTestQP) deliver(wcs ...ibv.WC) {
	go func() {
		for _, wc := range wcs {
			if q.comp.complete(wc) {
				q.comp.lockAndFlush()
			}
		}
	}()
}

func (q *cmTestQP) PostSends(wrs []ibv.SendWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sends = append(q.sends, wrs...)
	wc := ibv.WC{WRID: wrs[len(wrs)-1].ID}
	if q.broken {
		wc.Status = ibv.WCFlushErr
	}
	q.deliver(wc)
	return nil
}

func (q *cmTestQP) PostRecvs(wrs []ibv.RecvWR) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.broken {
		q.deliver(flushed(len(wrs))...)
		return nil
	}
	q.recvs = append(q.recvs, wrs...)
	return nil
}

// arrive completes the oldest posted receive with a SEND of a header
// (imm, no data) into its slot, as an iWARP peer's message arrives.
func (q *cmTestQP) arrive(c *Conn, h wire.Header) {
	q.mu.Lock()
	wr := q.recvs[0]
	q.recvs = q.recvs[1:]
	q.mu.Unlock()
	c.mu.Lock()
	binary.BigEndian.PutUint32(c.mem[wr.Addr-testBase:], h.Imm())
	binary.BigEndian.PutUint32(c.mem[wr.Addr-testBase+4:], 0)
	c.mu.Unlock()
	q.deliver(ibv.WC{WRID: wr.ID, Opcode: ibv.WCOpRecv, ByteLen: ibv.HeaderLen})
}

// sent are the sends posted so far.
func (q *cmTestQP) sent() []ibv.SendWR {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]ibv.SendWR(nil), q.sends...)
}

func (q *cmTestQP) setError() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.broken {
		return
	}
	q.broken = true
	q.deliver(flushed(len(q.recvs))...)
	q.recvs = nil
}

func flushed(n int) []ibv.WC {
	wcs := make([]ibv.WC, n)
	for i := range wcs {
		wcs[i] = ibv.WC{WRID: recvWRID, Status: ibv.WCFlushErr}
	}
	return wcs
}

// waitReleased waits until every id of the fake is destroyed and its loop
// has gone: nothing of the connection manager is left.
func (f *fakeCM) waitReleased(t *testing.T) {
	t.Helper()
	releasing.Wait()
	require.Eventually(t, func() bool { return f.undestroyed() == 0 && f.released() }, 5*time.Second, time.Millisecond,
		"ids left: %d, loop released: %v", f.undestroyed(), f.released())
}
