// postrate: the library's post pattern for one-way small messages, in C,
// with one variable at a time to change. It answers where a provider's
// per-message cost comes from when a Go sender spends more per message than
// ib_send_bw: the opcode (RDMA WRITE with immediate into a receive ring, as
// the library does, or SEND with immediate into posted receive buffers, as
// perftest does), work requests per ibv_post_send, selective signaling,
// inline data, the size of the ring the WRITEs land in, and how often the
// receiver returns credits in a SEND of its own.
//
//   postrate -s [-p PORT] [options]         the receiver
//   postrate -c ADDR [-p PORT] [options]    the sender; prints msg/s
//
// Both sides must get the same -o, -b, -r, -w and -k. Both busy-poll their
// CQ, as perftest does by default.
//
// -L instead measures the library's 64 B ping-pong on a transport without
// immediate data (iWARP): each message is a SEND of -b bytes (the library's
// 8-byte header and the payload, inline unless -i 0) into a posted receive's
// 128-byte slot, every 32nd signaled, and the receiver answers each with the
// same. The sender prints the one-way latency (half the round trip) beside
// ib_send_lat's.
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

static int opt_write = 1;   // -o w|s
static int opt_bytes = 64;  // -b
static long opt_n = 200000; // -n
static int opt_chain = 1;   // -l: work requests per ibv_post_send (at most)
static int opt_sig = 8;     // -g: signal every g-th send
static int opt_inline = 1;  // -i
static int opt_ring = 16384; // -r: the receiver's ring (WRITE) and the sender's buffer
static int opt_window = 64; // -w: receives posted at the receiver = the sender's credits
static int opt_credit = 16; // -k: the receiver returns k credits per credit SEND
static int opt_lat = 0;     // -L: ping-pong latency of plain SENDs

struct peer {
	uint64_t addr;
	uint32_t rkey;
} __attribute__((packed));

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what) {
	fprintf(stderr, "postrate: %s: %s\n", what, strerror(errno));
	exit(1);
}

static struct rdma_cm_id *endpoint(const char *host, const char *port, int passive) {
	struct rdma_addrinfo hints = {0}, *res;
	hints.ai_port_space = RDMA_PS_TCP;
	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(host, port, &hints, &res))
		die("rdma_getaddrinfo");
	struct ibv_qp_init_attr attr = {0};
	attr.cap.max_send_wr = 256;
	attr.cap.max_recv_wr = opt_window + 16;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.cap.max_inline_data = opt_lat ? (opt_inline ? opt_bytes : 0) : 64;
	attr.sq_sig_all = 0;
	struct rdma_cm_id *id;
	if (rdma_create_ep(&id, res, NULL, &attr))
		die("rdma_create_ep");
	rdma_freeaddrinfo(res);
	if (passive) {
		if (rdma_listen(id, 1))
			die("rdma_listen");
		struct rdma_cm_id *conn;
		if (rdma_get_request(id, &conn))
			die("rdma_get_request");
		return conn;
	}
	return id;
}

// post_recv posts receive i: zero-length when the payload goes elsewhere
// (an RDMA WRITE's, into the ring), else into its 128-byte slot of buf.
static void post_recv(struct rdma_cm_id *id, char *buf, uint32_t lkey, int i, int zero_length) {
	struct ibv_sge sge = {.addr = (uintptr_t)(buf + (size_t)i * 128), .length = 128, .lkey = lkey};
	struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = zero_length ? 0 : 1}, *bad;
	if (ibv_post_recv(id->qp, &wr, &bad))
		die("ibv_post_recv");
}

static int receiver(const char *port) {
	struct rdma_cm_id *id = endpoint(NULL, port, 1);
	char *ring = aligned_alloc(4096, opt_ring);
	char *slots = aligned_alloc(4096, (size_t)(opt_window + 16) * 128);
	char *ctl = aligned_alloc(4096, 4096);
	struct ibv_mr *rmr = ibv_reg_mr(id->pd, ring, opt_ring, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(id->pd, slots, (size_t)(opt_window + 16) * 128, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *cmr = ibv_reg_mr(id->pd, ctl, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!rmr || !smr || !cmr)
		die("ibv_reg_mr");
	for (int i = 0; i < opt_window; i++)
		post_recv(id, slots, smr->lkey, i, opt_write);
	struct peer p = {.addr = (uintptr_t)ring, .rkey = rmr->rkey};
	struct rdma_conn_param param = {.private_data = &p, .private_data_len = sizeof p, .responder_resources = 1, .initiator_depth = 1};
	if (rdma_accept(id, &param))
		die("rdma_accept");
	struct ibv_wc wc[32];
	long got = 0, owed = 0, credits_sent = 0, unsignaled = 0;
	double t0 = 0;
	while (got < opt_n) {
		int n = ibv_poll_cq(id->recv_cq, 32, wc);
		if (n < 0)
			die("ibv_poll_cq");
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "postrate: receive failed: %s\n", ibv_wc_status_str(wc[i].status));
				return 1;
			}
			if (!got)
				t0 = now();
			got++;
			post_recv(id, slots, smr->lkey, wc[i].wr_id, opt_write);
			owed++;
		}
		if (owed >= opt_credit) {
			struct ibv_send_wr wr = {.opcode = IBV_WR_SEND_WITH_IMM, .imm_data = htonl(owed), .send_flags = IBV_SEND_INLINE}, *bad;
			if (++unsignaled >= 16) {
				wr.send_flags |= IBV_SEND_SIGNALED;
				unsignaled = 0;
			}
			if (ibv_post_send(id->qp, &wr, &bad))
				die("ibv_post_send (credit)");
			credits_sent++;
			owed = 0;
		}
		ibv_poll_cq(id->send_cq, 32, wc); // retire signaled credit SENDs
	}
	double dt = now() - t0;
	printf("receiver: %ld messages in %.3f s: %.0f msg/s, %ld credit SENDs\n", got, dt, got / dt, credits_sent);
	rdma_disconnect(id);
	return 0;
}

