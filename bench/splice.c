/* splice.c -- can rnic-rxe's sender skip the kernel's copy on loopback?
 *
 * A sender process sends RoCE-shaped UDP GSO datagrams to a receiver
 * process over lo: SEGS segments of [28 header bytes][4096 payload bytes]
 * [4 ICRC bytes] (a 1 MiB WRITE's middle packets at MTU 4096), headers and
 * ICRCs from a small arena (one packet's ICRC and the next one's headers
 * adjacent: one piece), payloads from an 8 MiB "registered" region cycled
 * through, under a window of 64 datagrams (credits back through a pipe, so
 * nothing is dropped). With TOUCH the sender first reads each payload, as
 * rnic-rxe's ICRC pass does. Two ways:
 *   copy    -- sendmsg with a 2 * SEGS + 1 entry iovec and a UDP_SEGMENT
 *              cmsg (what rnic-rxe's in-place sends do): the kernel copies
 *              every byte into the skb;
 *   splice  -- vmsplice of the same pieces into a pipe (page
 *              references, no copy), then splice into a connected UDP socket
 *              with UDP_SEGMENT set on it: the skb is built from page
 *              references (MSG_SPLICE_PAGES), and the receiver's copy is the
 *              only one. Header pages are never rewritten while the kernel
 *              may still hold them: the arena is MADV_DONTNEED'ed whole when
 *              it wraps, so later writes fault in fresh pages.
 * Prints the CPU time (user + system) of each process per KiB of payload
 * and the wall-clock payload rate; the receiver checks it got every byte.
 *
 *   gcc -O2 -o splice bench/splice.c
 *   ./splice [copy|splice] [GB=2] [SEGS=15] [TOUCH=1]
 * (splice needs SEGS <= (net.core.max_skb_frags - 1) / 2: 8 by default)
 */
#include "udpbench.h"
#include <sys/mman.h>
#include <stdint.h>
#include <time.h>

#define HDR 28
#define PAY 4096
#define TAIL 4
#define SEGLEN (HDR + PAY + TAIL)
#define DGRAM (SEGS * SEGLEN)
static int SEGS = 15;
#define REGION (8 << 20)
#define WINDOW 64
#define ARENA (1 << 20)
#define PORT 47913

