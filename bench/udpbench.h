/* udpbench.h -- what bench/zerocopy.c, bench/txring.c, bench/place.c and
 * bench/splice.c share: the headers of a UDP GSO/GRO benchmark, the socket
 * options older libc headers lack, the CPU time (user + system) of
 * RUSAGE_SELF or RUSAGE_CHILDREN, the receiving socket, a GSO send, and a receiver
 * process that drains it and reports the bytes. */
#ifndef UDPBENCH_H
#define UDPBENCH_H
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/udp.h>
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

static double cpu(int who) {
  struct rusage r;
  getrusage(who, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec * 1e-6;
}

/* A UDP socket with an 8 MiB receive buffer and UDP_GRO, bound to `a`, or
 * -1 (printed). */
static int gro_receiver(const struct sockaddr_in *a) {
  int rx = socket(AF_INET, SOCK_DGRAM, 0), one = 1, big = 8 << 20;
  setsockopt(rx, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
  setsockopt(rx, IPPROTO_UDP, UDP_GRO, &one, sizeof one);
  if (bind(rx, (const void *)a, sizeof *a) < 0) { perror("bind"); close(rx); return -1; }
  return rx;
}

/* sendmsg of `len` bytes at `buf` to `a` as one UDP GSO datagram of `seg`-byte
 * segments (a UDP_SEGMENT cmsg), with `flags`. */
static inline ssize_t send_gso(int tx, const struct sockaddr_in *a, const void *buf, size_t len, uint16_t seg,
                               int flags) {
  char ctl[CMSG_SPACE(sizeof(uint16_t))] = {0};
  struct iovec v = {(void *)buf, len};
  struct msghdr m = {.msg_name = (void *)a, .msg_namelen = sizeof *a, .msg_iov = &v, .msg_iovlen = 1,
                     .msg_control = ctl, .msg_controllen = sizeof ctl};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_UDP; c->cmsg_type = UDP_SEGMENT; c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
  memcpy(CMSG_DATA(c), &seg, sizeof seg);
  return sendmsg(tx, &m, flags);
}

/* A drain: a child process that receives from `rx` until a 1-byte end
 * marker arrives; drain_end() sends the marker through `tx` to `a`, reaps the
 * child and returns the payload bytes it received (-1: none reported). */
struct drain { pid_t kid; int report; };

static inline struct drain drain_start(int rx) {
  int rep[2];
  if (pipe(rep) < 0) { perror("pipe"); exit(1); }
  pid_t kid = fork();
  if (kid < 0) { perror("fork"); exit(1); }
  if (kid == 0) {
    static char buf[1 << 16];
    long got = 0;
    for (;;) {
      ssize_t n = recv(rx, buf, sizeof buf, 0);
      if (n == 1) { if (write(rep[1], &got, sizeof got) < 0) _exit(1); _exit(0); }
      if (n > 0) got += n;
    }
  }
  close(rep[1]);
  return (struct drain){kid, rep[0]};
}

static inline long drain_end(struct drain d, int tx, const struct sockaddr_in *a) {
  sendto(tx, "x", 1, 0, (const void *)a, sizeof *a);
  waitpid(d.kid, NULL, 0);
  long got = 0;
  if (read(d.report, &got, sizeof got) != sizeof got) got = -1;
  close(d.report);
  return got;
}
#endif
