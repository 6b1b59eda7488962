/*
 * verbs_cost.c - the per-request work of rnic's drop-in libibverbs, for
 * callgrind (bench/verbs.sh): ITERS signalled 8-byte RDMA writes, each posted
 * with ibv_post_send (or, with "wr", the ibv_wr_* API) and polled to its
 * completion with ibv_poll_cq, on an RC pair of one context over loopback.
 * Run with RNIC_VERBS_PROGRESS=caller so that all the work is on this thread.
 *
 * Build: cc -O2 -o verbs_cost verbs_cost.c -libverbs
 * Run:   LD_LIBRARY_PATH=<drop-in dir> ./verbs_cost [iters] [post|wr|inline] [device]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void up(struct ibv_qp *qp, uint32_t dest, union ibv_gid *gid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		die("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 2000;
	const char *mode = argc > 2 ? argv[2] : "post";
	const char *name = argc > 3 ? argv[3] : "rnic_lo";
	int use_wr = !strcmp(mode, "wr"), inl = !strcmp(mode, "inline");
	struct ibv_device **list = ibv_get_device_list(NULL), *dev = NULL;
	for (int i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			dev = list[i];
	if (!dev)
		die("device");
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd)
		die("open");
	union ibv_gid gid;
	ibv_query_gid(ctx, 1, 0, &gid);
	char *buf = aligned_alloc(4096, 8192);
	memset(buf, 0, 8192);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE);
	struct ibv_cq *cq = ibv_create_cq(ctx, 128, NULL, NULL, 0);
	struct ibv_qp_init_attr_ex qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 64, .max_recv_wr = 1, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE,
	};
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &qa), *b = ibv_create_qp_ex(ctx, &qa);
	if (!mr || !cq || !a || !b)
		die("objects");
	up(a, b->qp_num, &gid);
	up(b, a->qp_num, &gid);
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED | (inl ? IBV_SEND_INLINE : 0) },
			   *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)buf + 4096;
	wr.wr.rdma.rkey = mr->rkey;
	struct ibv_wc wc;
	long polls = 0;
	for (long i = 0; i < iters; i++) {
		*(uint64_t *)buf = (uint64_t)i;
		if (use_wr) {
			ibv_wr_start(ax);
			ax->wr_id = (uint64_t)i;
			ax->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_rdma_write(ax, mr->rkey, (uintptr_t)buf + 4096);
			ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf, 8);
			if (ibv_wr_complete(ax))
				die("wr_complete");
		} else {
			wr.wr_id = (uint64_t)i;
			if (ibv_post_send(a, &wr, &bad))
				die("post_send");
		}
		int n;
		do {
			n = ibv_poll_cq(cq, 1, &wc);
			polls++;
		} while (n == 0);
		if (n < 0 || wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)i)
			die("completion");
	}
	if (*(uint64_t *)(buf + 4096) != (uint64_t)(iters - 1))
		die("last write did not land");
	printf("%ld writes (%s), %ld polls\n", iters, mode, polls);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
