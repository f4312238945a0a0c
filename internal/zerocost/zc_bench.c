// The C side of the benchmarks: the library's message patterns written
// directly against the verbs, over the same provider, in one thread that
// plays both ends (as the Go benchmarks' one goroutine does, but for the
// streams, which run a writer and a reader goroutine in Go). What it does
// per message, as the library does it with its defaults:
//   - a data message is an RDMA WRITE with immediate data from the
//     sender's send ring into the same offset of the receiver's ring; 64 B
//     go inline; the payload is first copied from the caller's buffer into
//     the send ring, and the receiver copies it out, as Write and Read do;
//   - every 8th data message is signaled (half the send depth of 16), and
//     no more than 16 are in the send queue unretired;
//   - the receiver reposts its zero-length receives in batches of 16 (a
//     quarter of the 64 the sender may have outstanding) and returns their
//     credits in a SEND with immediate data and no payload, or, in the
//     round trip, in its reply's immediate, one receive reposted per
//     message, as the library does when a Read is about to wait;
//   - one CQ serves both ends, polled 16 completions at a time (a spinning
//     Read's batch), each completion handled by the end it belongs to.
// It leaves out what the library does beyond the protocol: locks, the
// header's encoding and checks, the ring's bookkeeping of message ends,
// deadlines and the lifecycle, the waiting policy, and the gathering of
// small Writes into one message (the stream rows count posts per message
// for both, which shows where the library gathered).
#include "zc.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#define ZC_DEPTH 64   // data credits: the receiver's RecvDepth
#define ZC_CTRL 4     // control receives (wire.CtrlDepth)
#define ZC_BATCH 16   // receives reposted and credited at once
#define ZC_SIGNAL 8   // every 8th data message signaled
#define ZC_SQ_DATA 16 // data messages in the send queue at most
#define ZC_POLL 16    // completions per poll
#define ZC_INLINE 256

// The immediate's parts: the message type and the credits it carries.
#define IMM_DATA 1u
#define IMM_CREDIT 2u
#define IMM(type, credits) (((type) << 24) | (credits))

struct end {
	struct ibv_qp *qp;
	uint32_t qpn;
	char *ring, *sring; // receive ring, send ring (same size)
	size_t ringsz;
	uint32_t rkey, skey;
	uint64_t peer_ring;
	uint32_t peer_rkey;
	// sender
	size_t woff;
	int credits;   // data messages the peer may still take
	int sq_data;   // data WRs not yet retired by a completion
	int unsig;     // data WRs since the last signaled one
	int ctrl_sig;  // credit SENDs since the last signaled one
	// receiver
	size_t roff;
	int arrived;   // data messages not yet read
	uint32_t lens[ZC_DEPTH + ZC_CTRL + 1];
	int lhead, ln;
	int owed;      // consumed receives not yet reposted and credited
};

struct bench {
	struct zc_wire *w;
	struct ibv_cq *cq;
	struct end e[2];
	char *mem[4];
};

