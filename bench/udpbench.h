/* udpbench.h -- what bench/zerocopy.c, bench/place.c and bench/splice.c
 * share: the headers of a UDP GSO/GRO benchmark, the socket options older
 * libc headers lack, the CPU time (user + system) of RUSAGE_SELF or
 * RUSAGE_CHILDREN, and the receiving socket. */
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
#endif
