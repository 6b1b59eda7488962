/* zerocopy.c -- does MSG_ZEROCOPY pay for rnic-rxe's sends on this machine?
 *
 * A sender process sends UDP GSO datagrams (64 000 bytes, UDP_SEGMENT 4 000:
 * 16 RoCE-sized segments, as rnic-rxe's 1 MiB WRITEs leave) from a 2 MiB
 * buffer to a receiver process on the same host, with or without
 * MSG_ZEROCOPY (SO_ZEROCOPY on, completions reaped from the error queue,
 * the buffer's pages reused only once the kernel released them, as a
 * transport would have to before completing a work request). The receiver
 * drains with UDP_GRO. Prints the CPU time (user + system, both processes)
 * per KiB moved and the sender's zero-copy outcome (how many sends the
 * kernel reported as copied anyway: SO_EE_CODE_ZEROCOPY_COPIED) and how
 * many of the bytes the receiver got (no flow control: a slower receiver
 * loses datagrams, and the CPU per KiB is per KiB sent).
 *
 *   gcc -O2 -o zerocopy bench/zerocopy.c
 *   ./zerocopy [copy|zerocopy] [GB=2] [dst=127.0.0.1]
 */
#include "udpbench.h"
#include <linux/errqueue.h>
#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

#define DGRAM 64000
#define SEG 4000
#define PORT 47911

/* Reap zero-copy completions; returns the highest send id released. */
static long reap(int fd, long *copied) {
  long hi = -1;
  for (;;) {
    char ctl[128];
    struct msghdr m = {.msg_control = ctl, .msg_controllen = sizeof ctl};
    if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) return hi;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      struct sock_extended_err *e = (void *)CMSG_DATA(c);
      if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY) continue;
      if (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) *copied += e->ee_data - e->ee_info + 1;
      if ((long)e->ee_data > hi) hi = e->ee_data;
    }
  }
}

int main(int argc, char **argv) {
  int zc = argc > 1 && strcmp(argv[1], "zerocopy") == 0;
  double gb = argc > 2 ? atof(argv[2]) : 2;
  const char *dst = argc > 3 ? argv[3] : "127.0.0.1";
  long sends = (long)(gb * 1e9 / DGRAM);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
  inet_pton(AF_INET, dst, &a.sin_addr);

  int rx = gro_receiver(&a), one = 1, big = 8 << 20;
  if (rx < 0) return 1;
  struct drain drain = drain_start(rx);
  int tx = socket(AF_INET, SOCK_DGRAM, 0);
  setsockopt(tx, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
  if (zc && setsockopt(tx, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) < 0) { perror("SO_ZEROCOPY"); return 1; }
  char *mem = aligned_alloc(4096, 2 << 20);
  memset(mem, 0x5a, 2 << 20);
  int slots = (2 << 20) / DGRAM;
  long released = -1, copied = 0, waits = 0;
  double t0 = cpu(RUSAGE_SELF);
  for (long i = 0; i < sends; i++) {
    /* a zero-copy send's pages may be reused only once released */
    while (zc && i - released > slots) {
      long r = reap(tx, &copied);
      if (r > released) released = r; else waits++;
    }
    while (send_gso(tx, &a, mem + (i % slots) * DGRAM, DGRAM, SEG, zc ? MSG_ZEROCOPY : 0) < 0) {
      if (errno != ENOBUFS && errno != EAGAIN) { perror("sendmsg"); return 1; }
      if (zc) { long r = reap(tx, &copied); if (r > released) released = r; }
    }
  }
  while (zc && released < sends - 1) { long r = reap(tx, &copied); if (r > released) released = r; }
  double t_send = cpu(RUSAGE_SELF) - t0;
  long got = drain_end(drain, tx, &a);
  double t_recv = cpu(RUSAGE_CHILDREN);
  double kib = sends * (double)DGRAM / 1024;
  printf("%s: %ld sends of %d B: sender %.1f ns/KiB, receiver %.1f ns/KiB, both %.1f ns/KiB CPU",
         zc ? "MSG_ZEROCOPY" : "copy", sends, DGRAM, t_send * 1e9 / kib, t_recv * 1e9 / kib,
         (t_send + t_recv) * 1e9 / kib);
  printf("; received %.1f %% of the bytes", 100.0 * got / (sends * (double)DGRAM));
  if (zc) printf("; %ld of %ld sends copied by the kernel anyway, %ld waits for released pages", copied, sends, waits);
  printf("\n");
  return 0;
}