static int setup(struct bench *b, struct zc_wire *w, size_t ringsz) {
	memset(b, 0, sizeof *b);
	b->w = w;
	b->cq = zc_cq(w, 0);
	for (int i = 0; i < 2; i++) {
		struct end *e = &b->e[i];
		e->qp = zc_qp(w, i);
		e->qpn = e->qp->qp_num;
		e->ringsz = ringsz;
		e->ring = b->mem[2 * i] = aligned_alloc(4096, ringsz);
		e->sring = b->mem[2 * i + 1] = aligned_alloc(4096, ringsz);
		if (!e->ring || !e->sring)
			return -1;
		memset(e->ring, 0, ringsz);
		memset(e->sring, 'x', ringsz);
		e->rkey = zc_reg(w, i, e->ring, ringsz, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
		e->skey = zc_reg(w, i, e->sring, ringsz, IBV_ACCESS_LOCAL_WRITE);
		e->credits = ZC_DEPTH;
		// Every receive at once, as the library posts them at setup.
		struct ibv_recv_wr wr[ZC_DEPTH + ZC_CTRL + 1], *bad;
		int n = ZC_DEPTH + ZC_CTRL + 1;
		for (int k = 0; k < n; k++)
			wr[k] = (struct ibv_recv_wr){.wr_id = k, .next = k + 1 < n ? &wr[k + 1] : NULL};
		if (ibv_post_recv(e->qp, wr, &bad))
			return -1;
	}
	for (int i = 0; i < 2; i++) {
		b->e[i].peer_ring = (uintptr_t)b->e[1 - i].ring;
		b->e[i].peer_rkey = b->e[1 - i].rkey;
	}
	return 0;
}

static void teardown(struct bench *b) {
	for (int i = 0; i < 4; i++)
		free(b->mem[i]);
}

static int repost(struct end *e, int n) {
	struct ibv_recv_wr wr[ZC_BATCH], *bad;
	for (int k = 0; k < n; k++)
		wr[k] = (struct ibv_recv_wr){.wr_id = k, .next = k + 1 < n ? &wr[k + 1] : NULL};
	return ibv_post_recv(e->qp, wr, &bad);
}

// poll takes up to ZC_POLL completions off the shared CQ and hands each to
// its end.
static int poll(struct bench *b) {
	struct ibv_wc wc[ZC_POLL];
	int n = ibv_poll_cq(b->cq, ZC_POLL, wc);
	if (n < 0)
		return -1;
	for (int i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			return -1;
		struct end *e = &b->e[wc[i].qp_num == b->e[0].qpn ? 0 : 1];
		switch (wc[i].opcode) {
		case IBV_WC_RECV_RDMA_WITH_IMM:
			e->lens[(e->lhead + e->ln) % (ZC_DEPTH + ZC_CTRL + 1)] = wc[i].byte_len;
			e->ln++;
			e->arrived++;
			e->credits += ntohl(wc[i].imm_data) & 0xffffff;
			break;
		case IBV_WC_RECV:
			// A credit message: its receive goes back at once.
			e->credits += ntohl(wc[i].imm_data) & 0xffffff;
			if (repost(e, 1))
				return -1;
			break;
		case IBV_WC_RDMA_WRITE:
			e->sq_data -= wc[i].wr_id;
			break;
		default:
			break;
		}
	}
	return n;
}

// send copies n bytes from src into the send ring and posts them to the
// same offset of the peer's ring, carrying credits.
static int send_data(struct bench *b, struct end *e, const char *src, uint32_t n, uint32_t credits) {
	while (e->credits == 0 || e->sq_data == ZC_SQ_DATA)
		if (poll(b) < 0)
			return -1;
	if (e->woff + n > e->ringsz)
		e->woff = 0;
	memcpy(e->sring + e->woff, src, n);
	struct ibv_sge sge = {.addr = (uintptr_t)(e->sring + e->woff), .length = n, .lkey = e->skey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
	                         .imm_data = htonl(IMM(IMM_DATA, credits))}, *bad;
	wr.wr.rdma.remote_addr = e->peer_ring + e->woff;
	wr.wr.rdma.rkey = e->peer_rkey;
	if (n <= ZC_INLINE)
		wr.send_flags |= IBV_SEND_INLINE;
	e->sq_data++;
	if (++e->unsig == ZC_SIGNAL || e->sq_data == ZC_SQ_DATA) {
		wr.send_flags |= IBV_SEND_SIGNALED;
		wr.wr_id = e->unsig;
		e->unsig = 0;
	}
	e->credits--;
	e->woff += n;
	return ibv_post_send(e->qp, &wr, &bad);
}

// recv_data waits for the next message and copies it into dst.
static int recv_data(struct bench *b, struct end *e, char *dst) {
	while (e->arrived == 0)
		if (poll(b) < 0)
			return -1;
	uint32_t n = e->lens[e->lhead];
	e->lhead = (e->lhead + 1) % (ZC_DEPTH + ZC_CTRL + 1);
	e->ln--;
	e->arrived--;
	if (e->roff + n > e->ringsz)
		e->roff = 0;
	memcpy(dst, e->ring + e->roff, n);
	e->roff += n;
	e->owed++;
	return 0;
}

// credit reposts a batch of consumed receives and returns their credits
// in a SEND of its own.
static int credit(struct end *e) {
	if (repost(e, e->owed))
		return -1;
	struct ibv_send_wr wr = {.opcode = IBV_WR_SEND_WITH_IMM, .imm_data = htonl(IMM(IMM_CREDIT, e->owed)),
	                         .send_flags = IBV_SEND_INLINE}, *bad;
	if (++e->ctrl_sig == ZC_CTRL / 2) {
		wr.send_flags |= IBV_SEND_SIGNALED;
		e->ctrl_sig = 0;
	}
	e->owed = 0;
	return ibv_post_send(e->qp, &wr, &bad);
}

int zc_bench_pingpong(struct zc_wire *w, long n, int size) {
	struct bench b;
	char *buf = malloc(size);
	int r = -1;
	if (!buf || setup(&b, w, 16384))
		goto out;
	memset(buf, 'x', size);
	for (long i = 0; i < n; i++) {
		for (int s = 0; s < 2; s++) {
			struct end *from = &b.e[s], *to = &b.e[1 - s];
			// The reply carries the credit of the request it answers.
			uint32_t owed = from->owed;
			if (owed && repost(from, owed))
				goto out;
			from->owed = 0;
			if (send_data(&b, from, buf, size, owed) || recv_data(&b, to, buf))
				goto out;
		}
	}
	r = 0;
out:
	teardown(&b);
	free(buf);
	return r;
}

// rate: one message per write, read by the peer; the reader credits in
// batches.
static int one_way(struct zc_wire *w, long n, int size, size_t ringsz) {
	struct bench b;
	char *src = malloc(size), *dst = malloc(size);
	int r = -1;
	if (!src || !dst || setup(&b, w, ringsz))
		goto out;
	memset(src, 'x', size);
	struct end *a = &b.e[0], *p = &b.e[1];
	for (long i = 0; i < n; i++) {
		if (send_data(&b, a, src, size, 0) || recv_data(&b, p, dst))
			goto out;
		if (p->owed >= ZC_BATCH && credit(p))
			goto out;
	}
	r = 0;
out:
	teardown(&b);
	free(src);
	free(dst);
	return r;
}

int zc_bench_rate(struct zc_wire *w, long n, int size) { return one_way(w, n, size, 16384); }

// The library's stream grows its rings to 16 of the largest messages, at
// most 1 MiB.
int zc_bench_stream(struct zc_wire *w, long n, int size) { return one_way(w, n, size, 1 << 20); }

int zc_bench_read(struct zc_wire *w, long n, int size) {
	char *local = aligned_alloc(4096, 4096), *remote = aligned_alloc(4096, 4096);
	int r = -1;
	if (!local || !remote || size > 4096 - 128)
		goto out;
	memset(remote, 'r', 4096);
	uint32_t lkey = zc_reg(w, 0, local, 4096, IBV_ACCESS_LOCAL_WRITE);
	uint32_t rkey = zc_reg(w, 1, remote, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_qp *qp = zc_qp(w, 0);
	struct ibv_cq *cq = zc_cq(w, 0);
	for (long i = 0; i < n; i++) {
		struct ibv_sge sge = {.addr = (uintptr_t)local, .length = size, .lkey = lkey};
		struct ibv_send_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		                         .send_flags = IBV_SEND_SIGNALED}, *bad;
		wr.wr.rdma.remote_addr = (uintptr_t)remote + 128;
		wr.wr.rdma.rkey = rkey;
		if (ibv_post_send(qp, &wr, &bad))
			goto out;
		struct ibv_wc wc[ZC_POLL];
		int k;
		while ((k = ibv_poll_cq(cq, ZC_POLL, wc)) == 0)
			;
		if (k < 0 || wc[0].status != IBV_WC_SUCCESS)
			goto out;
	}
	r = 0;
out:
	free(local);
	free(remote);
	return r;
}
