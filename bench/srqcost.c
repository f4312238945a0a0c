// srqcost: what the receive side of many idle connections costs, with a
// receive queue per QP (as the library does today) or one shared receive
// queue (SRQ) for all of them. It answers whether an SRQ would make setup
// at thousands of connections faster, or the kernel memory behind them
// smaller, before the library's credit scheme is reworked for one: every
// credit a connection grants is backed by a receive posted on its own QP,
// and an SRQ smaller than the sum of the credits breaks that promise.
//
//   srqcost [-m rq|srq] [-n N] [-S S] [-d DEVICE] [-p PORT] [-g]
//
// Each QP is the library's: RC, send queue 39, receive queue 69, one SGE
// each way, 256 bytes of inline data (less if the provider refuses, in the
// library's order), moved to INIT with remote write access, with 69
// zero-length receives posted (data arrives by RDMA WRITE with immediate,
// so a receive needs no buffer). -m rq does that N times (default 10000);
// -m srq creates one SRQ of S receives (default 69*N, the same guarantee
// as the receive queues) and N QPs on it with no receive queue of their
// own, and posts the S receives where -m rq posts its own (an SRQ takes
// them at any time; posting them last keeps the phases side by side).
// -g posts receives of one SGE of length 0 instead of none, to see which
// the provider takes.
//
// The CQs are sized as the library sizes its shared CQs: an entry for every
// work request a QP may hold (a flush completes all of them), so a CQ of
// the device's max_cqe serves max_cqe/(39+69) QPs, and more CQs are made
// as needed. With an SRQ a QP reserves only its 39 sends; the receives
// complete on receive CQs of S entries in all (split into CQs of max_cqe
// if S is larger, which then no longer covers a burst landing on the QPs
// of one of them). The CQs are a phase of their own, so the QPs' cost can
// be read with or without them.
//
// Printed: the device's limits; for each phase its wall time and what it
// changed in /proc/meminfo's MemAvailable ("used"), VmallocUsed, Slab and
// PageTables and in the process's resident set (rxe's queues are mapped
// into the process, so they count there as well as in vmalloc); how
// many objects were made when a create fails (with its errno); the
// teardown's time and what it left behind. The last line, "result ...",
// holds every figure as key=value for scripts. On rxe the program also
// prints what its queues should take by rxe's sizing rules (see
// rxe_model), to explain the deltas. Run one configuration per process,
// as root (no memlock limit is needed: nothing is registered but one page
// with -g), on an otherwise idle device.
#define _POSIX_C_SOURCE 200809L // clock_gettime under -std=c99
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>
#if defined(__has_include)
#if __has_include(<rdma/rdma_user_rxe.h>)
#include <rdma/rdma_user_rxe.h>
#define HAVE_RXE_ABI 1
#endif
#endif

// The library's per-connection figures with the default Options
// (layout.go): recvSlots, sendQueue, and the two rings of initRing.
enum {
	SEND_WR = 39,
	RECV_WR = 69,
	RECV_BATCH = 64,    // ibv.MaxRecvBatch: receives per ibv_post_recv
	RING_BYTES = 32768, // two 16 KiB rings registered per connection end
};
// The inline sizes the library tries, in order, when a provider refuses
// one with EINVAL.
static const uint32_t inline_sizes[] = {256, 80, 64, 8, 0};

static int opt_srq = 0;
static long opt_n = 10000;
static long opt_s = -1; // -S; -1: 69*N
static const char *opt_dev = NULL;
static int opt_port = 1;
static int opt_sge = 0; // -g: one SGE of length 0 per receive

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what, int err) {
	fprintf(stderr, "srqcost: %s: %s\n", what, strerror(err));
	exit(1);
}

// mem is the memory the kernel and the process account, in KiB. mapped is
// the process's resident set counted from its page tables (smaps_rollup):
// before Linux 6.2 VmRSS adds a thread's pages only on its page faults, and
// the pages rxe maps into the process at a create are no fault of it.
struct mem {
	long avail, vmalloc, slab, pagetables, rss, mapped;
};

