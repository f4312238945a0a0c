//go:build linux && cgo

package rdma

import (
	"sync"

	"github.com/goverbs/rdma/internal/rdmacm"
)

// cmHandler receives the rdma_cm events of one id. Handlers run on the
// event goroutine, one at a time. They may make system calls and take
// short locks (a listener sets a connection's resources up there), but must
// never wait for CM events or for goroutines that wait on them: in
// particular never call rdmacm.ID.Destroy on an id that may still have
// events.
type cmHandler interface {
	cmEvent(ev rdmacm.Event)
}

// cmLoop owns the process's rdma_cm event channel and the goroutine that
// reads it. It exists while anything (a listener, a connection, a dial in
// progress) holds a reference, so an idle process has no goroutine left.
type cmLoop struct {
	ch       *rdmacm.EventChannel
	done     chan struct{}
	handlers map[uintptr]cmHandler // under cmMu
	next     uintptr
	refs     int
	// dispatchMu is held while a handler runs, so unregister can wait out
	// an event being handled: after it returns, the handler is never
	// called again.
	dispatchMu sync.Mutex
}

var (
	cmMu  sync.Mutex
	theCM *cmLoop
)

// acquireCM returns the running loop with one more reference, starting it
// if needed.
func acquireCM() (*cmLoop, error) {
	cmMu.Lock()
	defer cmMu.Unlock()
	if theCM == nil {
		ch, err := rdmacm.NewEventChannel()
		if err != nil {
			return nil, hostDeviceError(err)
		}
		theCM = &cmLoop{ch: ch, done: make(chan struct{}), handlers: make(map[uintptr]cmHandler)}
		go theCM.run()
	}
	theCM.refs++
	return theCM, nil
}

// release drops a reference; the last one stops the goroutine and destroys
// the channel. Every id created on it must have been destroyed.
func (l *cmLoop) release() {
	cmMu.Lock()
	l.refs--
	last := l.refs == 0
	if last {
		theCM = nil
	}
	cmMu.Unlock()
	if last {
		l.ch.Interrupt()
		<-l.done
		l.ch.Destroy()
	}
}

// register returns a new handle for an id's events.
func (l *cmLoop) register(h cmHandler) uintptr {
	cmMu.Lock()
	defer cmMu.Unlock()
	l.next++
	l.handlers[l.next] = h
	return l.next
}

// unregister stops delivery to handle's handler, waiting for a delivery in
// progress. It must not be called from a handler.
func (l *cmLoop) unregister(handle uintptr) {
	l.dispatchMu.Lock()
	defer l.dispatchMu.Unlock()
	cmMu.Lock()
	delete(l.handlers, handle)
	cmMu.Unlock()
}

func (l *cmLoop) run() {
	defer close(l.done)
	l.ch.Run(func(ev rdmacm.Event) {
		handle := ev.Handle
		if ev.Type == rdmacm.EventConnectRequest {
			handle = ev.ListenHandle
		}
		l.dispatchMu.Lock()
		defer l.dispatchMu.Unlock()
		cmMu.Lock()
		h := l.handlers[handle]
		cmMu.Unlock()
		if h != nil {
			h.cmEvent(ev)
		} else if ev.Type == rdmacm.EventConnectRequest {
			// The listener is going away: refuse and drop the new id. Its
			// only event has been acknowledged, so destroying it here
			// cannot wait on this goroutine.
			ev.ID.Reject(marshalReject(RefusedShutdown))
			ev.ID.Destroy()
		}
	})
}
