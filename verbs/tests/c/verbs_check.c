/*
 * verbs_check.c - a verbs program written against the system
 * <infiniband/verbs.h>, run on rnic's drop-in libibverbs.so.1 by
 * verbs/tests/semantics.rs. Two RC QPs of one context talk over loopback;
 * every check compares bytes, completion fields or error codes, prints
 * "ok <name>" and exits 1 at the first failure.
 *
 * On an mlx5 device (vendor 0x15b3: an rnic-mlx5 function, emulated in the
 * tests) atomic operands are big-endian in memory, as on a ConnectX without
 * an atomic endianness mode.
 *
 * Build: cc -std=gnu11 -Wall -o verbs_check verbs_check.c -libverbs
 * Run:   LD_LIBRARY_PATH=<drop-in dir> ./verbs_check [device]
 */
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define SZ 8192

/* An mlx5 device: big-endian atomics (above). */
static int mlx5;
/* An atomic operand or result as it lies in memory. */
#define ATOMIC(v) (mlx5 ? htobe64(v) : (uint64_t)(v))

#define CHECK(cond, ...)                                                  \
	do {                                                              \
		if (!(cond)) {                                            \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                     \
			fprintf(stderr, " (errno %d: %s)\n", errno,       \
				strerror(errno));                         \
			exit(1);                                          \
		}                                                         \
	} while (0)
#define OK(name) printf("ok %s\n", name)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static struct ibv_qp *make_qp(struct ibv_cq *cq, int ex, uint32_t inl)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = inl },
		.comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd,
	};
	if (ex) {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND |
				   IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	}
	return ibv_create_qp_ex(ctx, &a);
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, uint32_t psn)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_ATOMIC };
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			     IBV_QP_ACCESS_FLAGS), "INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = psn;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 0;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			     IBV_QP_MIN_RNR_TIMER), "RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
	      "RTS");
	CHECK(qp->state == IBV_QPS_RTS, "qp->state %d", qp->state);
}

/* Poll `cq` until one completion arrives (10 s at most). */
static struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (int i = 0; i < 10000000; i++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "poll_cq %d", n);
		if (n == 1)
			return wc;
		if (i > 1000)
			usleep(1);
	}
	CHECK(0, "no completion");
	return wc;
}

