//go:build linux && cgo

package rdmacm

import "testing"

// String gives librdmacm's names without calling it.
func TestEventTypeString(t *testing.T) {
	for ty := EventAddrResolved; ty <= EventTimewaitExit+1; ty++ {
		if got, want := ty.String(), cEventName(ty); got != want {
			t.Errorf("%d: String() = %q, librdmacm says %q", int(ty), got, want)
		}
	}
}
