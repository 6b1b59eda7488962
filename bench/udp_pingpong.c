/* udp_pingpong.c -- the 8-byte latency floor a UDP transport has on this
 * machine, and what each part of rnic-rxe's socket shape adds to it.
 *
 * Two processes ping-pong a 60-byte datagram (an 8-byte RDMA WRITE with a
 * bundled ACK is 40 + 20 bytes of RoCE) over lo, both spinning without
 * blocking. Modes, alternated round by round:
 *   recv   sendto + recv(MSG_DONTWAIT): the floor docs/benchmarks.md quotes
 *   mmsg   sendmmsg + recvmmsg of one header (source address, 4 KiB slot)
 *   rnic   mmsg on a socket shaped like rnic-rxe's: UDP_GRO and IP_PKTINFO
 *          (a control buffer per receive), SO_REUSEPORT with a classic BPF
 *          steering program, and an identification tap (a raw UDP socket
 *          on the address, which clones every packet) open beside it
 *   ring   sendmmsg, and receive from a TPACKET_V2 ring of an AF_PACKET
 *          socket on lo (filtered to the port) by polling frame status in
 *          memory: no receive system call; the UDP socket drops everything
 *          (a drop-all socket filter), so nothing queues there
 * Prints, per mode, the median and minimum over the rounds of each round's
 * mean one-way time (round trip / 2); then what one empty poll costs (a
 * non-blocking receive on an empty socket shaped like rnic's, the call an
 * idle busy-polling device makes per spin) as recv, recvmsg and recvmmsg
 * of one header, median ns per call over the rounds.
 *
 * gcc -O2 -o /tmp/udp_pingpong bench/udp_pingpong.c && /tmp/udp_pingpong 11 20000
 * (root: the tap and the ring need CAP_NET_RAW)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum { RECV, MMSG, RNIC, RING, NMODES };
static const char *names[NMODES] = {"recv", "mmsg", "rnic", "ring"};
enum { FRAME = 2048, NFR = 256 };

struct end {
  int mode, sock;
  char *ring;
  unsigned fr;
  char buf[4200], ctl[256];
};

static void die(const char *what) { perror(what); exit(1); }

static void ring_open(struct end *e, int port) {
  int p = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_IP)), v = TPACKET_V2, one = 1;
  if (p < 0) die("AF_PACKET socket (root?)");
  if (setsockopt(p, SOL_PACKET, PACKET_VERSION, &v, sizeof v)) die("PACKET_VERSION");
  if (setsockopt(p, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one)) die("PACKET_IGNORE_OUTGOING");
  /* lo frames: 14-byte Ethernet header, then IPv4. Accept UDP to `port`. */
  struct sock_filter code[] = {
      {BPF_LD | BPF_B | BPF_ABS, 0, 0, 23},            /* IP protocol */
      {BPF_JMP | BPF_JEQ | BPF_K, 0, 4, IPPROTO_UDP},
      {BPF_LDX | BPF_B | BPF_MSH, 0, 0, 14},           /* X = IP header length */
      {BPF_LD | BPF_H | BPF_IND, 0, 0, 16},            /* UDP destination port */
      {BPF_JMP | BPF_JEQ | BPF_K, 0, 1, (unsigned)port},
      {BPF_RET | BPF_K, 0, 0, 0xffff},
      {BPF_RET | BPF_K, 0, 0, 0},
  };
  struct sock_fprog fp = {sizeof code / sizeof code[0], code};
  if (setsockopt(p, SOL_SOCKET, SO_ATTACH_FILTER, &fp, sizeof fp)) die("SO_ATTACH_FILTER");
  struct tpacket_req req = {.tp_block_size = 1 << 16, .tp_block_nr = FRAME * NFR >> 16,
                            .tp_frame_size = FRAME, .tp_frame_nr = NFR};
  if (setsockopt(p, SOL_PACKET, PACKET_RX_RING, &req, sizeof req)) die("PACKET_RX_RING");
  e->ring = mmap(0, FRAME * NFR, PROT_READ | PROT_WRITE, MAP_SHARED, p, 0);
  if (e->ring == MAP_FAILED) die("mmap ring");
  struct sockaddr_ll ll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IP),
                           .sll_ifindex = (int)if_nametoindex("lo")};
  if (bind(p, (void *)&ll, sizeof ll)) die("bind AF_PACKET");
}

