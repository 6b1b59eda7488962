/* udpbench.h -- what bench/zerocopy.c and bench/place.c share: the headers
 * of a UDP GSO/GRO benchmark, the socket options older libc headers lack,
 * and the CPU time (user + system) of RUSAGE_SELF or RUSAGE_CHILDREN. */
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
#endif