static volatile uint64_t sink;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int sp = argc > 1 && strcmp(argv[1], "splice") == 0;
  double gb = argc > 2 ? atof(argv[2]) : 2;
  if (argc > 3) SEGS = atoi(argv[3]);
  /* read each payload once before sending it, as rnic-rxe's ICRC pass does
   * (so the sender's cache holds it when the kernel or the receiver reads) */
  int touch = argc > 4 ? atoi(argv[4]) : 1;
  long sends = (long)(gb * 1e9 / (SEGS * PAY));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  int rx = gro_receiver(&a), big = 8 << 20;
  if (rx < 0) return 1;
  int credit[2], rep[2];
  if (pipe(credit) < 0 || pipe(rep) < 0) { perror("pipe"); return 1; }
  pid_t kid = fork();
  if (kid == 0) { /* receiver: one credit per 8 datagrams, stop at a 1-byte marker */
    static char buf[1 << 16];
    long got = 0, n_dg = 0;
    for (;;) {
      ssize_t n = recv(rx, buf, sizeof buf, 0);
      if (n == 1) break;
      if (n <= 0) continue;
      got += n;
      if (++n_dg % 8 == 0 && write(credit[1], "c", 1) != 1) _exit(1);
    }
    if (write(rep[1], &got, sizeof got) != sizeof got) _exit(1);
    _exit(0);
  }
  int tx = socket(AF_INET, SOCK_DGRAM, 0), seg = SEGLEN;
  setsockopt(tx, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
  int pfd[2] = {-1, -1};
  if (sp) {
    if (pipe(pfd) < 0 || fcntl(pfd[1], F_SETPIPE_SZ, 1 << 20) < 0) { perror("pipe"); return 1; }
    if (connect(tx, (void *)&a, sizeof a) < 0) { perror("connect"); return 1; }
    if (setsockopt(tx, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) < 0) { perror("UDP_SEGMENT"); return 1; }
  }
  char *region = aligned_alloc(4096, REGION);
  memset(region, 0x5a, REGION);
  char *arena = mmap(NULL, ARENA, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  size_t at = 0;
  long inflight = 0;
  double t0 = cpu(RUSAGE_SELF), w0 = now();
  for (long i = 0; i < sends; i++) {
    while (inflight >= WINDOW) {
      char c[64];
      ssize_t n = read(credit[0], c, sizeof c);
      if (n > 0) inflight -= 8 * n;
    }
    if (at + SEGS * (HDR + TAIL) > ARENA) {
      if (sp) madvise(arena, ARENA, MADV_DONTNEED);
      at = 0;
    }
    struct iovec v[3 * 64];
    size_t pay = (size_t)(i * SEGS) * PAY % REGION;
    /* the arena holds hdr0 | tail0 hdr1 | tail1 hdr2 | ... | tailN-1: a
     * packet's ICRC and the next packet's headers are one piece */
    int nv = 0;
    char *h = arena + at;
    memset(h, 1, HDR + SEGS * (HDR + TAIL));
    for (int s = 0; s < SEGS; s++) {
      size_t hl = s == 0 ? HDR : TAIL + HDR;
      v[nv++] = (struct iovec){h, hl};
      h += hl;
      v[nv++] = (struct iovec){region + (pay + (size_t)s * PAY) % REGION, PAY};
    }
    v[nv++] = (struct iovec){h, TAIL};
    if (touch) {
      uint64_t acc = 0;
      for (int k = 1; k < nv; k += 2) {
        const uint64_t *w = v[k].iov_base;
        for (size_t j = 0; j < PAY / 8; j++) acc += w[j];
      }
      sink += acc;
    }
    at += SEGS * (HDR + TAIL);
    if (sp) {
      struct iovec *p = v;
      int left_iov = nv;
      while (left_iov > 0) {
        ssize_t n = vmsplice(pfd[1], p, left_iov, 0);
        if (n < 0) { perror("vmsplice"); return 1; }
        while (n > 0 && left_iov > 0) { /* advance past what went in */
          if ((size_t)n >= p->iov_len) { n -= p->iov_len; p++; left_iov--; }
          else { p->iov_base = (char *)p->iov_base + n; p->iov_len -= n; n = 0; }
        }
      }
      ssize_t left = DGRAM;
      while (left > 0) {
        ssize_t n = splice(pfd[0], NULL, tx, NULL, left, left < DGRAM ? SPLICE_F_MORE : 0);
        if (n <= 0) { perror("splice"); return 1; }
        left -= n;
      }
    } else {
      char ctl[CMSG_SPACE(sizeof(uint16_t))] = {0};
      struct msghdr m = {.msg_name = &a, .msg_namelen = sizeof a, .msg_iov = v, .msg_iovlen = nv,
                         .msg_control = ctl, .msg_controllen = sizeof ctl};
      struct cmsghdr *c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_UDP; c->cmsg_type = UDP_SEGMENT; c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      *(uint16_t *)CMSG_DATA(c) = SEGLEN;
      if (sendmsg(tx, &m, 0) != DGRAM) { perror("sendmsg"); return 1; }
    }
    inflight++;
  }
  while (inflight > 7) { char c; if (read(credit[0], &c, 1) == 1) inflight -= 8; }
  double t_send = cpu(RUSAGE_SELF) - t0, wall = now() - w0;
  if (sp) { int z = 0; setsockopt(tx, SOL_UDP, UDP_SEGMENT, &z, sizeof z); }
  if (sp) send(tx, "x", 1, 0); else sendto(tx, "x", 1, 0, (void *)&a, sizeof a);
  waitpid(kid, NULL, 0);
  double t_recv = cpu(RUSAGE_CHILDREN);
  long got = 0;
  if (read(rep[0], &got, sizeof got) != sizeof got) got = -1;
  double kib = sends * (double)SEGS * PAY / 1024;
  printf("%-6s: sender %.1f ns/KiB, receiver %.1f ns/KiB, both %.1f ns/KiB CPU; %.2f GB/s of payload; received %.1f %% of the bytes\n",
         sp ? "splice" : "copy", t_send * 1e9 / kib, t_recv * 1e9 / kib, (t_send + t_recv) * 1e9 / kib,
         sends * (double)SEGS * PAY / wall / 1e9, 100.0 * got / (sends * (double)DGRAM));
  return 0;
}