static void end_open(struct end *e, int mode, int port) {
  memset(e, 0, sizeof *e);
  e->mode = mode;
  e->sock = socket(AF_INET, SOCK_DGRAM, 0);
  int one = 1;
  if (mode == RNIC) {
    setsockopt(e->sock, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    setsockopt(e->sock, IPPROTO_UDP, UDP_GRO, &one, sizeof one);
    setsockopt(e->sock, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
  }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (bind(e->sock, (void *)&a, sizeof a)) die("bind");
  if (mode == RNIC) {
    struct sock_filter code[] = {{BPF_RET | BPF_K, 0, 0, 0}}; /* socket 0 of the group */
    struct sock_fprog p = {1, code};
    if (setsockopt(e->sock, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &p, sizeof p)) die("REUSEPORT_CBPF");
    if (socket(AF_INET, SOCK_RAW, IPPROTO_UDP) < 0) die("raw tap socket (root?)");
  }
  if (mode == RING) {
    struct sock_filter code[] = {{BPF_RET | BPF_K, 0, 0, 0}};
    struct sock_fprog p = {1, code};
    if (setsockopt(e->sock, SOL_SOCKET, SO_ATTACH_FILTER, &p, sizeof p)) die("drop filter");
    ring_open(e, port);
  }
}

static void rx(struct end *e) {
  if (e->mode == RING) {
    for (;;) {
      volatile struct tpacket2_hdr *h = (void *)(e->ring + (size_t)e->fr * FRAME);
      if (h->tp_status & TP_STATUS_USER) {
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        h->tp_status = TP_STATUS_KERNEL;
        e->fr = (e->fr + 1) % NFR;
        return;
      }
      __builtin_ia32_pause();
    }
  }
  if (e->mode == RECV) {
    while (recv(e->sock, e->buf, sizeof e->buf, MSG_DONTWAIT) <= 0) {
    }
    return;
  }
  struct sockaddr_in from;
  struct iovec v = {e->buf, sizeof e->buf};
  struct mmsghdr h;
  for (;;) {
    memset(&h, 0, sizeof h);
    h.msg_hdr.msg_name = &from;
    h.msg_hdr.msg_namelen = sizeof from;
    h.msg_hdr.msg_iov = &v;
    h.msg_hdr.msg_iovlen = 1;
    if (e->mode == RNIC) {
      h.msg_hdr.msg_control = e->ctl;
      h.msg_hdr.msg_controllen = sizeof e->ctl;
    }
    if (recvmmsg(e->sock, &h, 1, MSG_DONTWAIT, NULL) == 1) return;
  }
}

static void tx(struct end *e, struct sockaddr_in *to) {
  if (e->mode == RECV) {
    sendto(e->sock, e->buf, 60, 0, (void *)to, sizeof *to);
    return;
  }
  struct iovec v = {e->buf, 60};
  struct mmsghdr h;
  memset(&h, 0, sizeof h);
  h.msg_hdr.msg_name = to;
  h.msg_hdr.msg_namelen = sizeof *to;
  h.msg_hdr.msg_iov = &v;
  h.msg_hdr.msg_iovlen = 1;
  sendmmsg(e->sock, &h, 1, 0);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* One round of `n` round trips in `mode`: the mean one-way time in us. */
static double round_us(int mode, int n, int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)}, b = a;
  b.sin_port = htons(port + 1);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &b.sin_addr);
  int go[2];
  if (pipe(go)) die("pipe");
  pid_t kid = fork();
  if (kid == 0) {
    struct end e;
    end_open(&e, mode, port + 1);
    if (write(go[1], "r", 1) != 1) die("pipe write");
    for (int i = 0; i < n + 500; i++) {
      rx(&e);
      tx(&e, &a);
    }
    exit(0);
  }
  struct end e;
  end_open(&e, mode, port);
  char c;
  if (read(go[0], &c, 1) != 1) die("pipe read");
  double t0 = 0;
  for (int i = 0; i < n + 500; i++) {
    if (i == 500) t0 = now();
    tx(&e, &b);
    rx(&e);
  }
  double t = now() - t0;
  waitpid(kid, NULL, 0);
  close(e.sock);
  close(go[0]);
  close(go[1]);
  return t / n / 2 * 1e6;
}

