package rdma

import "time"

// SetPortDownGrace shortens how long a port may stay down before its
// connections fail, for a test, and returns what restores it.
func SetPortDownGrace(d time.Duration) (restore func()) {
	old := portDownGrace
	portDownGrace = d
	return func() { portDownGrace = old }
}

// SetDefaultDialTimeout shortens the bound of a dial without a deadline for
// a test, and returns what restores it.
func SetDefaultDialTimeout(d time.Duration) (restore func()) {
	old := defaultDialTimeout
	defaultDialTimeout = d
	return func() { defaultDialTimeout = old }
}

// ParseReject reads the reason out of a reject's private data.
func ParseReject(b []byte) RefuseReason { return parseReject(b) }
