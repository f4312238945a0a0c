package rdmacm

import (
	"os"
	"syscall"
)

// callError is the error of the C call name that failed with errno (nil
// when the library set none). Without an errno it is EIO, a failure of
// unknown cause: never ENODEV, which callers take to mean that the host
// has no RDMA device.
func callError(name string, errno error) error {
	if errno == nil {
		errno = syscall.EIO
	}
	return os.NewSyscallError(name, errno)
}