static int cmp(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

/* ns per empty non-blocking receive: recv, recvmsg, recvmmsg (one header). */
static void empty_polls(int rounds) {
  struct end e;
  end_open(&e, RNIC, 24790);
  struct sockaddr_in from;
  struct iovec v = {e.buf, sizeof e.buf};
  enum { CALLS = 200000 };
  double t[3][rounds];
  for (int r = 0; r < rounds; r++) {
    double t0 = now();
    for (int i = 0; i < CALLS; i++) recv(e.sock, e.buf, sizeof e.buf, MSG_DONTWAIT);
    t[0][r] = now() - t0;
    struct msghdr h;
    t0 = now();
    for (int i = 0; i < CALLS; i++) {
      memset(&h, 0, sizeof h);
      h.msg_name = &from;
      h.msg_namelen = sizeof from;
      h.msg_iov = &v;
      h.msg_iovlen = 1;
      h.msg_control = e.ctl;
      h.msg_controllen = sizeof e.ctl;
      recvmsg(e.sock, &h, MSG_DONTWAIT);
    }
    t[1][r] = now() - t0;
    struct mmsghdr m;
    t0 = now();
    for (int i = 0; i < CALLS; i++) {
      memset(&m, 0, sizeof m);
      m.msg_hdr.msg_name = &from;
      m.msg_hdr.msg_namelen = sizeof from;
      m.msg_hdr.msg_iov = &v;
      m.msg_hdr.msg_iovlen = 1;
      m.msg_hdr.msg_control = e.ctl;
      m.msg_hdr.msg_controllen = sizeof e.ctl;
      recvmmsg(e.sock, &m, 1, MSG_DONTWAIT, NULL);
    }
    t[2][r] = now() - t0;
  }
  static const char *calls[3] = {"recv", "recvmsg", "recvmmsg"};
  printf("empty poll, ns per call (median of %d rounds of %d):", rounds, CALLS);
  for (int c = 0; c < 3; c++) {
    qsort(t[c], rounds, sizeof t[c][0], cmp);
    printf(" %s %.0f", calls[c], t[c][rounds / 2] / CALLS * 1e9);
  }
  printf("\n");
  close(e.sock);
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 11, n = argc > 2 ? atoi(argv[2]) : 20000;
  double (*t)[NMODES] = calloc(rounds, sizeof *t);
  for (int r = 0; r < rounds; r++)
    for (int m = 0; m < NMODES; m++) t[r][m] = round_us(m, n, 24700 + 10 * m);
  printf("one-way us, 60-byte datagrams, %d rounds of %d round trips\n", rounds, n);
  printf("%-5s %8s %8s %8s\n", "mode", "median", "min", "/recv");
  double base = 0;
  for (int m = 0; m < NMODES; m++) {
    double col[rounds];
    for (int r = 0; r < rounds; r++) col[r] = t[r][m];
    qsort(col, rounds, sizeof col[0], cmp);
    double med = col[rounds / 2];
    if (m == RECV) base = med;
    printf("%-5s %8.3f %8.3f %8.2f\n", names[m], med, col[0], med / base);
  }
  empty_polls(rounds);
  return 0;
}