static int sender(const char *host, const char *port) {
	struct rdma_cm_id *id = endpoint(host, port, 0);
	char *buf = aligned_alloc(4096, opt_ring);
	char *slots = aligned_alloc(4096, (size_t)(opt_window + 16) * 128);
	memset(buf, 'x', opt_ring);
	struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, opt_ring, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(id->pd, slots, (size_t)(opt_window + 16) * 128, IBV_ACCESS_LOCAL_WRITE);
	if (!mr || !smr)
		die("ibv_reg_mr");
	for (int i = 0; i < 16; i++) // for the credit SENDs
		post_recv(id, slots, smr->lkey, i, 0);
	struct rdma_conn_param param = {.responder_resources = 1, .initiator_depth = 1};
	if (rdma_connect(id, &param))
		die("rdma_connect");
	struct peer p;
	memcpy(&p, id->event->param.conn.private_data, sizeof p);
	struct ibv_send_wr wrs[64];
	struct ibv_sge sges[64];
	struct ibv_wc wc[32];
	long sent = 0, posts = 0, outstanding = 0, insq = 0, sigdue = 0;
	size_t off = 0;
	double t0 = now();
	while (sent < opt_n) {
		int k = 0;
		while (k < opt_chain && sent + k < opt_n && outstanding + k < opt_window && insq + k < 200) {
			struct ibv_send_wr *wr = &wrs[k];
			memset(wr, 0, sizeof *wr);
			sges[k] = (struct ibv_sge){.addr = (uintptr_t)(buf + off), .length = opt_bytes, .lkey = mr->lkey};
			wr->sg_list = &sges[k];
			wr->num_sge = 1;
			wr->imm_data = htonl(1);
			if (opt_write) {
				wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
				wr->wr.rdma.remote_addr = p.addr + off;
				wr->wr.rdma.rkey = p.rkey;
			} else {
				wr->opcode = IBV_WR_SEND_WITH_IMM;
			}
			if (opt_inline)
				wr->send_flags |= IBV_SEND_INLINE;
			if (++sigdue >= opt_sig || sent + k + 1 == opt_n) {
				wr->send_flags |= IBV_SEND_SIGNALED;
				wr->wr_id = sigdue;
				sigdue = 0;
			}
			wr->next = k + 1 < opt_chain ? &wrs[k + 1] : NULL;
			off = (off + ((opt_bytes + 63) & ~63)) % opt_ring;
			k++;
		}
		if (k > 0) {
			wrs[k - 1].next = NULL;
			struct ibv_send_wr *bad;
			if (ibv_post_send(id->qp, wrs, &bad))
				die("ibv_post_send");
			posts++;
			sent += k;
			outstanding += k;
			insq += k;
		}
		int n = ibv_poll_cq(id->send_cq, 32, wc);
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "postrate: send failed: %s\n", ibv_wc_status_str(wc[i].status));
				return 1;
			}
			insq -= wc[i].wr_id;
		}
		n = ibv_poll_cq(id->recv_cq, 32, wc);
		for (int i = 0; i < n; i++) {
			outstanding -= ntohl(wc[i].imm_data);
			post_recv(id, slots, smr->lkey, wc[i].wr_id, 0);
		}
	}
	while (insq > 0) {
		int n = ibv_poll_cq(id->send_cq, 32, wc);
		for (int i = 0; i < n; i++)
			insq -= wc[i].wr_id;
	}
	double dt = now() - t0;
	printf("sender: %ld messages, %ld posts in %.3f s: %.0f msg/s (opcode %s, %d B, chain %d, signal every %d, inline %d, ring %d, window %d, credit every %d)\n",
	       sent, posts, dt, sent / dt, opt_write ? "write_imm" : "send_imm", opt_bytes, opt_chain, opt_sig, opt_inline, opt_ring, opt_window, opt_credit);
	return 0;
}

