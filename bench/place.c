/* place.c -- would receiving READ-response payloads straight into their
 * destination (issue 30, "receive placement") cost the receiver less than
 * rnic-rxe's receive slot + copy?
 *
 * A sender process sends UDP GSO datagrams shaped like a 1 MiB READ's
 * responses at MTU 4096 (segments of 12 header + 4096 payload + 4 ICRC
 * bytes, 15 per datagram) to this process over 127.0.0.1 (UDP_GRO on the
 * receiving socket). The receiver moves each payload into a destination
 * buffer (cycled, as READs in flight would) in one of three ways:
 *
 *   slot     today's path: recvmmsg into 32 slots of 64 KiB, then each
 *            payload copied (rep movsb, as rnic_dma::copy) slot -> dest;
 *   place    the placement design: one recvmsg per datagram with a scatter
 *            iovec (header and ICRC of each segment into scratch, payload
 *            straight into dest), then each placed payload read back into a
 *            4 KiB bounce buffer (rep movsb) for the ICRC, since CRC code
 *            takes slices and no slice may point into registered memory;
 *   place-nobounce  the same without the bounce read: the bound a CRC
 *            reading registered memory directly (inline asm) could reach.
 *
 * The ICRC itself is left out of all three (the same bytes are CRC'd in
 * each, from a cache-hot buffer: `byte_cost parts` measures it alone).
 * A window as a transport keeps (at most 48 sends in flight, credits
 * returned through a pipe every 8 sends' segments) keeps the socket from
 * dropping. Prints the receiver's CPU time (user + system) per KiB of
 * payload (the credit writes included, the same per byte in each mode) and
 * the receive calls it made.
 *
 *   gcc -O2 -o /tmp/place bench/place.c
 *   /tmp/place [REPS=9] [GB per run=2]
 */
#include "udpbench.h"

#define HDR 12
#define PAY 4096
#define TRL 4
#define SEG (HDR + PAY + TRL)
#define NSEG 15
#define DGRAM (SEG * NSEG)
#define SLOT (64 << 10)
#define BATCH 32
#define PORT 47912
#define WINDOW 48
#define CREDIT_SENDS 8
#define MAXREPS 64
#define NDEST 3

enum { SLOT_MODE, PLACE, PLACE_NOBOUNCE };
static const char *MODES[] = {"slot", "place", "place-nobounce"};

