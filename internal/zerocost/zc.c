// The zero-cost provider's verbs. Each call takes the wire's spin lock, as
// a real provider takes its queue's, and does its work at once: a send is
// carried out, into the peer's memory and completion queue, before
// ibv_post_send returns.
#include "zc.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define ZC_MRS 64
// As much inline data as the library asks a QP for.
#define ZC_MAX_INLINE 256

struct zc_mr {
	uintptr_t addr;
	size_t len;
	uint32_t key;
	int access;
};

struct zc_cqe {
	struct ibv_wc wc;
	int retire; // send queue entries the completion frees: a signaled send and the unsignaled ones before it
	int end;    // whose send queue
};

struct zc_cq {
	struct ibv_cq cq; // first: the verbs' pointer is the provider's
	struct zc_wire *w;
	int end;
	struct zc_cqe *q;
	int cap, head, n;
	// efd is the CQ's completion events (an eventfd, as a completion
	// channel's fd is the kernel's): armed by ibv_req_notify_cq, the next
	// completion writes it once.
	int efd, armed;
};

struct zc_recv {
	uint64_t wr_id;
	uintptr_t addr;
	uint32_t len, lkey;
};

struct zc_qp {
	struct ibv_qp qp; // first, as in zc_cq
	struct zc_wire *w;
	int end;
	struct zc_cq *cq;
	int sq_cap, sq_used, unsignaled;
	struct zc_recv *rq;
	int rq_cap, rq_head, rq_n;
	struct zc_mr mrs[ZC_MRS];
	int nmr;
	int broken; // a work request failed: the QP is in the error state
	struct zc_stats st;
};

struct zc_wire {
	struct ibv_context ctx;
	struct ibv_device dev;
	pthread_spinlock_t lock;
	struct zc_qp qp[2];
	struct zc_cq cq[2];
	uint32_t next_key;
	char err[256];
};

static void fail(struct zc_wire *w, const char *fmt, int end, const char *what) {
	if (!w->err[0])
		snprintf(w->err, sizeof w->err, fmt, end, what);
}

static void *lookup(struct zc_qp *q, uintptr_t addr, size_t len, uint32_t key, int access) {
	for (int i = 0; i < q->nmr; i++) {
		struct zc_mr *m = &q->mrs[i];
		if (m->key == key && addr >= m->addr && addr + len <= m->addr + m->len && (m->access & access) == access)
			return (void *)addr;
	}
	return NULL;
}

// push adds a completion to an end's CQ. An overflow loses it, as a real
// CQ's does: the library sized its CQ wrong.
static int push(struct zc_cq *cq, const struct ibv_wc *wc, int end, int retire) {
	if (cq->n == cq->cap) {
		fail(cq->w, "end %d: completion queue overflow%s", cq->end, "");
		return -1;
	}
	struct zc_cqe *e = &cq->q[(cq->head + cq->n) % cq->cap];
	e->wc = *wc;
	e->retire = retire;
	e->end = end;
	cq->n++;
	if (cq->armed && cq->efd >= 0) {
		uint64_t one = 1;
		cq->armed = 0;
		if (write(cq->efd, &one, sizeof one) != sizeof one)
			fail(cq->w, "end %d: completion event lost%s", cq->end, "");
	}
	return 0;
}

static struct zc_recv *take_recv(struct zc_qp *q) {
	if (q->rq_n == 0)
		return NULL;
	struct zc_recv *r = &q->rq[q->rq_head];
	q->rq_head = (q->rq_head + 1) % q->rq_cap;
	q->rq_n--;
	return r;
}

// deliver consumes one of the peer's receives for a SEND (data, the bytes
// to place in the receive's buffer) or an RDMA WRITE with immediate data
// (data NULL: the payload went to the peer's memory already).
static enum ibv_wc_status deliver(struct zc_qp *q, struct zc_qp *peer, const struct ibv_send_wr *wr, const char *data,
                                  uint32_t len, int withImm) {
	struct zc_recv *r = take_recv(peer);
	if (!r) {
		fail(q->w, "end %d: %s with no receive posted at the peer (receiver not ready)", q->end,
		     data ? "SEND" : "RDMA WRITE with immediate");
		return IBV_WC_RNR_RETRY_EXC_ERR;
	}
	struct ibv_wc wc = {.wr_id = r->wr_id, .status = IBV_WC_SUCCESS, .byte_len = len, .qp_num = peer->qp.qp_num};
	wc.opcode = data ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM;
	if (withImm) {
		wc.imm_data = wr->imm_data; // network order, as it was posted
		wc.wc_flags = IBV_WC_WITH_IMM;
	}
	if (data && len > 0) {
		void *dst = len <= r->len ? lookup(peer, r->addr, len, r->lkey, IBV_ACCESS_LOCAL_WRITE) : NULL;
		if (!dst) {
			wc.status = len > r->len ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_PROT_ERR;
			push(peer->cq, &wc, peer->end, 0);
			peer->broken = 1;
			fail(q->w, "end %d: a SEND that the peer's receive cannot take%s", q->end, "");
			return IBV_WC_REM_INV_REQ_ERR;
		}
		memcpy(dst, data, len);
	}
	push(peer->cq, &wc, peer->end, 0);
	return IBV_WC_SUCCESS;
}

