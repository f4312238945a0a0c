// Package zerocost is a provider for benchmarks: two RC queue pairs joined
// in one process, behind libibverbs' own data-path calls, that cost no
// kernel, no device and no wire.
//
// In rdma-core ibv_post_send, ibv_post_recv, ibv_poll_cq and
// ibv_req_notify_cq are inline functions that call through the context's
// table of operations (qp->context->ops.post_send and so on). The
// provider is a context of its own whose table points at its functions,
// with QPs and CQs that point at that context: the library's real cgo data
// path (internal/ibv's shims, the same calls it makes on a device) runs
// against it at the host's full speed, and the C benchmarks (zc_bench.c)
// run the library's message patterns against the same functions, so the
// two can be compared per message.
//
// What it does, each call under one spin lock as a real provider takes its
// queue's:
//   - ibv_post_send carries each work request out before it returns: a
//     SEND (with or without immediate data) copies its payload into the
//     peer's next posted receive and completes it; an RDMA WRITE copies
//     into the peer's memory, and one with immediate data also consumes a
//     receive, whose completion carries the immediate in network order and
//     the length, as devices report them; an RDMA READ copies from the
//     peer's memory; a fetch-and-add adds. A signaled request, or one that
//     failed, completes on the sender's CQ with its opcode, length, wr_id
//     and QP number.
//   - Memory is plain memory of the process registered with a key (both
//     lkey and rkey) and an access: every local buffer (unless inline) and
//     every remote range is checked against its key, the remote access
//     against the region's, as a device checks them.
//   - The queues are bounded as a device's are: a post into a full send
//     queue (entries are freed as the completions of signaled sends are
//     polled) or receive queue fails with ENOMEM, and a CQ that overflows
//     loses the completion.
//   - What a real device would refuse is an error completion that breaks
//     the QP and the first such failure is kept (Wire.Err): an RDMA WRITE
//     with immediate data or a SEND with no receive posted at the peer
//     (receiver not ready: the library's credits exist so that this never
//     happens), an access outside a region. The benchmarks check Err, so
//     a bug of the library's shows instead of a figure.
//   - ibv_req_notify_cq arms the CQ, and its next completion writes an
//     eventfd (Wire.Events), which stands in for a completion channel:
//     the library's poller goroutine parks on it through the netpoller as
//     on a device's channel. Nothing else waits on it; a waiter that does
//     not run the poller polls.
//
// Built without cgo (or off Linux) the package has the same API and New
// fails with ErrUnavailable.
package zerocost