/* rnic_dma::copy's copy: rep movsb. */
static void movsb(void *d, const void *s, size_t n) {
  __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

/* One run: the receiver's CPU ns per KiB of payload in `mode`, or -1. */
static double run(int mode, double gb, size_t dest_len) {
  int slot = mode == SLOT_MODE, bounce = mode == PLACE;
  long sends = (long)(gb * 1e9 / (PAY * NSEG));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  int rx = gro_receiver(&a), big = 8 << 20;
  if (rx < 0) return -1;

  int credit[2];
  if (pipe(credit) < 0) { perror("pipe"); return -1; }
  pid_t kid = fork();
  if (kid == 0) { /* sender */
    long returned = 0;
    int tx = socket(AF_INET, SOCK_DGRAM, 0);
    setsockopt(tx, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
    static char pkt[DGRAM];
    memset(pkt, 0x5a, sizeof pkt);
    for (long i = 0; i < sends; i++) {
      while (i - returned * CREDIT_SENDS >= WINDOW) {
        char b[64];
        ssize_t r = read(credit[0], b, sizeof b);
        if (r <= 0) { perror("credit"); _exit(1); }
        returned += r;
      }
      char ctl[CMSG_SPACE(sizeof(uint16_t))] = {0};
      struct iovec v = {pkt, DGRAM};
      struct msghdr m = {.msg_name = &a, .msg_namelen = sizeof a, .msg_iov = &v, .msg_iovlen = 1,
                         .msg_control = ctl, .msg_controllen = sizeof ctl};
      struct cmsghdr *c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_UDP; c->cmsg_type = UDP_SEGMENT; c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      *(uint16_t *)CMSG_DATA(c) = SEG;
      while (sendmsg(tx, &m, 0) < 0)
        if (errno != ENOBUFS && errno != EAGAIN) { perror("sendmsg"); _exit(1); }
    }
    for (int k = 0; k < 50; k++) { sendto(tx, "x", 1, 0, (void *)&a, sizeof a); usleep(1000); }
    _exit(0);
  }

  char *dest = aligned_alloc(4096, dest_len);
  memset(dest, 0, dest_len);
  char *arena = aligned_alloc(4096, (size_t)SLOT * BATCH);
  memset(arena, 0, (size_t)SLOT * BATCH);
  static char scratch[NSEG * (HDR + TRL)], bounce_buf[PAY];
  size_t off = 0;
  long payload = 0, calls = 0, done = 0, segs_seen = 0;
  double t0 = cpu(RUSAGE_SELF);
  while (!done) {
    if (slot) {
      struct mmsghdr mm[BATCH];
      struct iovec v[BATCH];
      for (int k = 0; k < BATCH; k++) {
        v[k] = (struct iovec){arena + (size_t)k * SLOT, SLOT};
        mm[k] = (struct mmsghdr){.msg_hdr = {.msg_iov = &v[k], .msg_iovlen = 1}};
      }
      int n = recvmmsg(rx, mm, BATCH, MSG_WAITFORONE, NULL);
      calls++;
      if (n < 0) { perror("recvmmsg"); return -1; }
      for (int k = 0; k < n; k++) {
        size_t len = mm[k].msg_len;
        if (len == 1) { done = 1; break; }
        for (size_t s = 0; s + SEG <= len; s += SEG) {
          if (off + PAY > dest_len) off = 0;
          movsb(dest + off, arena + (size_t)k * SLOT + s + HDR, PAY);
          off += PAY;
          payload += PAY;
          if (++segs_seen % (NSEG * CREDIT_SENDS) == 0 && write(credit[1], "c", 1) != 1) return -1;
        }
      }
    } else {
      struct iovec v[NSEG * 3];
      size_t start = off + (size_t)PAY * NSEG > dest_len ? 0 : off;
      for (int s = 0; s < NSEG; s++) {
        v[3 * s] = (struct iovec){scratch + s * (HDR + TRL), HDR};
        v[3 * s + 1] = (struct iovec){dest + start + (size_t)s * PAY, PAY};
        v[3 * s + 2] = (struct iovec){scratch + s * (HDR + TRL) + HDR, TRL};
      }
      struct msghdr m = {.msg_iov = v, .msg_iovlen = NSEG * 3};
      ssize_t len = recvmsg(rx, &m, 0);
      calls++;
      if (len < 0) { perror("recvmsg"); return -1; }
      if (len == 1) break;
      int segs = (int)(len / SEG);
      for (int s = 0; s < segs; s++)
        if (++segs_seen % (NSEG * CREDIT_SENDS) == 0 && write(credit[1], "c", 1) != 1) return -1;
      for (int s = 0; bounce && s < segs; s++) movsb(bounce_buf, dest + start + (size_t)s * PAY, PAY);
      off = start + (size_t)PAY * segs;
      payload += (long)PAY * segs;
    }
  }
  double t = cpu(RUSAGE_SELF) - t0;
  waitpid(kid, NULL, 0);
  close(rx);
  close(credit[0]);
  close(credit[1]);
  free(dest);
  free(arena);
  double kib = payload / 1024.0;
  printf("  %-14s dest %2zu MiB: %.2f GB of payload (%.0f%% of sent), %6ld receive calls: %6.1f ns/KiB\n",
         MODES[mode], dest_len >> 20, payload / 1e9, 100.0 * payload / ((double)sends * PAY * NSEG), calls,
         t * 1e9 / kib);
  fflush(stdout);
  return t * 1e9 / kib;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 9;
  double gb = argc > 2 ? atof(argv[2]) : 2;
  if (reps < 1 || reps > MAXREPS || gb <= 0) {
    fprintf(stderr, "usage: place [REPS=9, at most %d] [GB per run=2]\n", MAXREPS);
    return 2;
  }
  static const int dests[NDEST] = {2, 8, 32};
  static double ns[NDEST][3][MAXREPS], ratio[NDEST][3][MAXREPS];
  for (int r = 0; r < reps; r++)
    for (int d = 0; d < NDEST; d++)
      for (int m = 0; m < 3; m++) {
        ns[d][m][r] = run(m, gb, (size_t)dests[d] << 20);
        if (ns[d][m][r] < 0) return 1;
        ratio[d][m][r] = ns[d][m][r] / ns[d][SLOT_MODE][r];
      }
  printf("\nreceiver CPU ns per KiB, median of %d; ratio: median of each run over the slot run before it\n", reps);
  for (int d = 0; d < NDEST; d++)
    for (int m = 0; m < 3; m++)
      printf("dest %2d MiB  %-14s %6.1f ns/KiB  x%.2f\n", dests[d], MODES[m], median(ns[d][m], reps),
             median(ratio[d][m], reps));
  return 0;
}