// gather copies a work request's payload into buf (at least ZC_MAX_INLINE
// bytes or the payload's length), checking its local keys unless inline.
static enum ibv_wc_status gather(struct zc_qp *q, const struct ibv_send_wr *wr, char *buf, uint32_t *len) {
	uint32_t n = 0;
	for (int i = 0; i < wr->num_sge; i++) {
		const struct ibv_sge *s = &wr->sg_list[i];
		const void *src = (const void *)(uintptr_t)s->addr;
		if (!(wr->send_flags & IBV_SEND_INLINE) && !lookup(q, s->addr, s->length, s->lkey, 0)) {
			fail(q->w, "end %d: a send's buffer outside the region of its lkey%s", q->end, "");
			return IBV_WC_LOC_PROT_ERR;
		}
		memcpy(buf + n, src, s->length);
		n += s->length;
	}
	*len = n;
	return IBV_WC_SUCCESS;
}

static uint32_t sge_len(const struct ibv_send_wr *wr) {
	uint32_t n = 0;
	for (int i = 0; i < wr->num_sge; i++)
		n += wr->sg_list[i].length;
	return n;
}

// execute carries out one send work request; it returns the sender's
// completion status and sets its opcode and length.
static enum ibv_wc_status execute(struct zc_qp *q, const struct ibv_send_wr *wr, struct ibv_wc *wc) {
	struct zc_qp *peer = &q->w->qp[1 - q->end];
	uint32_t len = sge_len(wr);
	if ((wr->send_flags & IBV_SEND_INLINE) && len > ZC_MAX_INLINE) {
		fail(q->w, "end %d: more inline data than the QP takes%s", q->end, "");
		return IBV_WC_LOC_LEN_ERR;
	}
	switch (wr->opcode) {
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM: {
		wc->opcode = IBV_WC_SEND;
		// A SEND's payload is bounded by the receive it lands in; the
		// library's are header slots of 80 bytes.
		char buf[4096];
		if (len > sizeof buf) {
			fail(q->w, "end %d: a SEND larger than the provider carries%s", q->end, "");
			return IBV_WC_LOC_LEN_ERR;
		}
		enum ibv_wc_status st = gather(q, wr, buf, &len);
		if (st != IBV_WC_SUCCESS)
			return st;
		return deliver(q, peer, wr, buf, len, wr->opcode == IBV_WR_SEND_WITH_IMM);
	}
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM: {
		wc->opcode = IBV_WC_RDMA_WRITE;
		int imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
		if (imm && peer->rq_n == 0)
			return deliver(q, peer, wr, NULL, len, imm); // fails: receiver not ready
		if (len > 0) {
			char *dst = lookup(peer, wr->wr.rdma.remote_addr, len, wr->wr.rdma.rkey, IBV_ACCESS_REMOTE_WRITE);
			if (!dst) {
				fail(q->w, "end %d: an RDMA WRITE outside the peer's region of its rkey%s", q->end, "");
				return IBV_WC_REM_ACCESS_ERR;
			}
			for (int i = 0; i < wr->num_sge; i++) {
				const struct ibv_sge *s = &wr->sg_list[i];
				if (!(wr->send_flags & IBV_SEND_INLINE) && !lookup(q, s->addr, s->length, s->lkey, 0)) {
					fail(q->w, "end %d: a send's buffer outside the region of its lkey%s", q->end, "");
					return IBV_WC_LOC_PROT_ERR;
				}
				memcpy(dst, (const void *)(uintptr_t)s->addr, s->length);
				dst += s->length;
			}
		}
		return imm ? deliver(q, peer, wr, NULL, len, 1) : IBV_WC_SUCCESS;
	}
	case IBV_WR_RDMA_READ: {
		wc->opcode = IBV_WC_RDMA_READ;
		wc->byte_len = len;
		const char *src = lookup(peer, wr->wr.rdma.remote_addr, len, wr->wr.rdma.rkey, IBV_ACCESS_REMOTE_READ);
		if (!src && len > 0) {
			fail(q->w, "end %d: an RDMA READ outside the peer's region of its rkey%s", q->end, "");
			return IBV_WC_REM_ACCESS_ERR;
		}
		for (int i = 0; i < wr->num_sge; i++) {
			const struct ibv_sge *s = &wr->sg_list[i];
			void *dst = lookup(q, s->addr, s->length, s->lkey, IBV_ACCESS_LOCAL_WRITE);
			if (!dst) {
				fail(q->w, "end %d: an RDMA READ's sink outside the region of its lkey%s", q->end, "");
				return IBV_WC_LOC_PROT_ERR;
			}
			memcpy(dst, src, s->length);
			src += s->length;
		}
		return IBV_WC_SUCCESS;
	}
	case IBV_WR_ATOMIC_FETCH_AND_ADD: {
		wc->opcode = IBV_WC_FETCH_ADD;
		wc->byte_len = 8;
		uint64_t *target = lookup(peer, wr->wr.atomic.remote_addr, 8, wr->wr.atomic.rkey, IBV_ACCESS_REMOTE_ATOMIC);
		void *dst = wr->num_sge == 1 && wr->sg_list[0].length == 8
		                ? lookup(q, wr->sg_list[0].addr, 8, wr->sg_list[0].lkey, IBV_ACCESS_LOCAL_WRITE)
		                : NULL;
		if (!target || (wr->wr.atomic.remote_addr & 7)) {
			fail(q->w, "end %d: an atomic outside the peer's region of its rkey%s", q->end, "");
			return IBV_WC_REM_ACCESS_ERR;
		}
		if (!dst) {
			fail(q->w, "end %d: an atomic's sink outside the region of its lkey%s", q->end, "");
			return IBV_WC_LOC_PROT_ERR;
		}
		memcpy(dst, target, 8);
		*target += wr->wr.atomic.compare_add;
		return IBV_WC_SUCCESS;
	}
	default:
		fail(q->w, "end %d: an opcode the provider does not carry%s", q->end, "");
		return IBV_WC_LOC_QP_OP_ERR;
	}
}