static void post(struct ibv_qp *qp, enum ibv_wr_opcode op, void *buf, uint32_t len,
		 uint32_t lkey, uint64_t raddr, uint32_t rkey, unsigned flags, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED | flags }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	CHECK(!ibv_post_send(qp, &wr, &bad), "post_send op %d", op);
}

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "rnic_lo";
	struct ibv_device **list = ibv_get_device_list(NULL), *dev = NULL;
	CHECK(list, "device list");
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			dev = list[i];
	CHECK(dev, "no device %s", name);
	ctx = ibv_open_device(dev);
	CHECK(ctx, "open");
	ibv_free_device_list(list);
	struct ibv_port_attr port;
	CHECK(!ibv_query_port(ctx, 1, &port), "query_port");
	CHECK(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "port");
	struct ibv_device_attr da;
	CHECK(!ibv_query_device(ctx, &da), "query_device");
	mlx5 = da.vendor_id == 0x15b3;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "gid");
	/* rxe: index 99 is empty; mlx5: its table has room, the index past it. */
	int none = mlx5 ? port.gid_tbl_len : 99;
	CHECK(ibv_query_gid(ctx, 1, none, &gid) == -1 && !ibv_query_gid(ctx, 1, 0, &gid),
	      "gid %d", none);
	struct ibv_gid_entry ge;
	CHECK(!ibv_query_gid_ex(ctx, 1, 0, &ge, 0) && ge.gid_type == IBV_GID_TYPE_ROCE_V2 &&
	      !memcmp(&ge.gid, &gid, 16), "gid_ex");
	OK("device, port and GID queries");

	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "pd");
	char *a = aligned_alloc(4096, SZ), *b = aligned_alloc(4096, SZ);
	memset(a, 0, SZ);
	memset(b, 0, SZ);
	int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		  IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *ma = ibv_reg_mr(pd, a, SZ, all), *mb = ibv_reg_mr(pd, b, SZ, all);
	CHECK(ma && mb, "reg_mr");
	CHECK(ma->addr == a && ma->length == SZ && ma->lkey != mb->lkey, "mr fields");

	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch && ch->fd >= 0, "channel");
	struct ibv_cq *cqa = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	struct ibv_cq *cqb = ibv_create_cq(ctx, 256, (void *)0x5eed, ch, 0);
	CHECK(cqa && cqb && cqb->cqe >= 256, "cq");
	struct ibv_qp *qa = make_qp(cqa, 1, 64), *qb = make_qp(cqb, 0, 0);
	CHECK(qa && qb, "qp");
	CHECK(ibv_qp_to_qp_ex(qa) && !ibv_qp_to_qp_ex(qb), "qp_to_qp_ex");
	connect_qp(qa, qb->qp_num, 0x100);
	connect_qp(qb, qa->qp_num, 0x100);
	OK("RC pair up");

	/* RDMA write: bytes land at the offset named. */
	for (int i = 0; i < 4096; i++)
		a[i] = (char)(i * 7 + 3);
	post(qa, IBV_WR_RDMA_WRITE, a, 4096, ma->lkey, (uintptr_t)b + 100, mb->rkey, 0, 1);
	struct ibv_wc wc = wait_wc(cqa);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE && wc.wr_id == 1 &&
	      wc.qp_num == qa->qp_num, "write wc %s", ibv_wc_status_str(wc.status));
	CHECK(!memcmp(b + 100, a, 4096) && b[99] == 0 && b[4196] == 0, "written bytes");
	OK("RDMA write");

	/* RDMA read back into another place. */
	post(qa, IBV_WR_RDMA_READ, a + 4096, 4096, ma->lkey, (uintptr_t)b + 100, mb->rkey, 0, 2);
	wc = wait_wc(cqa);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == 4096,
	      "read wc");
	CHECK(!memcmp(a + 4096, a, 4096), "read bytes");
	OK("RDMA read");

	/* Atomics: the old value comes back, the word changes. */
	uint64_t *word = (uint64_t *)(b + 8000);
	*word = ATOMIC(40);
	struct ibv_sge sge = { .addr = (uintptr_t)(a + 16), .length = 8, .lkey = ma->lkey };
	struct ibv_send_wr wr = { .wr_id = 3, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.atomic.remote_addr = (uintptr_t)word;
	wr.wr.atomic.rkey = mb->rkey;
	wr.wr.atomic.compare_add = 2;
	CHECK(!ibv_post_send(qa, &wr, &bad), "fetch_add");
	wc = wait_wc(cqa);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_FETCH_ADD, "fetch_add wc");
	CHECK(*(uint64_t *)(a + 16) == ATOMIC(40) && *word == ATOMIC(42), "fetch_add values");
	wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
	wr.wr.atomic.compare_add = 42;
	wr.wr.atomic.swap = 7;
	CHECK(!ibv_post_send(qa, &wr, &bad), "cmp_swap");
	wc = wait_wc(cqa);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP &&
	      *word == ATOMIC(7) && *(uint64_t *)(a + 16) == ATOMIC(42), "cmp_swap values");
	OK("atomics");

	/* Send with immediate into a posted receive, event on the channel. */
	CHECK(!ibv_req_notify_cq(cqb, 0), "notify");
	struct ibv_sge rsge = { .addr = (uintptr_t)(b + 4096), .length = 2048, .lkey = mb->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 77, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	CHECK(!ibv_post_recv(qb, &rwr, &rbad), "post_recv");
	struct ibv_sge ssge = { .addr = (uintptr_t)a, .length = 1500, .lkey = ma->lkey };
	struct ibv_send_wr swr = { .wr_id = 4, .sg_list = &ssge, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
				   .imm_data = htonl(0x12345678) };
	CHECK(!ibv_post_send(qa, &swr, &bad), "send");
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 10000) == 1 && (pfd.revents & POLLIN), "channel fd readable");
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECK(!ibv_get_cq_event(ch, &ev_cq, &ev_ctx) && ev_cq == cqb && ev_ctx == (void *)0x5eed,
	      "cq event");
	ibv_ack_cq_events(cqb, 1);
	wc = wait_wc(cqb);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 77 &&
	      wc.byte_len == 1500 && (wc.wc_flags & IBV_WC_WITH_IMM) &&
	      ntohl(wc.imm_data) == 0x12345678 && wc.qp_num == qb->qp_num, "recv wc");
	CHECK(!memcmp(b + 4096, a, 1500), "received bytes");
	wc = wait_wc(cqa);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 4, "send wc");
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN, "nonblocking");
	OK("send with immediate, completion channel");

	/* Inline from unregistered stack memory, through the ibv_wr_* API. */
	char stack[48];
	for (int i = 0; i < 48; i++)
		stack[i] = (char)(0xa0 + i);
	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(qa);
	CHECK(!ibv_post_recv(qb, &rwr, &rbad), "post_recv 2");
	ibv_wr_start(qx);
	qx->wr_id = 5;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, stack, sizeof stack);
	qx->wr_id = 6;
	ibv_wr_rdma_write(qx, mb->rkey, (uintptr_t)b + 6000);
	ibv_wr_set_sge(qx, ma->lkey, (uintptr_t)a, 256);
	CHECK(!ibv_wr_complete(qx), "wr_complete");
	wc = wait_wc(cqb);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 48 && !memcmp(b + 4096, stack, 48),
	      "inline recv");
	wc = wait_wc(cqa);
	struct ibv_wc wc2 = wait_wc(cqa);
	CHECK(wc.wr_id == 5 && wc2.wr_id == 6 && wc2.status == IBV_WC_SUCCESS, "wr ids");
	CHECK(!memcmp(b + 6000, a, 256), "wr_rdma_write bytes");
	ibv_wr_start(qx);
	qx->wr_id = 7;
	ibv_wr_local_inv(qx, 1);
	CHECK(ibv_wr_complete(qx) == EOPNOTSUPP, "unsupported wr op");
	OK("inline data and the ibv_wr_* API");

	/* Unsupported verbs and bad input: errors, never crashes. */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 1 << 20, .max_sge = 1 } };
	errno = 0;
	CHECK(!ibv_create_srq(pd, &sa) && errno == EINVAL, "srq too deep");
	CHECK(ibv_attach_mcast(qb, &gid, 0) == EOPNOTSUPP, "mcast");
	CHECK(ibv_resize_cq(cqa, 512) == EOPNOTSUPP, "resize");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, (void *)8, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT,
	      "unmapped");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, a, 64, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL,
	      "remote write without local write");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, a, 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) &&
	      errno == EOPNOTSUPP, "odp");
	struct ibv_qp_init_attr uc = { .send_cq = cqa, .recv_cq = cqa, .qp_type = IBV_QPT_UC,
				       .cap = { .max_send_wr = 1, .max_recv_wr = 1,
						.max_send_sge = 1, .max_recv_sge = 1 } };
	errno = 0;
	CHECK(!ibv_create_qp(pd, &uc) && errno == EOPNOTSUPP, "UC");
	struct ibv_cq_init_attr_ex cx = { .cqe = 8,
		.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &cx) && errno == EOPNOTSUPP, "cq timestamps");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "pd busy");
	CHECK(ibv_destroy_cq(cqa) == EBUSY, "cq busy");
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "channel busy");
	wr.opcode = IBV_WR_LOCAL_INV;
	bad = NULL;
	CHECK(ibv_post_send(qa, &wr, &bad) == EINVAL && bad == &wr, "bad opcode");
	struct ibv_qp_attr qattr = { .qp_state = IBV_QPS_RTR };
	CHECK(ibv_modify_qp(qb, &qattr, IBV_QP_STATE) == EINVAL, "RTS to RTR");
	struct ibv_qp_init_attr qinit;
	CHECK(!ibv_query_qp(qb, &qattr, IBV_QP_STATE | IBV_QP_CAP, &qinit) &&
	      qattr.qp_state == IBV_QPS_RTS && qinit.cap.max_send_wr >= 64 &&
	      qattr.dest_qp_num == qa->qp_num, "query_qp");
	int afd = ctx->async_fd;
	fcntl(afd, F_SETFL, fcntl(afd, F_GETFL) | O_NONBLOCK);
	struct ibv_async_event ae;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ae) == -1 && errno == EAGAIN, "no async event");
	OK("errors of unsupported verbs and bad input");

	/* A shared receive queue: its requests are consumed in order by the
	 * QP attached to it; an armed limit raises SRQ_LIMIT_REACHED; moving
	 * the QP to ERR raises LAST_WQE_REACHED and flushes nothing into the
	 * CQ (the SRQ keeps its requests). */
	struct ibv_srq_init_attr si = { .srq_context = (void *)0x51, .attr = { .max_wr = 16,
									   .max_sge = 1, .srq_limit = 3 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &si);
	CHECK(srq && srq->srq_context == (void *)0x51, "create srq");
	struct ibv_cq *cqs = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp_init_attr qi = { .send_cq = cqs, .recv_cq = cqs, .srq = srq,
				       .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 8, .max_send_sge = 1 } };
	struct ibv_qp *qs = ibv_create_qp(pd, &qi), *qt = make_qp(cqa, 0, 0);
	CHECK(qs && qt && qs->srq == srq, "srq qp");
	connect_qp(qs, qt->qp_num, 0x300);
	connect_qp(qt, qs->qp_num, 0x300);
	for (int i = 0; i < 4; i++) {
		struct ibv_sge g = { .addr = (uintptr_t)(b + 2048 + 64 * i), .length = 64,
				     .lkey = mb->lkey };
		struct ibv_recv_wr r = { .wr_id = 100 + i, .sg_list = &g, .num_sge = 1 };
		CHECK(!ibv_post_srq_recv(srq, &r, &rbad), "post_srq_recv");
	}
	for (int i = 0; i < 4; i++) {
		a[3000 + i] = (char)(0x30 + i);
		post(qt, IBV_WR_SEND, a + 3000 + i, 1, ma->lkey, 0, 0, 0, 200 + i);
		wc = wait_wc(cqs);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV &&
		      wc.wr_id == (uint64_t)(100 + i) && wc.qp_num == qs->qp_num &&
		      b[2048 + 64 * i] == (char)(0x30 + i), "srq recv %d", i);
		CHECK(wait_wc(cqa).status == IBV_WC_SUCCESS, "send to srq qp");
	}
	struct ibv_srq_attr sq;
	CHECK(!ibv_query_srq(srq, &sq) && sq.max_wr == 16, "query srq");
	for (int i = 0; i < 2; i++) {
		struct ibv_sge g = { .addr = (uintptr_t)b, .length = 64, .lkey = mb->lkey };
		struct ibv_recv_wr r = { .wr_id = 300 + i, .sg_list = &g, .num_sge = 1 };
		CHECK(!ibv_post_srq_recv(srq, &r, &rbad), "repost");
	}
	pfd.fd = ctx->async_fd;
	CHECK(poll(&pfd, 1, 5000) == 1, "srq limit event pending");
	CHECK(!ibv_get_async_event(ctx, &ae) && ae.event_type == IBV_EVENT_SRQ_LIMIT_REACHED &&
	      ae.element.srq == srq, "srq limit event %s", ibv_event_type_str(ae.event_type));
	ibv_ack_async_event(&ae);
	struct ibv_qp_attr err = { .qp_state = IBV_QPS_ERR };
	CHECK(!ibv_modify_qp(qs, &err, IBV_QP_STATE), "srq qp to ERR");
	CHECK(poll(&pfd, 1, 5000) == 1, "last wqe event pending");
	CHECK(!ibv_get_async_event(ctx, &ae) && ae.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
	      ae.element.qp == qs, "last wqe event %s", ibv_event_type_str(ae.event_type));
	ibv_ack_async_event(&ae);
	usleep(100000);
	CHECK(ibv_poll_cq(cqs, 1, &wc) == 0, "flushed SRQ requests stay in the SRQ");
	CHECK(ibv_destroy_srq(srq) == EBUSY, "srq busy");
	CHECK(!ibv_destroy_qp(qs) && !ibv_destroy_qp(qt) && !ibv_destroy_srq(srq) &&
	      !ibv_destroy_cq(cqs), "srq teardown");
	OK("shared receive queue");

	/* Deregistration revokes: a remote write through the old key fails
	 * and leaves the bytes alone, although qb retained the region. */
	char *c = aligned_alloc(4096, 4096);
	memset(c, 0x55, 4096);
	struct ibv_mr *mc = ibv_reg_mr(pd, c, 4096, all);
	CHECK(mc, "reg c");
	post(qb, IBV_WR_SEND, c, 16, mc->lkey, 0, 0, 0, 8);
	struct ibv_sge csge = { .addr = (uintptr_t)(a + 1024), .length = 64, .lkey = ma->lkey };
	CHECK(!ibv_post_recv(qa, &(struct ibv_recv_wr){ .wr_id = 9, .sg_list = &csge,
			     .num_sge = 1 }, &rbad), "post_recv a");
	wc = wait_wc(cqb);
	CHECK(wc.status == IBV_WC_SUCCESS, "send from c: %s op %d id %lu", ibv_wc_status_str(wc.status), wc.opcode, (unsigned long)wc.wr_id);
	CHECK(wait_wc(cqa).status == IBV_WC_SUCCESS, "recv from c");
	uint32_t old_rkey = mc->rkey;
	CHECK(!ibv_dereg_mr(mc), "dereg c");
	post(qa, IBV_WR_RDMA_WRITE, a, 64, ma->lkey, (uintptr_t)c, old_rkey, 0, 10);
	wc = wait_wc(cqa);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "write after dereg: %s",
	      ibv_wc_status_str(wc.status));
	for (int i = 0; i < 4096; i++)
		CHECK((unsigned char)c[i] == 0x55, "byte %d of a deregistered region changed", i);
	OK("deregistration revokes remote access");

	CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb), "destroy qp");
	CHECK(!ibv_destroy_cq(cqa) && !ibv_destroy_cq(cqb), "destroy cq");
	CHECK(!ibv_destroy_comp_channel(ch), "destroy channel");
	CHECK(!ibv_dereg_mr(ma) && !ibv_dereg_mr(mb), "dereg");
	CHECK(!ibv_dealloc_pd(pd), "dealloc pd");
	CHECK(!ibv_close_device(ctx), "close");
	OK("teardown");
	return 0;
}
