//go:build linux && cgo

package rdma

import "github.com/goverbs/rdma/internal/rdmacm"

// verbsChannel is librdmacm's event channel as the loop uses it.
type verbsChannel struct{ *rdmacm.EventChannel }

func newEventChannel() (eventChannel, error) {
	ch, err := rdmacm.NewEventChannel()
	if err != nil {
		return nil, err
	}
	return verbsChannel{ch}, nil
}

func (c verbsChannel) newID(handle uintptr) (cmID, error) {
	id, err := rdmacm.NewID(c.EventChannel, handle)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return id, nil
}

func (c verbsChannel) requestID(ev rdmacm.Event) cmID { return ev.ID }

func (c verbsChannel) newUDPID(handle uintptr) (udID, error) {
	id, err := rdmacm.NewUDPID(c.EventChannel, handle)
	if err != nil {
		return nil, err
	}
	return id, nil
}
