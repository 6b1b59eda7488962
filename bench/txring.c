/* txring.c -- can rnic-rxe's sender hand its datagrams to the kernel by
 * reference from an AF_PACKET transmit ring on loopback?
 *
 * A PACKET_TX_RING (TPACKET_V2) frame is sent without a kernel copy: the
 * kernel links the frame's pages into the skb and gives the frame back when
 * the skb is freed. A transport would copy (and ICRC) each payload into a
 * frame itself -- one pass, from the cache -- instead of the kernel's copy
 * into a fresh skb. This measures whether that holds on lo.
 *
 * A sender process sends 64 000-byte UDP GSO datagrams (UDP_SEGMENT 4 000,
 * as bench/zerocopy.c) from a 2 MiB buffer to a UDP_GRO receiver process on
 * 127.0.0.1, two ways:
 *   copy -- sendmsg with a UDP_SEGMENT cmsg (the kernel copies the payload);
 *   ring -- the sender writes Ethernet, IPv4 and UDP headers and memcpy's
 *           the payload into a ring frame (64 frames of 68 KiB) behind a
 *           virtio-net header (PACKET_VNET_HDR: GSO_UDP_L4, segment size,
 *           checksum offload), marks it SEND_REQUEST and kicks the socket
 *           with send() every 8 frames.
 * A frame sent on lo re-enters the stack with no route attached, so the
 * kernel drops it as a martian (127/8 source or destination, and a local
 * source) unless net.ipv4.conf.lo.route_localnet and accept_local are 1:
 * ring mode sets both for the run and restores them (root).
 * Prints the CPU time (user + system) of each process per KiB, the
 * sender's wall-clock rate and how many of the bytes the receiver got.
 *
 *   gcc -O2 -o txring bench/txring.c
 *   ./txring [copy|ring] [GB=4]
 */
#include "udpbench.h"
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/if.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>
#ifndef VIRTIO_NET_HDR_GSO_UDP_L4
#define VIRTIO_NET_HDR_GSO_UDP_L4 5
#endif

#define DGRAM 64000
#define SEG 4000
#define PORT 47913
#define FRAME (68 << 10)
#define FRAMES 64
#define KICK 8

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Wait until frame `j` (at `h`) is the sender's again -- the kernel freed its
 * skb -- kicking what is queued meanwhile. Returns how many kicks that took,
 * or -1 when the kernel refused the frame. */
static long wait_frame(int p, long j, struct tpacket2_hdr *h) {
  long kicks = 0;
  while (__atomic_load_n(&h->tp_status, __ATOMIC_ACQUIRE) != TP_STATUS_AVAILABLE) {
    if (h->tp_status & TP_STATUS_WRONG_FORMAT) { fprintf(stderr, "frame %ld: wrong format\n", j); return -1; }
    send(p, NULL, 0, MSG_DONTWAIT);
    kicks++;
  }
  return kicks;
}

