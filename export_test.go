package rdma

import "time"

// SetDefaultDialTimeout shortens the bound of a dial without a deadline for
// a test, and returns what restores it.
func SetDefaultDialTimeout(d time.Duration) (restore func()) {
	old := defaultDialTimeout
	defaultDialTimeout = d
	return func() { defaultDialTimeout = old }
}
