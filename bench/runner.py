"""runner.py -- the measurement loop of bench/compare.sh (see there for usage).

Every repetition runs every test once (interleaved), REPS times. Each run
records wall time, the CPU its own processes used (getrusage of children)
and the CPU everything else on the machine used meanwhile ("foreign",
/proc/stat busy time minus ours, % of one vCPU). Rows go to runs.csv; the
summary (medians [min-max], ratios rnic/peer) is written by summary.py.
"""
import csv, json, os, re, resource, signal, subprocess, time

E = os.environ
OUT, REPS, QUICK = E["OUT"], int(E["REPS"]), E.get("QUICK", "0") == "1"
ONLY = E["ONLY"].split()
RNIC, MEMCPY, FT = E["RNICCTL"], E["MEMCPY"], E.get("FABTESTS_BIN", "")
NS = E.get("NS_A", ""), E.get("NS_B", "")       # empty: no namespace test
NS_IP = E.get("NS_IP_A", "10.77.0.1"), E.get("NS_IP_B", "10.77.0.2")

if QUICK:
    BW_SIZES = [8, 4096, 65536, 1048576, 4194304]
    DUR = 1                      # seconds per rnic bandwidth point (-D)
    LAT_N, UCX_LAT_N, PEER_T = 10000, 10000, 1
    DUEL_N = 50000
else:
    BW_SIZES = [8, 64, 512, 4096, 32768, 65536, 262144, 1048576, 4194304]
    DUR, LAT_N, UCX_LAT_N, PEER_T = 3, 20000, 20000, 3
    DUEL_N = 200000
LAT_SIZES = [8, 4096, 65536]
UCX_ENV = dict(E, UCX_TLS="tcp", UCX_NET_DEVICES="lo")
FI_ENV = dict(E, FI_TCP_IFACE="lo", FI_UDP_IFACE="lo", FI_SOCKETS_IFACE="lo")
rows, port_ctr = [], [0]


def port(base):
    port_ctr[0] += 1
    return base + port_ctr[0] % 200


def busy_jiffies():
    v = list(map(int, open("/proc/stat").readline().split()[1:9]))
    return sum(v) - v[3] - v[4]


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_port(p, udp=False, ns=None, secs=10):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ss", "-lun" if udp else "-ltn"]
    for _ in range(secs * 20):
        if re.search(rf"[:.]{p}\s", subprocess.run(cmd, capture_output=True, text=True).stdout):
            return
        time.sleep(0.05)


def run(name, client, server=None, env=None, p=None, udp=False, ns=None, timeout=120, sleep=0.0):
    """Run client (after server is listening); returns (client output, cpu s, foreign %)."""
    log = open(f"{OUT}/logs/{name}.log", "w")
    log.write(f"# cmd: {' '.join(client)}\n# server: {' '.join(server) if server else '-'}\n")
    log.flush()
    b0, c0, t0 = busy_jiffies(), child_cpu(), time.time()
    srv = None
    if server:
        srv = subprocess.Popen(server, env=env, stdout=log, stderr=subprocess.STDOUT)
        if p:
            wait_port(p, udp, ns)
        time.sleep(sleep)
    try:
        r = subprocess.run(client, env=env, capture_output=True, text=True, timeout=timeout)
        text, rc = r.stdout + r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = f"TIMEOUT {e}", 124
    if srv:
        try:
            srv.wait(timeout=5 if rc == 0 else 1)
        except subprocess.TimeoutExpired:
            srv.send_signal(signal.SIGTERM)
            try:
                srv.wait(timeout=3)
            except subprocess.TimeoutExpired:
                srv.kill(); srv.wait()
    wall, cpu = time.time() - t0, child_cpu() - c0
    busy = (busy_jiffies() - b0) / os.sysconf("SC_CLK_TCK")
    foreign = max(0.0, 100.0 * (busy - cpu) / wall)
    log.write(text + f"\n# rc {rc} wall {wall:.2f}s cpu {cpu:.2f}s foreign {foreign:.0f}%"
              f" load {open('/proc/loadavg').read().strip()}\n")
    log.close()
    if rc != 0:
        print(f"  ! {name}: rc {rc} (see logs/{name}.log)", flush=True)
    return text, cpu, foreign


def add(rep, group, test, mode, size, metric, value, unit, cpu_per_gb=None, foreign=0.0):
    rows.append(dict(rep=rep, group=group, test=test, mode=mode, size=size, metric=metric,
                     value=round(value, 6), unit=unit,
                     cpu_s_per_gb=None if cpu_per_gb is None else round(cpu_per_gb, 3),
                     foreign_pct=round(foreign, 1)))


