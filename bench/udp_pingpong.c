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
 *   pring  ring's receive, and send the datagram as a whole frame (Ethernet,
 *          IPv4 and UDP headers written here) with send() on the AF_PACKET
 *          socket: no UDP or IP output path, no route lookup. A frame sent
 *          on lo re-enters IP input with no route (a martian: 127/8 from a
 *          local source), so its rounds set net.ipv4.conf.lo.route_localnet
 *          and accept_local to 1 and restore them after: the frame
 *          then goes through IP and UDP input to the drop-all socket, as a
 *          NIC's would. A transport sending this way must know the next
 *          hop's MAC address itself (lo has none)
 *   uring  rnic's socket shape, received by an io_uring multishot RECVMSG
 *          into provided buffers, the receiver spinning on the completion
 *          queue in memory; default task running: the kernel interrupts the
 *          spinning receiver (an IPI) to run the receive
 *   ucoop  the same with IORING_SETUP_COOP_TASKRUN | TASKRUN_FLAG: no IPI;
 *          the receiver sees the flag in memory and enters the kernel once
 *          to run the receive
 * Prints, per mode, the median and minimum over the rounds of each round's
 * mean one-way time (round trip / 2); then what one empty poll costs (a
 * non-blocking receive on an empty socket shaped like rnic's, the call an
 * idle busy-polling device makes per spin) as recv, recvmsg and recvmmsg
 * of one header, median ns per call over the rounds.
 *
 * gcc -O2 -o /tmp/udp_pingpong bench/udp_pingpong.c && /tmp/udp_pingpong 11 20000
 * (root: the tap and the ring need CAP_NET_RAW). Not under chrt: io_uring's
 * workers are normal threads, which real-time spinners starve.
 */
#include "udpbench.h"
#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/if_packet.h>
#include <linux/io_uring.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { RECV, MMSG, RNIC, RING, PRING, URING, UCOOP, NMODES };
static const char *names[NMODES] = {"recv", "mmsg", "rnic", "ring", "pring", "uring", "ucoop"};
enum { FRAME = 2048, NFR = 256, NBUF = 16, BUFSZ = 4096 };

/* An io_uring with one multishot RECVMSG armed on the socket, its datagrams
 * landing in a ring of provided buffers; the receiver spins on the
 * completion queue's tail in memory. */
struct uring {
  int fd;
  int coop;
  unsigned *cq_head, *cq_tail, cq_mask, *sq_tail, sq_mask, *sq_flags;
  unsigned *sq_array;
  struct io_uring_sqe *sqes;
  struct io_uring_cqe *cqes;
  struct io_uring_buf_ring *br;
  char *bufs;
  unsigned short br_tail;
  struct msghdr tmpl;
  void *rings;
  size_t rings_len, sqes_len;
};

struct end {
  int mode, sock, tap, packet;
  char *ring;
  unsigned fr;
  struct uring u;
  char buf[4200], ctl[256];
  /* pring: the whole frame sent, built once per destination port. */
  unsigned char frame[14 + 20 + 8 + 60];
  int frame_port;
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
  e->packet = p;
  e->ring = mmap(0, FRAME * NFR, PROT_READ | PROT_WRITE, MAP_SHARED, p, 0);
  if (e->ring == MAP_FAILED) die("mmap ring");
  struct sockaddr_ll ll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IP),
                           .sll_ifindex = (int)if_nametoindex("lo")};
  if (bind(p, (void *)&ll, sizeof ll)) die("bind AF_PACKET");
}

static void uring_arm(struct end *e) {
  struct uring *u = &e->u;
  unsigned t = *u->sq_tail, i = t & u->sq_mask;
  struct io_uring_sqe *q = &u->sqes[i];
  memset(q, 0, sizeof *q);
  q->opcode = IORING_OP_RECVMSG;
  q->fd = e->sock;
  q->addr = (unsigned long)&u->tmpl;
  q->ioprio = IORING_RECV_MULTISHOT;
  q->flags = IOSQE_BUFFER_SELECT;
  q->buf_group = 0;
  u->sq_array[i] = i;
  __atomic_store_n(u->sq_tail, t + 1, __ATOMIC_RELEASE);
  if (syscall(__NR_io_uring_enter, u->fd, 1, 0, 0, NULL, 0) != 1) die("io_uring_enter");
}

