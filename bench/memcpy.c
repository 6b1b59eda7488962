/* memcpy.c -- copy bandwidth of glibc memcpy between two 256 MiB buffers
 * (the physical ceiling of a loopback transfer: every byte rnic moves on one
 * host is copied at least once). usage: memcpy <bytes> <min_seconds> [threads]
 * Prints "copy_GBps=<x>" (bytes copied / s, 1e9; memory traffic is ~2x). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static size_t nbytes; static double min_s; static pthread_barrier_t bar;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
struct res { double secs; uint64_t copied; unsigned sink; };
static void *worker(void *arg){
  struct res *r = arg;
  char *src = aligned_alloc(4096, (nbytes + 4095) & ~4095UL), *dst = aligned_alloc(4096, (nbytes + 4095) & ~4095UL);
  if(!src||!dst){perror("alloc");exit(1);}
  memset(src, 0x5a, nbytes); memset(dst, 0, nbytes); memcpy(dst, src, nbytes);
  pthread_barrier_wait(&bar);
  double t0 = now(), t; uint64_t it = 0;
  do { memcpy(dst, src, nbytes); src[it % nbytes] ^= 1; it++; t = now(); } while (t - t0 < min_s);
  r->secs = t - t0; r->copied = it * nbytes; r->sink = (unsigned char)dst[it % nbytes];
  free(src); free(dst); return NULL;
}
int main(int argc, char **argv){
  if(argc < 3){fprintf(stderr,"usage: %s bytes min_seconds [threads]\n",argv[0]);return 2;}
  nbytes = strtoull(argv[1],0,0); min_s = atof(argv[2]); int nt = argc>3?atoi(argv[3]):1;
  if (nt < 1 || nt > 64) nt = 1;
  pthread_t th[64]; struct res r[64]; memset(r,0,sizeof r);
  pthread_barrier_init(&bar, NULL, nt);
  for(int i=0;i<nt;i++) pthread_create(&th[i],NULL,worker,&r[i]);
  double bw = 0; unsigned sink = 0;
  for(int i=0;i<nt;i++){ pthread_join(th[i],NULL); bw += r[i].copied / r[i].secs; sink += r[i].sink; }
  printf("memcpy bytes=%zu threads=%d copy_GBps=%.3f (sink=%u)\n", nbytes, nt, bw/1e9, sink & 1);
  return 0;
}