def rnic_result(text):
    """The first result row of an `rnicctl perf --json` run, or None."""
    try:
        return json.loads(text[text.index("{"):text.rindex("}") + 1])["results"][0]
    except (ValueError, KeyError, IndexError):
        return None


def ucx_final(text):
    """The fields of ucx_perftest's last `Final:` line, or None:
    Final: iters typ avg overall(us) | bw avg overall MiB/s | msgrate."""
    final = [l for l in text.splitlines() if re.match(r"\s*Final:", l)]
    return final[-1].split() if final else None


# ------------------------------------------------------------------ rnic ---
def rnic_pair(where):
    """(server prefix, server dev, client prefix, client dev, server ip)"""
    if where == "netns":
        a, b = NS
        return ["ip", "netns", "exec", a], f"rxe:{NS_IP[0]}", ["ip", "netns", "exec", b], f"rxe:{NS_IP[1]}", NS_IP[0], a
    return [], "rxe:127.0.0.1", [], "rxe:127.0.0.2", "127.0.0.1", None


def rnic(rep):
    wheres = ["loopback"] + (["netns"] if NS[0] else [])
    for where in wheres:
        spre, sdev, cpre, cdev, sip, sns = rnic_pair(where)
        for t in ("write", "read", "send"):
            for s in BW_SIZES:
                p = port(18600)
                args = ["-s", str(s), "-D", str(DUR), "-p", str(p), "--json"]
                text, cpu, forn = run(f"rnic_{where}_{t}-bw__s{s}__r{rep}",
                                      cpre + [RNIC, "perf", f"{t}-bw", "-d", cdev, *args, sip],
                                      server=spre + [RNIC, "perf", f"{t}-bw", "-d", sdev, *args],
                                      p=p, ns=sns, timeout=DUR * 10 + 30)
                res = rnic_result(text)
                if res:
                    gbs = res["bw_average"] * 2**20 / 1e9
                    moved = res["iterations"] * s / 1e9
                    add(rep, "rnic", f"rnic {t}-bw {where}", "poll", s, "bw", gbs, "GB/s",
                        cpu / moved if moved else None, forn)
        def write_bw(tag, mode, s, pre=(cpre, spre), server_flags=(), env=None):
            """One 1/4 MiB write-bw row beside the busy-polling ones."""
            p = port(18600)
            args = ["-s", str(s), "-D", str(DUR), "-p", str(p), "--json"]
            text, cpu, forn = run(f"rnic_{where}_write-bw_{tag}__s{s}__r{rep}",
                                  pre[0] + [RNIC, "perf", "write-bw", "-d", cdev, *args, sip],
                                  server=pre[1] + [RNIC, "perf", "write-bw", "-d", sdev, *server_flags, *args],
                                  env=env, p=p, ns=sns, timeout=DUR * 10 + 30)
            res = rnic_result(text)
            if res:
                moved = res["iterations"] * s / 1e9
                add(rep, "rnic", f"rnic write-bw {where}", mode, s, "bw",
                    res["bw_average"] * 2**20 / 1e9, "GB/s", cpu / moved if moved else None, forn)

        # The WRITE responder has nothing to poll (no completion on the
        # target side, as with ib_write_bw on a NIC): a server on its
        # progress thread (`-e`) sleeps whenever the socket is empty and
        # spends only its work, while the client busy-polls. The CPU·s/GB
        # of this row is what the transfer itself costs both processes.
        for s in (1048576, 4194304):
            write_bw("passive", "poll, passive server", s, server_flags=["-e"])
        # The opt-in low-latency path (packet-ring receive and frame
        # transmit: RNIC_RXE_RX_RING=1, root, Linux 6.2+; lo's accept_local
        # and route_localnet set for the run only, as in the duel) is also
        # the faster bulk path on lo: frames skip the UDP socket's output and
        # the ring the socket's receive. A run that cannot open its ring
        # leaves no row.
        for s in (1048576, 4194304) if where == "loopback" else ():
            env = dict(os.environ, RNIC_RXE_RX_RING="1", RNIC_RXE_TX_FRAMES="1")
            with lo_frames(True) as ok:
                if ok:
                    write_bw("frames", "poll, packet ring + frames", s, env=env)
        for t in ("write", "send"):
            for mode in ("poll", "blocking"):
                for s in LAT_SIZES:
                    p = port(18600)
                    args = ["-s", str(s), "-n", str(LAT_N), "-p", str(p), "--json"] + (["-e"] if mode == "blocking" else [])
                    text, cpu, forn = run(f"rnic_{where}_{t}-lat_{mode}__s{s}__r{rep}",
                                          cpre + [RNIC, "perf", f"{t}-lat", "-d", cdev, *args, sip],
                                          server=spre + [RNIC, "perf", f"{t}-lat", "-d", sdev, *args],
                                          p=p, ns=sns)
                    res = rnic_result(text)
                    if res:
                        add(rep, "rnic", f"rnic {t}-lat {where}", mode, s, "lat", res["t_avg_us"], "us", None, forn)