static int zc_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	struct zc_qp *q = (struct zc_qp *)ibqp;
	int r = 0;
	pthread_spin_lock(&q->w->lock);
	q->st.post_send++;
	for (; wr; wr = wr->next) {
		if (q->broken) {
			r = EINVAL;
			break;
		}
		if (q->sq_used == q->sq_cap) {
			// The library counts its send queue's entries; a post
			// into a full one is its bug.
			fail(q->w, "end %d: a post into a full send queue%s", q->end, "");
			r = ENOMEM;
			break;
		}
		q->st.send_wrs++;
		q->sq_used++;
		q->unsignaled++;
		struct ibv_wc wc = {.wr_id = wr->wr_id, .qp_num = q->qp.qp_num};
		wc.status = execute(q, wr, &wc);
		if (wc.status != IBV_WC_SUCCESS)
			q->broken = 1;
		if ((wr->send_flags & IBV_SEND_SIGNALED) || wc.status != IBV_WC_SUCCESS) {
			push(q->cq, &wc, q->end, q->unsignaled);
			q->unsignaled = 0;
		}
	}
	if (r)
		*bad = wr;
	pthread_spin_unlock(&q->w->lock);
	return r;
}

static int zc_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
	struct zc_qp *q = (struct zc_qp *)ibqp;
	int r = 0;
	pthread_spin_lock(&q->w->lock);
	q->st.post_recv++;
	for (; wr; wr = wr->next) {
		if (q->rq_n == q->rq_cap || wr->num_sge > 1) {
			fail(q->w, "end %d: %s", q->end, wr->num_sge > 1 ? "a receive of several buffers" : "a post into a full receive queue");
			r = ENOMEM;
			break;
		}
		struct zc_recv *rv = &q->rq[(q->rq_head + q->rq_n) % q->rq_cap];
		*rv = (struct zc_recv){.wr_id = wr->wr_id};
		if (wr->num_sge == 1)
			*rv = (struct zc_recv){.wr_id = wr->wr_id, .addr = wr->sg_list[0].addr, .len = wr->sg_list[0].length,
			                       .lkey = wr->sg_list[0].lkey};
		q->rq_n++;
		q->st.recv_wrs++;
	}
	if (r)
		*bad = wr;
	pthread_spin_unlock(&q->w->lock);
	return r;
}

