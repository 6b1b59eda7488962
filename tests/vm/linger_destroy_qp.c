/* LD_PRELOAD shim for the stock ibv_rc_pingpong in the lossy interop runs.
 *
 * ibv_rc_pingpong has no closing handshake: each side exits as soon as its own
 * counts are complete. Under netem loss the peer that finishes first may have
 * had its last ACK dropped; the other side then retransmits (retry_cnt 7 never
 * runs out in rxe) into a QP that no longer exists and never completes. This
 * shim keeps the kernel QP alive for LINGER_MS (default 1000) before
 * destroying it, as a long-running service would be: rxe's responder, which
 * runs in the kernel, answers the retransmission with a duplicate ACK while
 * the process sleeps. Nothing else changes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct ibv_qp;

int ibv_destroy_qp(struct ibv_qp *qp)
{
	static int (*real)(struct ibv_qp *);
	const char *ms = getenv("LINGER_MS");
	long linger = ms ? atol(ms) : 1000;
	struct timespec t = { linger / 1000, (linger % 1000) * 1000000L };

	if (!real)
		real = (int (*)(struct ibv_qp *))dlsym(RTLD_NEXT, "ibv_destroy_qp");
	if (!real)
		return -1;
	fprintf(stderr, "linger_destroy_qp: keeping the QP %ld ms\n", linger);
	nanosleep(&t, NULL);
	return real(qp);
}