static long field(const char *path, const char *key) {
	FILE *f = fopen(path, "r");
	if (!f)
		die(path, errno);
	char line[256];
	size_t n = strlen(key);
	long v = -1;
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, key, n) && line[n] == ':') {
			v = strtol(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

static struct mem snap(void) {
	struct mem m;
	m.avail = field("/proc/meminfo", "MemAvailable");
	m.vmalloc = field("/proc/meminfo", "VmallocUsed");
	m.slab = field("/proc/meminfo", "Slab");
	m.pagetables = field("/proc/meminfo", "PageTables");
	m.rss = field("/proc/self/status", "VmRSS");
	m.mapped = field("/proc/self/smaps_rollup", "Rss");
	return m;
}

// Freed memory shows as a rise of MemAvailable: report it as "used" so
// that every column reads the same way (positive: the phase took memory).
static struct mem diff(struct mem a, struct mem b) {
	return (struct mem){a.avail - b.avail, b.vmalloc - a.vmalloc, b.slab - a.slab,
	                    b.pagetables - a.pagetables, b.rss - a.rss, b.mapped - a.mapped};
}

static void phase(const char *name, double dt, struct mem d, long count) {
	printf("  %-10s %9.3f s %6ld objects  used %+8ld KiB  vmalloc %+8ld  slab %+7ld  pagetables %+6ld  VmRSS %+8ld  mapped %+8ld\n",
	       name, dt, count, d.avail, d.vmalloc, d.slab, d.pagetables, d.rss, d.mapped);
}

#ifdef HAVE_RXE_ABI
static unsigned long pow2(unsigned long x) {
	unsigned long p = 1;
	while (p < x)
		p <<= 1;
	return p;
}

// rxe_queue_bytes is what rxe_queue_init takes for a queue of n elements of
// elem bytes: each element padded to a power of two of at least a cache
// line, n+1 slots rounded up to a power of two, behind a header of three
// cache-line-padded indices, from vmalloc_user (whole pages).
static unsigned long rxe_queue_bytes(unsigned long n, unsigned long elem) {
	unsigned long size = sizeof(struct rxe_queue_buf) + pow2(n + 1) * pow2(elem < 64 ? 64 : elem);
	return (size + 4095) & ~4095UL;
}

// rxe_model prints what rxe's queues should take for these QPs, to set the
// measured vmalloc and RSS deltas against: a receive WQE is struct
// rxe_recv_wqe and its SGEs (rcv_wqe_size), a send WQE struct rxe_send_wqe
// and the larger of its SGEs and its inline data. Each queue is also
// mapped into the process, so it counts in VmRSS as well.
static void rxe_model(long n, uint32_t inl, uint32_t srq_wr) {
	unsigned long rq = rxe_queue_bytes(RECV_WR, sizeof(struct rxe_recv_wqe) + sizeof(struct rxe_sge));
	unsigned long sge = sizeof(struct rxe_sge);
	unsigned long sq = rxe_queue_bytes(SEND_WR, sizeof(struct rxe_send_wqe) + (inl > sge ? inl : sge));
	printf("rxe model: send queue %lu KiB per QP (WQE %zu+%u B), receive queue %lu KiB per QP (WQE %zu+%zu B)\n",
	       sq >> 10, sizeof(struct rxe_send_wqe), inl > sge ? inl : (unsigned)sge, rq >> 10,
	       sizeof(struct rxe_recv_wqe), sizeof(struct rxe_sge));
	if (opt_srq)
		printf("rxe model: %ld QPs: send queues %lu KiB + SRQ of %u %lu KiB\n", n, n * sq >> 10, srq_wr,
		       rxe_queue_bytes(srq_wr, sizeof(struct rxe_recv_wqe) + sizeof(struct rxe_sge)) >> 10);
	else
		printf("rxe model: %ld QPs: send queues %lu KiB + receive queues %lu KiB\n", n, n * sq >> 10, n * rq >> 10);
}
#endif

// post_recvs posts n receives in chains of RECV_BATCH, to qp or srq, as the
// library posts them. Returns how many were posted; *err is the errno of
// the chain that failed.
static long post_recvs(struct ibv_qp *qp, struct ibv_srq *srq, long n, struct ibv_mr *mr, int *err) {
	struct ibv_recv_wr wr[RECV_BATCH], *bad;
	struct ibv_sge sge = {.addr = mr ? (uintptr_t)mr->addr : 0, .length = 0, .lkey = mr ? mr->lkey : 0};
	long done = 0;
	while (done < n) {
		int k = n - done < RECV_BATCH ? n - done : RECV_BATCH;
		for (int i = 0; i < k; i++)
			wr[i] = (struct ibv_recv_wr){.wr_id = done + i, .sg_list = &sge, .num_sge = opt_sge,
			                             .next = i + 1 < k ? &wr[i + 1] : NULL};
		int r = qp ? ibv_post_recv(qp, wr, &bad) : ibv_post_srq_recv(srq, wr, &bad);
		if (r) {
			*err = r;
			return done + (bad - wr);
		}
		done += k;
	}
	return done;
}

static void usage(void) {
	fprintf(stderr, "usage: srqcost [-m rq|srq] [-n N] [-S S] [-d DEVICE] [-p PORT] [-g]\n");
	exit(2);
}

int main(int argc, char **argv) {
	int c;
	while ((c = getopt(argc, argv, "m:n:S:d:p:g")) != -1) {
		switch (c) {
		case 'm':
			if (!strcmp(optarg, "srq"))
				opt_srq = 1;
			else if (strcmp(optarg, "rq"))
				usage();
			break;
		case 'n': opt_n = atol(optarg); break;
		case 'S': opt_s = atol(optarg); break;
		case 'd': opt_dev = optarg; break;
		case 'p': opt_port = atoi(optarg); break;
		case 'g': opt_sge = 1; break;
		default: usage();
		}
	}
	if (opt_s < 0)
		opt_s = (long)RECV_WR * opt_n;
	if (opt_n <= 0 || (opt_srq && opt_s <= 0))
		usage();
	// Stdout may be a pipe: keep the phases in order with stderr's errors.
	setvbuf(stdout, NULL, _IOLBF, 0);

	int ndev;
	struct ibv_device **list = ibv_get_device_list(&ndev);
	if (!list || !ndev)
		die("ibv_get_device_list", list ? ENODEV : errno);
	struct ibv_device *dev = NULL;
	for (int i = 0; i < ndev && !dev; i++)
		if (!opt_dev || !strcmp(ibv_get_device_name(list[i]), opt_dev))
			dev = list[i];
	if (!dev)
		die(opt_dev, ENODEV);
	struct ibv_context *ctx = ibv_open_device(dev);
	if (!ctx)
		die("ibv_open_device", errno);
	struct ibv_device_attr da;
	int r = ibv_query_device(ctx, &da);
	if (r)
		die("ibv_query_device", r);
	printf("device %s: max_qp %d max_qp_wr %d max_srq %d max_srq_wr %d max_srq_sge %d max_cq %d max_cqe %d max_sge %d\n",
	       ibv_get_device_name(dev), da.max_qp, da.max_qp_wr, da.max_srq, da.max_srq_wr, da.max_srq_sge,
	       da.max_cq, da.max_cqe, da.max_sge);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd", errno);
	struct ibv_mr *mr = NULL;
	static char page[4096] __attribute__((aligned(4096)));
	if (opt_sge && !(mr = ibv_reg_mr(pd, page, sizeof page, IBV_ACCESS_LOCAL_WRITE)))
		die("ibv_reg_mr", errno);

	long n = opt_n, s = opt_srq ? opt_s : 0;
	printf("mode %s: %ld QPs, %s%ld receives, receives with %s; the library's rings would register %ld MiB (not allocated)\n",
	       opt_srq ? "srq" : "rq", n, opt_srq ? "one SRQ of " : "69 each, ", opt_srq ? s : RECV_WR * n,
	       opt_sge ? "one SGE of length 0" : "no SGE", (long)RING_BYTES * n >> 20);

	struct ibv_cq **cqs = calloc(n + 1 + (s / (da.max_cqe > 0 ? da.max_cqe : 1)) + 1, sizeof *cqs);
	struct ibv_qp **qps = calloc(n, sizeof *qps);
	if (!cqs || !qps)
		die("calloc", ENOMEM);
	int fail = 0; // the errno of the first failure, for the result line
	const char *failed = "none";

	// The CQs: per_cq QPs share each of the send (and, with a receive
	// queue per QP, receive) CQs; the SRQ's receives get CQs of their own.
	struct mem m0 = snap();
	double t0 = now();
	long reserve = SEND_WR + (opt_srq ? 0 : RECV_WR);
	long per_cq = da.max_cqe / reserve;
	if (per_cq < 1)
		die("max_cqe below one QP's reservation", EINVAL);
	if (per_cq > n)
		per_cq = n;
	long nsend_cq = (n + per_cq - 1) / per_cq;
	long nrecv_cq = opt_srq ? (s + da.max_cqe - 1) / da.max_cqe : 0;
	long ncq = 0;
	for (long i = 0; i < nsend_cq + nrecv_cq; i++) {
		long cqe;
		if (i < nsend_cq)
			cqe = (i + 1 < nsend_cq ? per_cq : n - i * per_cq) * reserve;
		else
			cqe = i + 1 < nsend_cq + nrecv_cq ? da.max_cqe : s - (i - nsend_cq) * da.max_cqe;
		if (!(cqs[i] = ibv_create_cq(ctx, cqe, NULL, NULL, 0))) {
			fail = errno, failed = "ibv_create_cq";
			fprintf(stderr, "srqcost: ibv_create_cq %ld of %ld (%ld entries): %s\n", i + 1,
			        nsend_cq + nrecv_cq, cqe, strerror(fail));
			break;
		}
		ncq++;
	}
	double t_cq = now() - t0;
	struct mem m1 = snap();
	printf("CQs: %ld for sends%s (%ld QPs each, %ld entries reserved per QP), %ld for the SRQ's receives (%ld entries in all); max_cqe %d\n",
	       nsend_cq, opt_srq ? "" : " and receives", per_cq, reserve, nrecv_cq, s, da.max_cqe);
	phase("cq", t_cq, diff(m0, m1), ncq);

	struct ibv_srq *srq = NULL;
	uint32_t srq_wr = 0;
	double t_srq = 0;
	struct mem m2 = m1;
	if (opt_srq && !fail) {
		t0 = now();
		struct ibv_srq_init_attr sa = {.attr = {.max_wr = s, .max_sge = 1}};
		srq = ibv_create_srq(pd, &sa);
		t_srq = now() - t0;
		m2 = snap();
		if (!srq) {
			fail = errno, failed = "ibv_create_srq";
			fprintf(stderr, "srqcost: ibv_create_srq of %ld (max_srq_wr %d): %s\n", s, da.max_srq_wr, strerror(fail));
		} else {
			srq_wr = sa.attr.max_wr;
			printf("SRQ: asked %ld, got max_wr %u\n", s, srq_wr);
		}
		phase("srq", t_srq, diff(m1, m2), srq != NULL);
	}

	// The QPs, each with the first inline size the provider takes.
	long nqp = 0;
	uint32_t inl = 0;
	struct ibv_qp_cap cap = {0};
	size_t inl_i = 0;
	t0 = now();
	for (long i = 0; i < n && !fail; i++) {
		struct ibv_qp_init_attr a = {
			.send_cq = cqs[i / per_cq],
			.recv_cq = opt_srq ? cqs[nsend_cq + i % nrecv_cq] : cqs[i / per_cq],
			.srq = srq,
			.qp_type = IBV_QPT_RC,
			.cap = {.max_send_wr = SEND_WR, .max_recv_wr = opt_srq ? 0 : RECV_WR, .max_send_sge = 1,
			        .max_recv_sge = opt_srq ? 0 : 1},
		};
		struct ibv_qp_cap want = a.cap;
		for (;;) {
			// A refused create may have left the provider's figures in cap.
			a.cap = want;
			a.cap.max_inline_data = inline_sizes[inl_i];
			if ((qps[i] = ibv_create_qp(pd, &a)) || errno != EINVAL || !inline_sizes[inl_i])
				break;
			inl_i++;
		}
		if (!qps[i]) {
			fail = errno, failed = "ibv_create_qp";
			fprintf(stderr, "srqcost: ibv_create_qp %ld of %ld: %s\n", i + 1, n, strerror(fail));
			break;
		}
		if (!nqp) {
			cap = a.cap;
			inl = a.cap.max_inline_data;
		}
		nqp++;
	}
	double t_create = now() - t0;
	struct mem m3 = snap();
	printf("QPs: created %ld of %ld; the provider gave max_send_wr %u max_recv_wr %u max_inline_data %u\n", nqp, n,
	       cap.max_send_wr, cap.max_recv_wr, cap.max_inline_data);
	phase("create", t_create, diff(m2, m3), nqp);

	long ninit = 0;
	t0 = now();
	for (long i = 0; i < nqp; i++) {
		struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = opt_port,
		                         .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
		if ((r = ibv_modify_qp(qps[i], &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))) {
			if (!fail)
				fail = r, failed = "ibv_modify_qp";
			fprintf(stderr, "srqcost: ibv_modify_qp (INIT) %ld of %ld: %s\n", i + 1, nqp, strerror(r));
			break;
		}
		ninit++;
	}
	double t_modify = now() - t0;
	struct mem m4 = snap();
	phase("modify", t_modify, diff(m3, m4), ninit);

	// rxe takes receives only once the QP has left RESET (C10-97.2.1),
	// so a QP's receives come after its INIT, as in the library.
	long posted = 0;
	int perr = 0;
	t0 = now();
	if (srq)
		posted = post_recvs(NULL, srq, srq_wr < (uint32_t)s ? srq_wr : s, mr, &perr);
	else
		for (long i = 0; i < ninit && !perr; i++)
			posted += post_recvs(qps[i], NULL, RECV_WR, mr, &perr);
	double t_post = now() - t0;
	struct mem m5 = snap();
	if (perr) {
		if (!fail)
			fail = perr, failed = srq ? "ibv_post_srq_recv" : "ibv_post_recv";
		fprintf(stderr, "srqcost: %s after %ld receives: %s\n", srq ? "ibv_post_srq_recv" : "ibv_post_recv", posted,
		        strerror(perr));
	}
	phase("post", t_post, diff(m4, m5), posted);
	struct mem setup = diff(m1, m5);
	phase("setup", t_srq + t_create + t_modify + t_post, setup, nqp);
	phase("setup+cq", t_cq + t_srq + t_create + t_modify + t_post, diff(m0, m5), nqp + ncq);
	if (nqp) {
		struct mem all = diff(m0, m5);
		printf("per QP, CQs included: used %.1f KiB, vmalloc %.1f KiB, slab %.2f KiB, mapped %.1f KiB; %.1f us to create, %.1f us to INIT\n",
		       (double)all.avail / nqp, (double)all.vmalloc / nqp, (double)all.slab / nqp, (double)all.mapped / nqp,
		       t_create / nqp * 1e6, ninit ? t_modify / ninit * 1e6 : 0);
	}
#ifdef HAVE_RXE_ABI
	if (!strncmp(ibv_get_device_name(dev), "rxe", 3) && nqp)
		rxe_model(nqp, inl, srq_wr);
#endif

	t0 = now();
	for (long i = 0; i < nqp; i++)
		if ((r = ibv_destroy_qp(qps[i])))
			fprintf(stderr, "srqcost: ibv_destroy_qp %ld: %s\n", i + 1, strerror(r));
	double t_dqp = now() - t0;
	t0 = now();
	if (srq && (r = ibv_destroy_srq(srq)))
		fprintf(stderr, "srqcost: ibv_destroy_srq: %s\n", strerror(r));
	for (long i = 0; i < ncq; i++)
		if ((r = ibv_destroy_cq(cqs[i])))
			fprintf(stderr, "srqcost: ibv_destroy_cq %ld: %s\n", i + 1, strerror(r));
	double t_drest = now() - t0;
	if (mr)
		ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	struct mem m6 = snap();
	phase("destroy", t_dqp + t_drest, diff(m5, m6), nqp + ncq + (srq != NULL));
	// What the kernel kept after everything was freed: slab caches, and
	// what the teardown has not yet given back.
	phase("left", 0, diff(m0, m6), 0);

	printf("result mode=%s n=%ld s=%ld srq_wr=%u sge=%d qps=%ld init=%ld posted=%ld cqs=%ld inline=%u fail=%s errno=%d"
	       " cq_s=%.3f srq_s=%.3f create_s=%.3f modify_s=%.3f post_s=%.3f destroy_qp_s=%.3f destroy_rest_s=%.3f"
	       " cq_used_kb=%ld cq_vmalloc_kb=%ld cq_slab_kb=%ld cq_mapped_kb=%ld"
	       " used_kb=%ld vmalloc_kb=%ld slab_kb=%ld pagetables_kb=%ld rss_kb=%ld mapped_kb=%ld"
	       " left_used_kb=%ld left_vmalloc_kb=%ld left_slab_kb=%ld"
	       " max_qp=%d max_qp_wr=%d max_srq=%d max_srq_wr=%d max_cqe=%d\n",
	       opt_srq ? "srq" : "rq", n, s, srq_wr, opt_sge, nqp, ninit, posted, ncq, inl, failed, fail, t_cq, t_srq,
	       t_create, t_modify, t_post, t_dqp, t_drest, diff(m0, m1).avail, diff(m0, m1).vmalloc, diff(m0, m1).slab,
	       diff(m0, m1).mapped, setup.avail, setup.vmalloc, setup.slab, setup.pagetables, setup.rss, setup.mapped, diff(m0, m6).avail,
	       diff(m0, m6).vmalloc, diff(m0, m6).slab, da.max_qp, da.max_qp_wr, da.max_srq, da.max_srq_wr, da.max_cqe);
	return fail ? 1 : 0;
}