# ------------------------------------------------------------------- UCX ---
def ucx(rep):
    for t in ("ucp_put_bw", "tag_bw"):
        for s in BW_SIZES:
            n = max(200, min(200000, (256 << 20 if QUICK else 2 << 30) // s // 4)); w = max(n // 10, 10)
            p = port(13400)
            text, cpu, forn = run(f"ucx_{t}__s{s}__r{rep}",
                                  ["ucx_perftest", "127.0.0.1", "-p", str(p), "-t", t, "-s", str(s), "-n", str(n), "-w", str(w)],
                                  server=["ucx_perftest", "-p", str(p)], env=UCX_ENV, p=p)
            f = ucx_final(text)
            if f:
                gbs = float(f[6]) * 2**20 / 1e9
                add(rep, "UCX", f"UCX tcp {t}", "poll", s, "bw", gbs, "GB/s", cpu / ((n + w) * s / 1e9), forn)
    for t in ("tag_lat", "ucp_put_lat"):
        for mode in ("poll", "blocking"):
            for s in LAT_SIZES:
                n = UCX_LAT_N if s < 65536 else UCX_LAT_N // 5
                p = port(13400)
                extra = ["-E", "sleep"] if mode == "blocking" else []
                text, cpu, forn = run(f"ucx_{t}_{mode}__s{s}__r{rep}",
                                      ["ucx_perftest", "127.0.0.1", "-p", str(p), "-t", t, "-s", str(s), "-n", str(n), *extra],
                                      server=["ucx_perftest", "-p", str(p), *extra], env=UCX_ENV, p=p)
                f = ucx_final(text)
                if f:
                    add(rep, "UCX", f"UCX tcp {t}", mode, s, "lat", float(f[4]), "us", None, forn)


# ------------------------------------------------------- kernel TCP (lo) ---
def tcp(rep):
    for s in [x for x in BW_SIZES if 4096 <= x <= 1048576]:   # iperf3 -l max 1 MiB
        p = port(5300)
        text, cpu, forn = run(f"iperf3__s{s}__r{rep}",
                              ["iperf3", "-c", "127.0.0.1", "-p", str(p), "-l", str(s), "-t", str(PEER_T), "-J"],
                              server=["iperf3", "-s", "-1", "-p", str(p), "-B", "127.0.0.1"], p=p)
        try:
            j = json.loads(text[text.index("{"):text.rindex("}") + 1])
            bps = j["end"]["sum_received"]["bits_per_second"]
            add(rep, "TCP", "kernel TCP iperf3", "blocking", s, "bw", bps / 8e9, "GB/s",
                cpu / (j["end"]["sum_received"]["bytes"] / 1e9), forn)
        except (ValueError, KeyError):
            pass
    for s in LAT_SIZES:
        p = port(19800)
        text, cpu, forn = run(f"qperf_tcp_lat__s{s}__r{rep}",
                              ["qperf", "127.0.0.1", "-lp", str(p), "-m", str(s), "-t", str(PEER_T), "tcp_lat"],
                              server=["qperf", "-lp", str(p)], p=p, timeout=30)
        m = re.search(r"latency\s*=\s*([\d.]+)\s*(ns|us|ms)", text)
        if m:
            add(rep, "TCP", "kernel TCP qperf tcp_lat", "blocking", s, "lat",
                float(m.group(1)) * {"ns": 1e-3, "us": 1, "ms": 1e3}[m.group(2)], "us", None, forn)


# ------------------------------------------------------------- libfabric ---
FI_PROV = [("tcp", "tcp", "msg"), ("udp;ofi_rxd", "udp", "rdm")]


def fi(rep):
    for label, prov, ep in FI_PROV:
        for s in LAT_SIZES:
            n = 10000 if s < 65536 else 2000
            if QUICK:
                n //= 5
            p = port(47600)
            base = ["-p", prov, "-e", ep, "-S", str(s), "-I", str(n)]
            text, cpu, forn = run(f"fi_pingpong_{prov}__s{s}__r{rep}",
                                  ["fi_pingpong", *base, "-P", str(p), "127.0.0.1"],
                                  server=["fi_pingpong", *base, "-B", str(p)], env=FI_ENV, p=p, timeout=60)
            col = None   # header: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
            for l in text.splitlines():
                f = l.split()
                if "usec/xfer" in f:
                    col = f.index("usec/xfer")
                elif col and len(f) > col and re.match(r"\d+[kmg]?$", f[0]) and re.match(r"[\d.]+$", f[col]):
                    # usec/xfer = one-way (2 transfers per round trip)
                    add(rep, "libfabric", f"libfabric {label} fi_pingpong", "poll", s, "lat", float(f[col]), "us", None, forn)
                    break
        if FT and os.access(f"{FT}/fi_rma_bw", os.X_OK):
            for s in BW_SIZES:
                n = max(100, min(20000, (64 << 20 if QUICK else 512 << 20) // s))
                p = port(9300)
                args = ["-p", prov, "-e", "rdm", "-o", "writedata", "-S", str(s), "-I", str(n)]
                if prov == "tcp":
                    args[1] = "tcp;ofi_rxm"
                text, cpu, forn = run(f"fi_rma_bw_{prov}__s{s}__r{rep}",
                                      [f"{FT}/fi_rma_bw", *args, "-P", str(p), "127.0.0.1"],
                                      server=[f"{FT}/fi_rma_bw", *args, "-s", "127.0.0.1", "-B", str(p)],
                                      env=FI_ENV, p=p, udp=prov == "udp")
                for l in text.splitlines():
                    f = l.split()
                    if len(f) >= 7 and re.match(r"\d+[kmg]?$", f[0]) and re.match(r"[\d.]+$", f[4]):
                        add(rep, "libfabric", f"libfabric {label} fi_rma_bw writedata", "poll", s, "bw",
                            float(f[4]) / 1e3, "GB/s", cpu / (n * s / 1e9), forn)
                        break


# ------------------------------------------------------------------ duel ---
class lo_frames:
    """With `on`, set lo's accept_local and route_localnet to 1 (frames
    looped back on lo then pass IP input: rnic_rxe::frames) and restore
    them on exit; yields whether the run may go (False: not root)."""
    KEYS = ("/proc/sys/net/ipv4/conf/lo/accept_local", "/proc/sys/net/ipv4/conf/lo/route_localnet")

    def __init__(self, on):
        self.on, self.old = on, []

    def __enter__(self):
        if not self.on:
            return True
        try:
            for k in self.KEYS:
                self.old.append((k, open(k).read().strip()))
                open(k, "w").write("1")
        except OSError:
            self.__exit__()
            return False
        return True

    def __exit__(self, *exc):
        for k, v in self.old:
            try:
                open(k, "w").write(v)
            except OSError:
                pass
        self.old = []


def duel(rep):
    """The latency target of issues #4 and #30, measured fairly: 8-byte one-way
    latency, busy polling, rnic `write-lat` (on its socket path, then with the
    packet-ring receive path, RNIC_RXE_RX_RING=1: root, Linux 6.2+) and UCX
    `tag_lat` back to back (the order rotates per repetition), so all meet the
    same machine state. The ring runs twice: with frame transmit off
    (RNIC_RXE_TX_FRAMES=0), and with it on, for which lo's accept_local and
    route_localnet are set for that run only (restored after; rnic never sets
    them). A ring run that cannot open its ring leaves no row."""
    def rnic_lat(ring=False, frames=False):
        p = port(18800)
        args = ["-s", "8", "-n", str(DUEL_N), "-p", str(p), "--json"]
        env = dict(os.environ, RNIC_RXE_RX_RING="1" if ring else "0",
                   RNIC_RXE_TX_FRAMES="1" if frames else "0")
        tag = "_frames" if frames else "_ring" if ring else ""
        with lo_frames(frames) as ok:
            if not ok:
                return
            text, cpu, forn = run(f"duel_rnic_write-lat{tag}__r{rep}",
                                  [RNIC, "perf", "write-lat", "-d", "rxe:127.0.0.2", *args, "127.0.0.1"],
                                  server=[RNIC, "perf", "write-lat", "-d", "rxe:127.0.0.1", *args], env=env, p=p)
        res = rnic_result(text)
        if res:
            label = ("duel: rnic write-lat, packet ring + frames" if frames else
                     "duel: rnic write-lat, packet ring" if ring else "duel: rnic write-lat")
            add(rep, "duel", label, "poll", 8, "lat", res["t_avg_us"], "us", None, forn)

    def ucx_lat():
        p = port(13600)
        text, cpu, forn = run(f"duel_ucx_tag_lat__r{rep}",
                              ["ucx_perftest", "127.0.0.1", "-p", str(p), "-t", "tag_lat", "-s", "8", "-n", str(DUEL_N)],
                              server=["ucx_perftest", "-p", str(p)], env=UCX_ENV, p=p)
        f = ucx_final(text)
        if f:
            add(rep, "duel", "duel: UCX tcp tag_lat", "poll", 8, "lat", float(f[4]), "us", None, forn)

    order = [rnic_lat, lambda: rnic_lat(ring=True), lambda: rnic_lat(ring=True, frames=True), ucx_lat]
    k = rep % len(order)
    for f in order[k:] + order[:k]:
        f()


# ----------------------------------------------------------------- share ---
def share(rep):
    """Both ends on one shared device (rxe:127.0.0.1 twice: two processes in
    one SO_REUSEPORT group on UDP/4791, steered by QPN; docs/sharing.md) next
    to the usual two addresses (rxe:127.0.0.1 <-> rxe:127.0.0.2), the order
    alternating per repetition: write-lat 8 B busy poll and write-bw 1 MiB."""
    def one(where):
        cdev = "rxe:127.0.0.1" if where == "shared" else "rxe:127.0.0.2"
        label = "one shared device" if where == "shared" else "two addresses"
        p = port(18900)
        args = ["-s", "8", "-n", str(LAT_N), "-p", str(p), "--json"]
        text, cpu, forn = run(f"share_{where}_write-lat__r{rep}",
                              [RNIC, "perf", "write-lat", "-d", cdev, *args, "127.0.0.1"],
                              server=[RNIC, "perf", "write-lat", "-d", "rxe:127.0.0.1", *args], p=p)
        res = rnic_result(text)
        if res:
            add(rep, "share", f"rnic write-lat loopback, {label}", "poll", 8, "lat", res["t_avg_us"], "us", None, forn)
        p, s = port(18900), 1048576
        args = ["-s", str(s), "-D", str(DUR), "-p", str(p), "--json"]
        text, cpu, forn = run(f"share_{where}_write-bw__r{rep}",
                              [RNIC, "perf", "write-bw", "-d", cdev, *args, "127.0.0.1"],
                              server=[RNIC, "perf", "write-bw", "-d", "rxe:127.0.0.1", *args],
                              p=p, timeout=DUR * 10 + 30)
        res = rnic_result(text)
        if res:
            gbs = res["bw_average"] * 2**20 / 1e9
            moved = res["iterations"] * s / 1e9
            add(rep, "share", f"rnic write-bw loopback, {label}", "poll", s, "bw", gbs, "GB/s",
                cpu / moved if moved else None, forn)

    for w in (("shared", "two") if rep % 2 else ("two", "shared")):
        one(w)


# ---------------------------------------------------------------- memcpy ---
def mem(rep):
    for th in (1, 2):
        text, cpu, forn = run(f"memcpy_256MiB_t{th}__r{rep}", [MEMCPY, str(256 << 20), "1" if QUICK else "3", str(th)])
        m = re.search(r"copy_GBps=([\d.]+)", text)
        if m:
            add(rep, "memcpy", f"memcpy 256 MiB, {th} thread{'s' if th > 1 else ''}", "-", 268435456, "bw",
                float(m.group(1)), "GB/s", None, forn)


GROUPS = (("mem", mem), ("duel", duel), ("share", share), ("rnic", rnic), ("ucx", ucx), ("tcp", tcp), ("fi", fi))
for rep in range(1, REPS + 1):
    for g, f in GROUPS:
        if g in ONLY:
            t0 = time.time()
            f(rep)
            print(f"rep {rep}/{REPS} {g}: {time.time() - t0:.0f} s", flush=True)
    with open(f"{OUT}/runs.csv", "w", newline="") as fh:   # rewritten each repetition
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()) if rows else ["rep"])
        w.writeheader(); w.writerows(rows)
