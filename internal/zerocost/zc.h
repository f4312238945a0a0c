// The zero-cost provider: two queue pairs joined in one process, behind
// libibverbs' own data-path calls (see doc.go).
#ifndef GOVERBS_ZC_H
#define GOVERBS_ZC_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

struct zc_wire;

// zc_stats counts one end's data-path calls: what a message costs in calls
// into the provider, whoever makes them.
struct zc_stats {
	uint64_t post_send, send_wrs; // ibv_post_send calls, and the work requests they carried
	uint64_t post_recv, recv_wrs; // ibv_post_recv calls, and the receives they carried
	uint64_t polls, empty_polls;  // ibv_poll_cq calls, and those that found nothing
	uint64_t cqes;                // completions polled
	uint64_t arms;                // ibv_req_notify_cq calls
};

// zc_open makes two connected QPs (ends 0 and 1), each with a send queue of
// sq work requests, a receive queue of rq, and a CQ of cqe entries for both
// queues: one each, or, if shared, end 0's for both ends, as a device's CQ
// serves the connections of a process. NULL with errno on failure.
struct zc_wire *zc_open(int sq, int rq, int cqe, int shared);
void zc_close(struct zc_wire *w);
struct ibv_qp *zc_qp(struct zc_wire *w, int end);
struct ibv_cq *zc_cq(struct zc_wire *w, int end);
// zc_event_fd is the eventfd an end's CQ writes once armed and completed
// (a completion channel's fd, in effect), -1 if none could be made.
int zc_event_fd(struct zc_wire *w, int end);
// zc_reg registers len bytes at addr for an end with the ibv_access_flags
// access; the key it returns is both the lkey and the rkey. 0 when the
// table is full.
uint32_t zc_reg(struct zc_wire *w, int end, void *addr, size_t len, int access);
void zc_dereg(struct zc_wire *w, int end, uint32_t key);
void zc_stats(struct zc_wire *w, int end, struct zc_stats *out);
// zc_error is the first thing that went wrong on the wire (a work request
// no real device would have carried out), or NULL.
const char *zc_error(struct zc_wire *w);

// The C side of the benchmarks (zc_bench.c): the library's message
// patterns written directly against the verbs, n messages (round trips,
// operations) each. They return 0, or -1 with the reason in zc_error.
int zc_bench_pingpong(struct zc_wire *w, long n, int size);
int zc_bench_rate(struct zc_wire *w, long n, int size);
int zc_bench_stream(struct zc_wire *w, long n, int size);
int zc_bench_read(struct zc_wire *w, long n, int size);

#endif