static void uring_open(struct end *e, int coop) {
  struct uring *u = &e->u;
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  u->coop = coop;
  if (coop) p.flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG;
  u->fd = (int)syscall(__NR_io_uring_setup, 8, &p);
  if (u->fd < 0) die("io_uring_setup");
  if (!(p.features & IORING_FEAT_SINGLE_MMAP)) die("io_uring without SINGLE_MMAP");
  size_t sq = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  size_t cq = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  size_t sz = sq > cq ? sq : cq;
  char *r = mmap(0, sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, u->fd, IORING_OFF_SQ_RING);
  if (r == MAP_FAILED) die("mmap io_uring");
  u->rings = r;
  u->rings_len = sz;
  u->sq_tail = (unsigned *)(r + p.sq_off.tail);
  u->sq_flags = (unsigned *)(r + p.sq_off.flags);
  u->sq_mask = *(unsigned *)(r + p.sq_off.ring_mask);
  u->sq_array = (unsigned *)(r + p.sq_off.array);
  u->cq_head = (unsigned *)(r + p.cq_off.head);
  u->cq_tail = (unsigned *)(r + p.cq_off.tail);
  u->cq_mask = *(unsigned *)(r + p.cq_off.ring_mask);
  u->cqes = (struct io_uring_cqe *)(r + p.cq_off.cqes);
  u->sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_POPULATE, u->fd, IORING_OFF_SQES);
  if (u->sqes == MAP_FAILED) die("mmap sqes");
  u->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
  u->br = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  u->bufs = mmap(0, NBUF * BUFSZ, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (u->br == MAP_FAILED || u->bufs == MAP_FAILED) die("mmap buffers");
  struct io_uring_buf_reg reg;
  memset(&reg, 0, sizeof reg);
  reg.ring_addr = (unsigned long)u->br;
  reg.ring_entries = NBUF;
  reg.bgid = 0;
  if (syscall(__NR_io_uring_register, u->fd, IORING_REGISTER_PBUF_RING, &reg, 1)) die("PBUF_RING");
  for (int i = 0; i < NBUF; i++) {
    u->br->bufs[i].addr = (unsigned long)(u->bufs + (size_t)i * BUFSZ);
    u->br->bufs[i].len = BUFSZ;
    u->br->bufs[i].bid = (unsigned short)i;
  }
  u->br_tail = NBUF;
  __atomic_store_n(&u->br->tail, u->br_tail, __ATOMIC_RELEASE);
  memset(&u->tmpl, 0, sizeof u->tmpl);
  u->tmpl.msg_namelen = sizeof(struct sockaddr_in);
  u->tmpl.msg_controllen = 64;
  uring_arm(e);
}

static void uring_rx(struct end *e) {
  struct uring *u = &e->u;
  for (;;) {
    unsigned h = *u->cq_head;
    while (h == __atomic_load_n(u->cq_tail, __ATOMIC_ACQUIRE)) {
      /* Cooperative task running: no IPI; the flag says work is queued,
       * and entering the kernel runs it (the receive, its completion). */
      if (u->coop && (__atomic_load_n(u->sq_flags, __ATOMIC_ACQUIRE) & IORING_SQ_TASKRUN))
        syscall(__NR_io_uring_enter, u->fd, 0, 0, IORING_ENTER_GETEVENTS, NULL, 0);
      else
        __builtin_ia32_pause();
    }
    struct io_uring_cqe c = u->cqes[h & u->cq_mask];
    __atomic_store_n(u->cq_head, h + 1, __ATOMIC_RELEASE);
    if (c.flags & IORING_CQE_F_BUFFER) {
      unsigned short bid = (unsigned short)(c.flags >> IORING_CQE_BUFFER_SHIFT);
      struct io_uring_buf *b = &u->br->bufs[u->br_tail & (NBUF - 1)];
      b->addr = (unsigned long)(u->bufs + (size_t)bid * BUFSZ);
      b->len = BUFSZ;
      b->bid = bid;
      __atomic_store_n(&u->br->tail, ++u->br_tail, __ATOMIC_RELEASE);
    }
    if (c.res < 0 && c.res != -ENOBUFS) {
      fprintf(stderr, "io_uring recvmsg: %s\n", strerror(-c.res));
      exit(1);
    }
    if (!(c.flags & IORING_CQE_F_MORE)) uring_arm(e);
    if (c.res > 0) return;
  }
}

