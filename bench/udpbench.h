/* udpbench.h -- what bench/zerocopy.c, bench/txring.c, bench/place.c,
 * bench/splice.c and bench/udp_pingpong.c share: the headers of a UDP GSO/GRO
 * benchmark, the socket options older libc headers lack, the CPU time (user +
 * system) of RUSAGE_SELF or RUSAGE_CHILDREN, the receiving socket, a GSO send,
 * a receiver process that drains it and reports the bytes, and for the
 * benchmarks that send whole frames on lo: the frame's headers and the two lo
 * sysctls that let such a frame back into the stack. */
#ifndef UDPBENCH_H
#define UDPBENCH_H
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

static inline double cpu(int who) {
  struct rusage r;
  getrusage(who, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

/* A UDP socket with an 8 MiB receive buffer and UDP_GRO, bound to `a`, or
 * -1 (printed). */
static inline int gro_receiver(const struct sockaddr_in *a) {
  int rx = socket(AF_INET, SOCK_DGRAM, 0), one = 1, big = 8 << 20;
  setsockopt(rx, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
  setsockopt(rx, IPPROTO_UDP, UDP_GRO, &one, sizeof one);
  if (bind(rx, (const void *)a, sizeof *a) < 0) { perror("bind"); close(rx); return -1; }
  return rx;
}

/* sendmsg of the `n` iovecs at `v` to `a` as one UDP GSO datagram of
 * `seg`-byte segments (a UDP_SEGMENT cmsg), with `flags`. */
static inline ssize_t sendv_gso(int tx, const struct sockaddr_in *a, struct iovec *v, size_t n, uint16_t seg,
                                int flags) {
  char ctl[CMSG_SPACE(sizeof(uint16_t))] = {0};
  struct msghdr m = {.msg_name = (void *)a, .msg_namelen = sizeof *a, .msg_iov = v, .msg_iovlen = n,
                     .msg_control = ctl, .msg_controllen = sizeof ctl};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_UDP; c->cmsg_type = UDP_SEGMENT; c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  memcpy(CMSG_DATA(c), &seg, sizeof seg);
  return sendmsg(tx, &m, flags);
}

/* sendv_gso of `len` bytes at `buf`. */
static inline ssize_t send_gso(int tx, const struct sockaddr_in *a, const void *buf, size_t len, uint16_t seg,
                               int flags) {
  struct iovec v = {(void *)buf, len};
  return sendv_gso(tx, a, &v, 1, seg, flags);
}

/* A drain: a child process that receives from `rx` until a 1-byte end
 * marker arrives; drain_end() sends the marker through `tx` to `a`, reaps the
 * child and returns the payload bytes it received (-1: none reported).
 * drain_start_flags(rx, MSG_DONTWAIT) spins on non-blocking reads instead of
 * sleeping in them. */
struct drain { pid_t kid; int report; };

static inline struct drain drain_start_flags(int rx, int flags) {
  int rep[2];
  if (pipe(rep) < 0) { perror("pipe"); exit(1); }
  pid_t kid = fork();
  if (kid < 0) { perror("fork"); exit(1); }
  if (kid == 0) {
    static char buf[1 << 16];
    long got = 0;
    for (;;) {
      ssize_t n = recv(rx, buf, sizeof buf, flags);
      if (n == 1) { if (write(rep[1], &got, sizeof got) < 0) _exit(1); _exit(0); }
      if (n > 0) got += n;
    }
  }
  close(rep[1]);
  return (struct drain){kid, rep[0]};
}

static inline struct drain drain_start(int rx) { return drain_start_flags(rx, 0); }

static inline long drain_end(struct drain d, int tx, const struct sockaddr_in *a) {
  sendto(tx, "x", 1, 0, (const void *)a, sizeof *a);
  waitpid(d.kid, NULL, 0);
  long got = 0;
  if (read(d.report, &got, sizeof got) != sizeof got) got = -1;
  close(d.report);
  return got;
}

/* Ones'-complement sum of n bytes (big-endian words) onto s, folded. */
static inline uint16_t sum16(const uint8_t *b, int n, uint32_t s) {
  for (int i = 0; i + 1 < n; i += 2) s += (b[i] << 8) | b[i + 1];
  if (n & 1) s += b[n - 1] << 8;
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  return s;
}

/* The 42 bytes before a UDP payload of `len` bytes sent as a frame on lo, from
 * and to `addr`: Ethernet (both addresses zero, as lo has), IPv4 (DF, TTL 64,
 * identification 0, checksummed), UDP (`sport` to `dport`, checksum 0: none). */
static inline void lo_frame_headers(uint8_t *e, const struct in_addr *addr, uint16_t sport, uint16_t dport,
                                    int len) {
  uint8_t *ip = e + 14, *u = ip + 20;
  int tot = 20 + 8 + len;
  memset(e, 0, 14 + 20 + 8);
  e[12] = 0x08; /* ETH_P_IP */
  ip[0] = 0x45; ip[2] = tot >> 8; ip[3] = tot & 0xff; ip[6] = 0x40; ip[8] = 64; ip[9] = 17;
  memcpy(ip + 12, addr, 4);
  memcpy(ip + 16, addr, 4);
  uint16_t c = ~sum16(ip, 20, 0);
  ip[10] = c >> 8; ip[11] = c & 0xff;
  u[0] = sport >> 8; u[1] = sport & 0xff; u[2] = dport >> 8; u[3] = dport & 0xff;
  u[4] = (8 + len) >> 8; u[5] = (8 + len) & 0xff;
}

/* A frame sent on lo comes back into the stack with no route: 127/8 and a local
 * source are martians unless these are 1 on lo. */
#define LOCALNET "/proc/sys/net/ipv4/conf/lo/route_localnet"
#define ACCEPT "/proc/sys/net/ipv4/conf/lo/accept_local"

/* Read a sysctl file's integer and write v to it; returns the old value or
 * -1 (printed). */
static inline int set_sysctl(const char *path, int v) {
  FILE *f = fopen(path, "r+");
  int old = -1;
  if (!f || fscanf(f, "%d", &old) != 1) { perror(path); if (f) fclose(f); return -1; }
  rewind(f);
  fprintf(f, "%d\n", v);
  if (fclose(f) != 0) { perror(path); return -1; }
  return old;
}
#endif