static int zc_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc) {
	struct zc_cq *cq = (struct zc_cq *)ibcq;
	pthread_spin_lock(&cq->w->lock);
	struct zc_qp *q = &cq->w->qp[cq->end];
	int k = n < cq->n ? n : cq->n;
	for (int i = 0; i < k; i++) {
		struct zc_cqe *e = &cq->q[cq->head];
		wc[i] = e->wc;
		cq->w->qp[e->end].sq_used -= e->retire;
		cq->head = (cq->head + 1) % cq->cap;
	}
	cq->n -= k;
	q->st.polls++;
	q->st.cqes += k;
	if (k == 0)
		q->st.empty_polls++;
	pthread_spin_unlock(&cq->w->lock);
	return k;
}

// Arms the CQ: its next completion writes its event fd (zc_event_fd).
static int zc_req_notify_cq(struct ibv_cq *ibcq, int solicited) {
	struct zc_cq *cq = (struct zc_cq *)ibcq;
	(void)solicited;
	pthread_spin_lock(&cq->w->lock);
	cq->armed = 1;
	cq->w->qp[cq->end].st.arms++;
	pthread_spin_unlock(&cq->w->lock);
	return 0;
}

struct zc_wire *zc_open(int sq, int rq, int cqe, int shared) {
	struct zc_wire *w = calloc(1, sizeof *w);
	if (!w)
		return NULL;
	w->ctx.device = &w->dev;
	w->ctx.ops.post_send = zc_post_send;
	w->ctx.ops.post_recv = zc_post_recv;
	w->ctx.ops.poll_cq = zc_poll_cq;
	w->ctx.ops.req_notify_cq = zc_req_notify_cq;
	w->next_key = 0x100;
	pthread_spin_init(&w->lock, PTHREAD_PROCESS_PRIVATE);
	for (int e = 0; e < 2; e++) {
		struct zc_cq *cq = &w->cq[e];
		cq->cq.context = &w->ctx;
		cq->cq.cqe = cqe;
		cq->w = w;
		cq->end = e;
		cq->cap = cqe;
		cq->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		struct zc_qp *q = &w->qp[e];
		q->qp.context = &w->ctx;
		if (shared)
			cq = &w->cq[0];
		q->qp.send_cq = q->qp.recv_cq = &cq->cq;
		q->qp.qp_num = 0x11 + e;
		q->qp.state = IBV_QPS_RTS;
		q->qp.qp_type = IBV_QPT_RC;
		q->w = w;
		q->end = e;
		q->cq = cq;
		q->sq_cap = sq;
		q->rq_cap = rq;
		if (!cq->q)
			cq->q = calloc(cqe, sizeof cq->q[0]);
		q->rq = calloc(rq, sizeof q->rq[0]);
		if (!cq->q || !q->rq) {
			zc_close(w);
			errno = ENOMEM;
			return NULL;
		}
	}
	return w;
}

void zc_close(struct zc_wire *w) {
	for (int e = 0; e < 2; e++) {
		if (w->cq[e].efd > 0)
			close(w->cq[e].efd);
		free(w->cq[e].q);
		free(w->qp[e].rq);
	}
	pthread_spin_destroy(&w->lock);
	free(w);
}

struct ibv_qp *zc_qp(struct zc_wire *w, int end) { return &w->qp[end].qp; }
struct ibv_cq *zc_cq(struct zc_wire *w, int end) { return &w->qp[end].cq->cq; }
int zc_event_fd(struct zc_wire *w, int end) { return w->qp[end].cq->efd; }

uint32_t zc_reg(struct zc_wire *w, int end, void *addr, size_t len, int access) {
	uint32_t key = 0;
	pthread_spin_lock(&w->lock);
	struct zc_qp *q = &w->qp[end];
	if (q->nmr < ZC_MRS) {
		key = w->next_key++;
		q->mrs[q->nmr++] = (struct zc_mr){.addr = (uintptr_t)addr, .len = len, .key = key, .access = access};
	}
	pthread_spin_unlock(&w->lock);
	return key;
}

void zc_dereg(struct zc_wire *w, int end, uint32_t key) {
	pthread_spin_lock(&w->lock);
	struct zc_qp *q = &w->qp[end];
	for (int i = 0; i < q->nmr; i++) {
		if (q->mrs[i].key == key) {
			q->mrs[i] = q->mrs[--q->nmr];
			break;
		}
	}
	pthread_spin_unlock(&w->lock);
}

void zc_stats(struct zc_wire *w, int end, struct zc_stats *out) {
	pthread_spin_lock(&w->lock);
	*out = w->qp[end].st;
	pthread_spin_unlock(&w->lock);
}

const char *zc_error(struct zc_wire *w) { return w->err[0] ? w->err : NULL; }