// send_plain posts one SEND of opt_bytes from buf, every 32nd signaled
// (and its completion reaped), as the library's small messages go on iWARP.
static void send_plain(struct rdma_cm_id *id, char *buf, uint32_t lkey, long *sigdue) {
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = opt_bytes, .lkey = lkey};
	struct ibv_send_wr wr = {.opcode = IBV_WR_SEND, .sg_list = &sge, .num_sge = 1}, *bad;
	if (opt_inline)
		wr.send_flags |= IBV_SEND_INLINE;
	if (++*sigdue >= 32) {
		wr.send_flags |= IBV_SEND_SIGNALED;
		*sigdue = 0;
	}
	if (ibv_post_send(id->qp, &wr, &bad))
		die("ibv_post_send");
	struct ibv_wc wc[8];
	if (ibv_poll_cq(id->send_cq, 8, wc) < 0)
		die("ibv_poll_cq");
}

// wait_recv busy-polls for the next receive and posts its slot again.
static void wait_recv(struct rdma_cm_id *id, char *slots, uint32_t lkey) {
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(id->recv_cq, 1, &wc)) == 0)
		;
	if (n < 0)
		die("ibv_poll_cq");
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "postrate: receive failed: %s\n", ibv_wc_status_str(wc.status));
		exit(1);
	}
	post_recv(id, slots, lkey, wc.wr_id, 0);
}

static int cmp_double(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

// pingpong is -L: the client (host set) measures opt_n round trips after
// 100 unmeasured ones; the server answers each message.
static int pingpong(const char *host, const char *port) {
	struct rdma_cm_id *id = endpoint(host, port, host == NULL);
	char *slots = aligned_alloc(4096, (size_t)opt_window * 128);
	char *buf = aligned_alloc(4096, 4096);
	memset(buf, 'x', 4096);
	struct ibv_mr *rmr = ibv_reg_mr(id->pd, slots, (size_t)opt_window * 128, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *smr = ibv_reg_mr(id->pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!rmr || !smr)
		die("ibv_reg_mr");
	for (int i = 0; i < opt_window; i++)
		post_recv(id, slots, rmr->lkey, i, 0);
	struct rdma_conn_param param = {.responder_resources = 1, .initiator_depth = 1};
	long sigdue = 0, warm = 100;
	if (!host) {
		if (rdma_accept(id, &param))
			die("rdma_accept");
		for (long i = 0; i < opt_n + warm; i++) {
			wait_recv(id, slots, rmr->lkey);
			send_plain(id, buf, smr->lkey, &sigdue);
		}
		rdma_disconnect(id);
		return 0;
	}
	if (rdma_connect(id, &param))
		die("rdma_connect");
	double *lat = malloc(sizeof(double) * opt_n), sum = 0;
	for (long i = 0; i < opt_n + warm; i++) {
		double t = now();
		send_plain(id, buf, smr->lkey, &sigdue);
		wait_recv(id, slots, rmr->lkey);
		if (i >= warm)
			lat[i - warm] = (now() - t) / 2 * 1e6;
	}
	qsort(lat, opt_n, sizeof(double), cmp_double);
	for (long i = 0; i < opt_n; i++)
		sum += lat[i];
	printf("latency: %ld round trips of %d B SENDs (inline %d): one-way us min %.2f p50 %.2f p99 %.2f avg %.2f\n",
	       opt_n, opt_bytes, opt_inline, lat[0], lat[opt_n / 2], lat[opt_n * 99 / 100], sum / opt_n);
	return 0;
}

int main(int argc, char **argv) {
	const char *host = NULL, *port = "20300";
	int server = 0, c;
	while ((c = getopt(argc, argv, "sc:p:o:b:n:l:g:i:r:w:k:L")) != -1) {
		switch (c) {
		case 's': server = 1; break;
		case 'c': host = optarg; break;
		case 'p': port = optarg; break;
		case 'o': opt_write = optarg[0] == 'w'; break;
		case 'b': opt_bytes = atoi(optarg); break;
		case 'n': opt_n = atol(optarg); break;
		case 'l': opt_chain = atoi(optarg); break;
		case 'g': opt_sig = atoi(optarg); break;
		case 'i': opt_inline = atoi(optarg); break;
		case 'r': opt_ring = atoi(optarg); break;
		case 'w': opt_window = atoi(optarg); break;
		case 'k': opt_credit = atoi(optarg); break;
		case 'L': opt_lat = 1; break;
		default: fprintf(stderr, "usage: postrate -s | -c ADDR [-p port -o w|s -b bytes -n msgs -l chain -g sig -i inline -r ring -w window -k credit | -L -b bytes -n round-trips -i inline]\n"); return 2;
		}
	}
	if (opt_lat) {
		if (opt_bytes < 1 || opt_bytes > 128 || opt_n < 1 || opt_window < 1) {
			fprintf(stderr, "postrate: bad options\n");
			return 2;
		}
		return pingpong(server ? NULL : host, port);
	}
	if (opt_chain < 1 || opt_chain > 64 || opt_sig < 1 || opt_bytes > 64 || opt_credit < 1 || opt_credit > opt_window) {
		fprintf(stderr, "postrate: bad options\n");
		return 2;
	}
	return server ? receiver(port) : sender(host, port);
}