/* Send `sends` datagrams from `mem` through a TX ring on lo; 0 or -1. */
static int ring_send(const uint8_t *mem, int slots, long sends, const struct sockaddr_in *a, long *waits) {
  int p = socket(AF_PACKET, SOCK_RAW, 0), v = TPACKET_V2, one = 1;
  if (p < 0) { perror("AF_PACKET socket (root?)"); return -1; }
  if (setsockopt(p, SOL_PACKET, PACKET_VERSION, &v, sizeof v) < 0 ||
      setsockopt(p, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0) { perror("PACKET_VERSION/VNET_HDR"); return -1; }
  struct tpacket_req req = {.tp_block_size = FRAME, .tp_block_nr = FRAMES, .tp_frame_size = FRAME, .tp_frame_nr = FRAMES};
  if (setsockopt(p, SOL_PACKET, PACKET_TX_RING, &req, sizeof req) < 0) { perror("PACKET_TX_RING"); return -1; }
  uint8_t *base = mmap(0, (size_t)FRAME * FRAMES, PROT_READ | PROT_WRITE, MAP_SHARED, p, 0);
  if (base == MAP_FAILED) { perror("mmap"); return -1; }
  struct sockaddr_ll ll = {.sll_family = AF_PACKET, .sll_protocol = htons(0x0800), .sll_ifindex = if_nametoindex("lo")};
  if (bind(p, (void *)&ll, sizeof ll) < 0) { perror("bind lo"); return -1; }
  const int data = TPACKET_ALIGN(sizeof(struct tpacket2_hdr)), tot = 20 + 8 + DGRAM;
  int pending = 0;
  for (long i = 0; i < sends; i++) {
    struct tpacket2_hdr *h = (void *)(base + (size_t)(i % FRAMES) * FRAME);
    long kicks = wait_frame(p, i, h);
    if (kicks < 0) return -1;
    if (kicks) { pending = 0; *waits += kicks; }
    uint8_t *d = (uint8_t *)h + data;
    struct virtio_net_hdr *vh = (void *)d;
    *vh = (struct virtio_net_hdr){.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM, .gso_type = VIRTIO_NET_HDR_GSO_UDP_L4,
                                  .hdr_len = 14 + 20 + 8, .gso_size = SEG, .csum_start = 14 + 20, .csum_offset = 6};
    uint8_t *e = d + sizeof *vh, *ip = e + 14, *u = ip + 20;
    lo_frame_headers(e, &a->sin_addr, 0xc000, PORT, DGRAM);
    /* checksum offload: the pseudo-header sum of one segment (GSO adjusts) */
    uint16_t ps = sum16(ip + 12, 8, 17 + 8 + SEG);
    u[6] = ps >> 8; u[7] = ps & 0xff;
    memcpy(u + 8, mem + (i % slots) * DGRAM, DGRAM);
    h->tp_len = sizeof *vh + 14 + tot;
    __atomic_store_n(&h->tp_status, TP_STATUS_SEND_REQUEST, __ATOMIC_RELEASE);
    if (++pending == KICK) {
      if (send(p, NULL, 0, MSG_DONTWAIT) < 0 && errno != EAGAIN && errno != ENOBUFS) { perror("send"); return -1; }
      pending = 0;
    }
  }
  for (long j = 0; j < FRAMES; j++) { /* every frame back: the receiver has them all */
    long kicks = wait_frame(p, j, (void *)(base + (size_t)j * FRAME));
    if (kicks < 0) return -1;
    *waits += kicks;
  }
  munmap(base, (size_t)FRAME * FRAMES);
  close(p);
  return 0;
}

int main(int argc, char **argv) {
  int ring = argc > 1 && strcmp(argv[1], "ring") == 0;
  double gb = argc > 2 ? atof(argv[2]) : 4;
  long sends = (long)(gb * 1e9 / DGRAM), waits = 0;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  int localnet = -1, accept = -1;
  if (ring && ((localnet = set_sysctl(LOCALNET, 1)) < 0 || (accept = set_sysctl(ACCEPT, 1)) < 0)) return 1;

  int rx = gro_receiver(&a);
  if (rx < 0) return 1;
  struct drain drain = drain_start(rx);
  uint8_t *mem = aligned_alloc(4096, 2 << 20);
  memset(mem, 0x5a, 2 << 20);
  int slots = (2 << 20) / DGRAM, rc = 0;
  int tx = socket(AF_INET, SOCK_DGRAM, 0), big = 8 << 20;
  setsockopt(tx, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
  double w0 = now(), t0 = cpu(RUSAGE_SELF);
  if (ring) {
    rc = ring_send(mem, slots, sends, &a, &waits);
  } else {
    for (long i = 0; i < sends; i++) {
      while (send_gso(tx, &a, mem + (i % slots) * DGRAM, DGRAM, SEG, 0) < 0) {
        if (errno != ENOBUFS && errno != EAGAIN) { perror("sendmsg"); rc = -1; break; }
        waits++;
      }
    }
  }
  double t_send = cpu(RUSAGE_SELF) - t0, wall = now() - w0;
  usleep(20000); /* let the receiver drain before the end marker */
  long got = drain_end(drain, tx, &a);
  double t_recv = cpu(RUSAGE_CHILDREN);
  if (ring) { set_sysctl(LOCALNET, localnet); set_sysctl(ACCEPT, accept); }
  if (rc < 0) return 1;
  double kib = sends * (double)DGRAM / 1024;
  printf("%s: %ld sends of %d B: sender %.1f ns/KiB, receiver %.1f ns/KiB, both %.1f ns/KiB CPU; sender %.2f GB/s; "
         "received %.1f %% of the bytes; %ld waits\n",
         ring ? "ring" : "copy", sends, DGRAM, t_send * 1e9 / kib, t_recv * 1e9 / kib, (t_send + t_recv) * 1e9 / kib,
         sends * (double)DGRAM / wall / 1e9, 100.0 * got / (sends * (double)DGRAM), waits);
  return 0;
}
