package rdma

import "time"

// Bounds of retryDestroy: destroyTries calls, destroyPause apart.
var (
	destroyTries = 100
	destroyPause = time.Millisecond
)

// retryDestroy calls destroy, the destruction of a verbs object (a QP, CQ
// or completion channel), a memory region's deregistration or a
// protection domain's deallocation, until it succeeds, destroyTries times
// at most, and returns the last failure. The kernel refuses (EBUSY) to
// destroy an object another verb is using at that moment; nothing of ours
// should be, but a bounded retry beats leaking the object until the
// process exits and, with it, the device, whose removal waits until the
// process lets go of everything of it. A failure returned is final: the
// caller keeps out of use whatever depends on the object (see
// arena.stuck).
func retryDestroy(destroy func() error) error {
	var err error
	for i := range destroyTries {
		if i > 0 {
			time.Sleep(destroyPause)
		}
		if err = destroy(); err == nil {
			return nil
		}
	}
	return err
}