static void end_open(struct end *e, int mode, int port) {
  memset(e, 0, sizeof *e);
  e->mode = mode;
  e->tap = e->packet = e->u.fd = -1;
  e->sock = socket(AF_INET, SOCK_DGRAM, 0);
  int one = 1;
  if (mode == RNIC || mode == URING || mode == UCOOP) {
    setsockopt(e->sock, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    setsockopt(e->sock, IPPROTO_UDP, UDP_GRO, &one, sizeof one);
    setsockopt(e->sock, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
  }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (bind(e->sock, (void *)&a, sizeof a)) die("bind");
  if (mode == RNIC || mode == URING || mode == UCOOP) {
    struct sock_filter code[] = {{BPF_RET | BPF_K, 0, 0, 0}}; /* socket 0 of the group */
    struct sock_fprog p = {1, code};
    if (setsockopt(e->sock, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &p, sizeof p)) die("REUSEPORT_CBPF");
    e->tap = socket(AF_INET, SOCK_RAW, IPPROTO_UDP);
    if (e->tap < 0) die("raw tap socket (root?)");
  }
  if (mode == RING || mode == PRING) {
    struct sock_filter code[] = {{BPF_RET | BPF_K, 0, 0, 0}};
    struct sock_fprog p = {1, code};
    if (setsockopt(e->sock, SOL_SOCKET, SO_ATTACH_FILTER, &p, sizeof p)) die("drop filter");
    ring_open(e, port);
  }
  if (mode == URING || mode == UCOOP) uring_open(e, mode == UCOOP);
}

/* Everything end_open opened. A round that left its tap open would make every
 * later round's packets cloned once more; an io_uring left open keeps its armed
 * RECVMSG, and so its socket, in the port's reuseport group, where it would
 * take the next round's datagrams (rounds also use ports of their own, as the
 * ring's teardown is asynchronous). */
static void end_close(struct end *e) {
  if (e->u.fd >= 0) {
    close(e->u.fd);
    munmap(e->u.rings, e->u.rings_len);
    munmap(e->u.sqes, e->u.sqes_len);
    munmap(e->u.br, 4096);
    munmap(e->u.bufs, NBUF * BUFSZ);
  }
  if (e->packet >= 0) {
    munmap(e->ring, FRAME * NFR);
    close(e->packet);
  }
  if (e->tap >= 0) close(e->tap);
  close(e->sock);
}

static void rx(struct end *e) {
  if (e->mode == URING || e->mode == UCOOP) {
    uring_rx(e);
    return;
  }
  if (e->mode == RING || e->mode == PRING) {
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

/* pring's frame to 127.0.0.1:to_port (udpbench.h's headers, 60 bytes after). */
static void frame_build(struct end *e, int to_port) {
  struct in_addr lo = {htonl(INADDR_LOOPBACK)};
  memset(e->frame, 0, sizeof e->frame);
  lo_frame_headers(e->frame, &lo, 4791, (uint16_t)to_port, 60);
  e->frame_port = to_port;
}

static void tx(struct end *e, struct sockaddr_in *to) {
  if (e->mode == PRING) {
    if (e->frame_port != ntohs(to->sin_port)) frame_build(e, ntohs(to->sin_port));
    if (send(e->packet, e->frame, sizeof e->frame, 0) != (ssize_t)sizeof e->frame) die("packet send");
    return;
  }
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
    end_close(&e);
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
  end_close(&e);
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
  end_close(&e);
}

int main(int argc, char **argv) {
  int rounds = argc > 1 ? atoi(argv[1]) : 11, n = argc > 2 ? atoi(argv[2]) : 20000;
  double (*t)[NMODES] = calloc(rounds, sizeof *t);
  for (int r = 0; r < rounds; r++)
    for (int m = 0; m < NMODES; m++) {
      /* pring's frames go through IP and UDP input as a NIC's would (and are
       * dropped by the UDP socket's filter), not dropped as martians first;
       * only its rounds run with the two sysctls, which the other modes do
       * not need. */
      int localnet = m == PRING ? set_sysctl(LOCALNET, 1) : -1;
      int accept = m == PRING && localnet >= 0 ? set_sysctl(ACCEPT, 1) : -1;
      if (m == PRING && accept < 0) {
        if (localnet >= 0) set_sysctl(LOCALNET, localnet);
        return 1;
      }
      t[r][m] = round_us(m, n, 24700 + 100 * r + 10 * m);
      if (m == PRING) {
        set_sysctl(LOCALNET, localnet);
        set_sysctl(ACCEPT, accept);
      }
      fprintf(stderr, "\rround %d/%d %-5s %.3f us ", r + 1, rounds, names[m], t[r][m]);
    }
  fprintf(stderr, "\n");
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
