//go:build !linux || !cgo

package main

import (
	"fmt"
	"os"
)

// Devices are asked through libibverbs, which needs Linux and cgo.
func main() {
	fmt.Fprintln(os.Stderr, "rdmainfo: needs linux and cgo")
	os.Exit(1)
}
