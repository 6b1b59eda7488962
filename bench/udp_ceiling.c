/* udp_ceiling.c -- how fast can one core send RoCE-shaped UDP over lo, doing
 * nothing else?
 *
 * The bound under issue 30's bandwidth targets: a sender process that only
 * calls sendmsg, each call one UDP GSO datagram of 15 segments laid out as
 * rnic-rxe's in-place sends lay out a 1 MiB WRITE's middle packets (per
 * segment: 36 bytes of headers from a small buffer, 4096 payload bytes in
 * place in a 2 MiB region, a 4-byte ICRC: three iovecs), with no ICRC to
 * compute, no engine, no ACKs to wait for and no flow control; a receiver
 * process drains with UDP_GRO (what it misses is reported, not resent). The
 * sender's CPU time per KiB is the kernel's whole sending cost on lo, the
 * loopback receive that runs on the sending CPU included (and the wake-ups
 * of the receiver, which blocks); one core spending nothing else can send
 * at most 1 KiB per that many ns. `spin` makes the receiver spin on
 * non-blocking reads instead: no wake-ups, but on this 2-vCPU VM two busy
 * vCPUs run slower than one (2026-12-07: 142 against 101 ns/KiB).
 * `flat` sends the same bytes from one iovec per datagram, for comparison.
 *
 *   gcc -O2 -o /tmp/udp_ceiling bench/udp_ceiling.c
 *   /tmp/udp_ceiling [roce|flat] [GB=3] [region MiB=2] [block|spin]
 */
#include "udpbench.h"

#define PORT 47913
#define NSEG 15
#define HDR 36
#define PAY 4096
#define SEG (HDR + PAY + 4)

int main(int argc, char **argv) {
  int roce = !(argc > 1 && strcmp(argv[1], "flat") == 0);
  double gb = argc > 2 ? atof(argv[2]) : 3;
  long region = (argc > 3 ? atol(argv[3]) : 2) << 20;
  int spin = argc > 4 && strcmp(argv[4], "spin") == 0;
  if (region < (long)PAY * NSEG) { fprintf(stderr, "region too small\n"); return 2; }
  long dgram = (long)SEG * NSEG, sends = (long)(gb * 1e9 / dgram), msgs = region / (PAY * NSEG);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  int rx = gro_receiver(&a), big = 8 << 20;
  if (rx < 0) return 1;
  struct drain drain = drain_start_flags(rx, spin ? MSG_DONTWAIT : 0);
  int tx = socket(AF_INET, SOCK_DGRAM, 0);
  setsockopt(tx, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
  char *mem = aligned_alloc(4096, region), *flat = aligned_alloc(4096, dgram);
  static char hdr[NSEG][64];
  memset(mem, 0x5a, region);
  memset(flat, 0x3c, dgram);
  memset(hdr, 0x11, sizeof hdr);
  double t0 = cpu(RUSAGE_SELF);
  for (long i = 0; i < sends; i++) {
    struct iovec v[3 * NSEG];
    int n = 0;
    if (roce) {
      char *p = mem + (i % msgs) * PAY * NSEG;
      for (int s = 0; s < NSEG; s++) {
        v[n++] = (struct iovec){hdr[s], HDR};
        v[n++] = (struct iovec){p + (long)PAY * s, PAY};
        v[n++] = (struct iovec){hdr[s] + 40, 4};
      }
    } else {
      v[n++] = (struct iovec){flat, dgram};
    }
    while (sendv_gso(tx, &a, v, n, SEG, 0) < 0) {
      if (errno != ENOBUFS && errno != EAGAIN) { perror("sendmsg"); return 1; }
    }
  }
  double t_send = cpu(RUSAGE_SELF) - t0;
  long got = drain_end(drain, tx, &a);
  double kib = sends * (double)dgram / 1024;
  double ns = t_send * 1e9 / kib;
  printf("%s, %ld MiB region: sender %.1f ns/KiB CPU, so at most %.2f GB/s from one core; "
         "receiver (%s) %.1f ns/KiB; received %.1f %% of the bytes\n",
         roce ? "roce" : "flat", region >> 20, ns, 1024 / ns, spin ? "spinning" : "blocking",
         cpu(RUSAGE_CHILDREN) * 1e9 / kib,
         100.0 * got / (sends * (double)dgram));
  return 0;
}
