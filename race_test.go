//go:build race

package rdma_test

const raceEnabled = true
