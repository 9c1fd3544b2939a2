#!/usr/bin/env python3
"""The reliability soak (issue 35, item 5): a bounded run, not CI.

Mixed clients against a qcow2 export (over a raw backing file, so writes copy clusters)
on an ext4 file system in a loop-mounted image file, while faults fire (`--inject`: EIO
and ENOSPC on writes and flushes, delays), the daemon is SIGKILLed and restarted every
30-90 s, and an NBD-backed export's nbdkit server is SIGKILLed and restarted every
20-60 s. Clients:
- fio with verify (its own region, no faults but delays): each run writes, then reads
  back and checks every block (crc32c); a verify failure is a bug.
- `qemu-img convert` of a raw source into a region of the qcow2 export (faults there) and
  into the NBD export; a convert that returned 0 is compared with its source.
- ledger writers, one with O_DIRECT pwrite + fdatasync and one with mmap + msync (a child
  process each: a killed daemon makes an mmap access SIGBUS): every block written carries
  its number and generation; once a sync returned 0 the generations it covers are the
  block's only allowed contents (besides those written after it).
At the end (a clean restart with no faults, then SIGTERM): every block of the ledgers and
every convert that completed reads back as written (the qcow2 image read by qemu-img, not
by corofuse), `qemu-img check` is clean, no daemon, mount or loop device is left.

Usage: soak.py [--minutes 20] [--corofuse PATH] [--dir DIR] [--seed N] [--nbdkit-every 20-60]
Prints a summary (operations, faults fired, restarts, errors, verification) and writes it
as JSON to DIR/summary.json. Needs root, /dev/fuse, fio, qemu-img, nbdkit, mkfs.ext4.
"""

import argparse
import hashlib
import json
import mmap
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

MIB = 1 << 20
BLOCK = 4096
IMAGE = 512 * MIB
# Regions of the qcow2 export (guest bytes).
FIO = (0, 128 * MIB)
PWRITE = (128 * MIB, 32 * MIB)
MMAP = (160 * MIB, 32 * MIB)
CONVERT = (256 * MIB, 64 * MIB)
# The NBD export: a convert target, then a ledger region.
NBD_SIZE = 96 * MIB
NBD_CONVERT = (0, 64 * MIB)
NBD_PWRITE = (64 * MIB, 32 * MIB)
FAULTS = (
    f"write@{PWRITE[0]}-{MMAP[0] + MMAP[1]}:EIO:1/300,"
    f"write@{PWRITE[0]}-{MMAP[0] + MMAP[1]}:ENOSPC:1/400,"
    f"write@{CONVERT[0]}-{CONVERT[0] + CONVERT[1]}:EIO:1/3000,"
    "flush:EIO:1/60,"
    "delay:any:2ms:1/200"
)


def block_bytes(block, gen):
    """What generation `gen` of block `block` holds: a header, then bytes from both."""
    head = b"SOAK" + block.to_bytes(8, "little") + gen.to_bytes(8, "little")
    body = hashlib.shake_128(head).digest(BLOCK - len(head))
    return head + body


def parse_block(data):
    """(block, gen) if `data` is some generation of some block, else None."""
    if data[:4] != b"SOAK":
        return None
    block = int.from_bytes(data[4:12], "little")
    gen = int.from_bytes(data[12:20], "little")
    return (block, gen) if data == block_bytes(block, gen) else None


# ---------------------------------------------------------------- the client processes


def client_main(args):
    """A ledger writer (run as a child): prints `w BLOCK GEN` before each write and `c`
    after each sync that returned 0; exits on the first error, printing `e WHAT`."""
    rng = random.Random(args.seed)
    base, length, gen = args.offset, args.length, args.gen
    blocks = length // BLOCK
    out = sys.stdout
    try:
        if args.mode == "pwrite":
            fd = os.open(args.path, os.O_RDWR | os.O_DIRECT)
            buf = mmap.mmap(-1, BLOCK)
        else:
            fd = os.open(args.path, os.O_RDWR)
            buf = mmap.mmap(fd, length, offset=base)
        while True:
            for _ in range(rng.randint(1, 16)):
                gen += 1
                b = rng.randrange(blocks)
                data = block_bytes(base // BLOCK + b, gen)
                out.write(f"w {b} {gen}\n")
                out.flush()
                if args.mode == "pwrite":
                    buf[:] = data
                    if os.pwritev(fd, [buf], base + b * BLOCK) != BLOCK:
                        raise OSError("short write")
                else:
                    buf[b * BLOCK:(b + 1) * BLOCK] = data
            if args.mode == "pwrite":
                os.fdatasync(fd)
            else:
                buf.flush()  # msync(MS_SYNC)
            out.write("c\n")
            out.flush()
    except OSError as e:
        out.write(f"e {e.strerror or e}\n")
        out.flush()
        sys.exit(1)


class Ledger:
    """What each block of a region may hold: the generation of its last synced write and
    those written after it (not synced yet, or failed: either may be there)."""

    def __init__(self, name, path_of, offset, length):
        self.name, self.path_of, self.offset, self.length = name, path_of, offset, length
        self.allowed = {}  # block -> set of generations
        self.since_sync = {}  # block -> generations written since the last sync
        self.writes = self.syncs = self.errors = 0
        self.gen = 0
        self.error_kinds = {}

    def line(self, text):
        parts = text.split()
        if not parts:
            return
        if parts[0] == "w":
            b, g = int(parts[1]), int(parts[2])
            self.gen = max(self.gen, g)
            self.writes += 1
            self.since_sync.setdefault(b, set()).add(g)
            self.allowed.setdefault(b, {0}).add(g)
        elif parts[0] == "c":
            self.syncs += 1
            for b, gens in self.since_sync.items():
                self.allowed[b] = {max(gens)}
            self.since_sync = {}
        elif parts[0] == "e":
            self.errors += 1
            what = " ".join(parts[1:])
            self.error_kinds[what] = self.error_kinds.get(what, 0) + 1

    def ended(self):
        """The child is gone: what it wrote since its last sync stays merely allowed."""
        self.since_sync = {}

    def verify(self, image_file, backing_file=None):
        """Checks every block written against `image_file` (a raw file of the disk)."""
        bad = []
        with open(image_file, "rb") as f:
            for b, gens in sorted(self.allowed.items()):
                f.seek(self.offset + b * BLOCK)
                data = f.read(BLOCK)
                got = parse_block(data)
                block = (self.offset // BLOCK) + b
                if got is not None and got[0] == block and got[1] in gens:
                    continue
                if 0 in gens and got is None and backing_file is not None:
                    with open(backing_file, "rb") as bf:
                        bf.seek(self.offset + b * BLOCK)
                        if bf.read(BLOCK) == data:
                            continue  # never synced, the old contents
                if 0 in gens and got is None and backing_file is None and data == bytes(BLOCK):
                    continue
                bad.append((b, sorted(gens)[-3:], got))
        return bad


# ---------------------------------------------------------------- the soak


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.dir = args.dir
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.up = threading.Event()  # the qcow2 export is mounted
        self.nbd_up = threading.Event()  # the NBD export is mounted
        self.events = []  # (time, what)
        self.counts = {}
        self.faults = {}
        self.delays = 0
        self.kills_at = []  # times of daemon kills
        self.converts = {}  # who -> the source of its last convert that compared equal
        self.daemon = self.nbd_daemon = self.nbdkit = None
        self.nbd_killer_done = threading.Event()  # its last restart is over
        self.nbdkit_stopped = threading.Event()  # the nbd killer's thread may end
        self.loop_dev = None
        self.t0 = time.monotonic()

    # -- small helpers
    def log(self, what):
        t = time.monotonic() - self.t0
        with self.lock:
            self.events.append((round(t, 1), what))
        print(f"[{t:7.1f}s] {what}", flush=True)

    def count(self, key, n=1):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def path(self, name):
        return os.path.join(self.dir, name)

    def run(self, *cmd, check=True, **kw):
        r = subprocess.run(cmd, capture_output=True, text=True, **kw)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
        return r

    # -- setup
    def setup(self):
        os.makedirs(self.dir, exist_ok=True)
        ext4_img = self.path("ext4.img")
        with open(ext4_img, "wb") as f:
            f.truncate(3 << 30)
        self.run("mkfs.ext4", "-q", "-F", ext4_img)
        self.loop_dev = self.run("losetup", "-f", "--show", ext4_img).stdout.strip()
        self.fs = self.path("ext4")
        os.makedirs(self.fs, exist_ok=True)
        self.run("mount", self.loop_dev, self.fs)
        self.log(f"ext4 on {self.loop_dev} at {self.fs}")
        self.backing = os.path.join(self.fs, "backing.raw")
        with open(self.backing, "wb") as f:
            f.truncate(IMAGE)
            for i in range(0, IMAGE, 4 * MIB):  # data in every other 4 MiB
                if (i // (4 * MIB)) % 2 == 0:
                    f.seek(i)
                    f.write(hashlib.shake_128(i.to_bytes(8, "little")).digest(4 * MIB))
        self.image = os.path.join(self.fs, "disk.qcow2")
        self.run("qemu-img", "create", "-q", "-f", "qcow2", "-o",
                 f"compat=1.1,backing_file={self.backing},backing_fmt=raw", self.image)
        self.sources = []
        for i in range(2):
            src = os.path.join(self.fs, f"source{i}.raw")
            with open(src, "wb") as f:
                for j in range(0, CONVERT[1], 4 * MIB):
                    f.write(hashlib.shake_128(bytes([i]) + j.to_bytes(8, "little")).digest(4 * MIB))
            self.sources.append(src)
        self.nbd_file = os.path.join(self.fs, "nbd.raw")
        with open(self.nbd_file, "wb") as f:
            f.truncate(NBD_SIZE)
        self.nbd_sock = self.path("nbd.sock")
        self.mnt = self.path("mnt-qcow2")
        self.nbd_mnt = self.path("mnt-nbd")
        for m in (self.mnt, self.nbd_mnt):
            open(m, "a").close()
            # Immutable: a client that opens the path while no export is mounted there
            # (between a kill and the restart) fails, instead of writing to this file.
            self.run("chattr", "+i", m)

    # -- the daemons
    def wait_mounted(self, mnt, proc, what):
        for _ in range(400):
            if any(line.split()[1] == mnt for line in open("/proc/mounts")):
                return
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"{what} not mounted after 20 s")

    def start_daemon(self, faults=True):
        cmd = [self.args.corofuse, "-q", "mount", self.image, self.mnt, "-w",
               "--format", "qcow2", "--stats", self.path("stats.json")]
        if faults:
            cmd += ["--inject", f"{FAULTS},seed={self.rng.randrange(1 << 30)}"]
        self.daemon = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.wait_mounted(self.mnt, self.daemon, "corofuse (qcow2)")
        self.up.set()

    def collect_stats(self):
        """Asks the daemon for its counters (SIGUSR1) and adds what fault injection did."""
        stats = self.path("stats.json")
        try:
            os.unlink(stats)
        except FileNotFoundError:
            pass
        self.daemon.send_signal(signal.SIGUSR1)
        for _ in range(40):
            time.sleep(0.05)
            try:
                with open(stats) as f:
                    inject = json.load(f).get("inject") or {}
                break
            except (FileNotFoundError, json.JSONDecodeError):
                continue
        else:
            self.log("no stats from the daemon before its kill")
            return
        with self.lock:
            for op, errnos in inject.get("faults_by_op", {}).items():
                for errno, n in errnos.items():
                    key = f"{op}:{errno}"
                    self.faults[key] = self.faults.get(key, 0) + n
            self.delays += inject.get("delays", 0)

    def stderr_lines(self, who, text):
        """Counts a daemon's log lines by their text (numbers masked)."""
        for line in text.strip().splitlines():
            self.count(f"{who} log: " + re.sub(r"0x[0-9a-f]+|\d+", "N", line)[:160])

    def umount_stale(self, mnt):
        self.run(self.args.corofuse, "-q", "umount", mnt, check=False)

    def kill_daemon(self):
        self.collect_stats()
        self.up.clear()
        with self.lock:
            self.kills_at.append(time.monotonic())
        self.daemon.send_signal(signal.SIGKILL)
        err = self.daemon.stderr.read()
        self.daemon.wait()
        self.stderr_lines("daemon", err)
        self.umount_stale(self.mnt)

    def start_nbdkit(self):
        self.nbdkit = subprocess.Popen(
            ["nbdkit", "-f", "-U", self.nbd_sock, "file", self.nbd_file],
            stderr=subprocess.DEVNULL)
        for _ in range(200):
            if os.path.exists(self.nbd_sock):
                return
            time.sleep(0.02)
        raise RuntimeError("nbdkit did not start")

    def start_nbd_daemon(self):
        uri = f"nbd+unix:///?socket={self.nbd_sock}"
        self.nbd_daemon = subprocess.Popen(
            [self.args.corofuse, "-q", "mount", uri, self.nbd_mnt, "-w",
             "--reconnect-delay", "15"], stderr=subprocess.PIPE, text=True)
        self.wait_mounted(self.nbd_mnt, self.nbd_daemon, "corofuse (NBD)")
        self.nbd_up.set()

    # -- the chaos
    def killer(self):
        while not self.stop.wait(self.rng.uniform(30, 90)):
            self.kill_daemon()
            self.count("daemon SIGKILLs")
            self.log("daemon SIGKILLed")
            time.sleep(self.rng.uniform(0.2, 2))
            self.start_daemon()
            self.log("daemon restarted (image repaired at open)")

    def nbd_killer(self):
        """Kills nbdkit now and then and starts it again. nbdkit asks for SIGTERM when its
        parent dies (PR_SET_PDEATHSIG), and Linux sends it when the *thread* that started
        it ends: so this thread lives on until nbdkit is stopped at the very end. (It used
        to end with the soak's clients: the last nbdkit quit under the NBD daemon's final
        flush, which got ESHUTDOWN or found no server: RELIABILITY.md, finding 3.)"""
        low, high = self.args.nbdkit_every
        try:
            self.nbd_restarts(low, high)
        finally:
            self.nbd_killer_done.set()
        self.nbdkit_stopped.wait()

    def nbd_restarts(self, low, high):
        while not self.stop.wait(self.rng.uniform(low, high)):
            self.nbdkit.send_signal(signal.SIGKILL)
            self.nbdkit.wait()
            self.count("nbdkit SIGKILLs")
            self.log("nbdkit SIGKILLed")
            time.sleep(self.rng.uniform(0.5, 3))
            try:
                os.unlink(self.nbd_sock)
            except FileNotFoundError:
                pass
            t = time.monotonic()
            self.start_nbdkit()
            took = time.monotonic() - t
            self.log(f"nbdkit restarted ({took:.2f} s to its socket)")
            if took > 5:
                self.count("nbdkit restarts taking over 5 s")

    # -- the clients
    def wait_up(self, up):
        """Waits for the export to be mounted; False once the soak stops."""
        while not self.stop.is_set():
            if up.wait(timeout=1):
                return True
        return False

    def killed_since(self, t):
        with self.lock:
            return any(k >= t for k in self.kills_at)

    def fio_client(self):
        n = 0
        while self.wait_up(self.up):
            n += 1
            t = time.monotonic()
            r = self.run(
                "fio", "--name=soak", f"--filename={self.mnt}", f"--offset={FIO[0]}",
                f"--size={FIO[1]}", "--rw=randwrite", "--bs=4k", "--direct=1",
                "--ioengine=io_uring", "--iodepth=16", "--verify=crc32c", "--do_verify=1",
                "--verify_fatal=1", "--verify_state_save=0", f"--randseed={n}", "--io_size=48M",
                "--output-format=json", check=False, timeout=600)
            ios = 0
            try:
                job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
                ios = job["write"]["total_ios"] + job["read"]["total_ios"]
            except (ValueError, KeyError, IndexError):
                pass
            self.count("fio I/Os", ios)
            verify_bad = re.search(r"verify.*(bad|fail|mismatch)|bad magic", r.stderr, re.I)
            if r.returncode == 0:
                self.count("fio runs verified")
            elif verify_bad and not self.killed_since(t):
                self.count("fio VERIFY FAILURES")
                self.log(f"fio verify failed with no kill during the run: {r.stderr[-1500:]}")
            else:
                self.count("fio runs cut by a kill or fault")
                self.note_error("fio", r.stderr)

    def note_error(self, who, text):
        m = re.findall(r"(Input/output error|Transport endpoint is not connected|"
                       r"No space left on device|No such device|Software caused connection "
                       r"abort|Connection refused|Bad address|Bus error)", text)
        kind = m[-1] if m else (text.strip().splitlines() or ["?"])[-1][:80]
        self.count(f"errors: {who}: {kind}")

    def ledger_client(self, ledger, mode, up):
        while self.wait_up(up):
            child = subprocess.Popen(
                [sys.executable, __file__, "client", "--mode", mode, "--path",
                 ledger.path_of, "--offset", str(ledger.offset), "--length",
                 str(ledger.length), "--gen", str(ledger.gen),
                 "--seed", str(self.rng.randrange(1 << 30))],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for text in child.stdout:
                ledger.line(text)
                if self.stop.is_set():
                    child.kill()
            rc = child.wait()
            ledger.ended()
            if rc < 0:
                ledger.errors += 1
                name = signal.Signals(-rc).name
                ledger.error_kinds[name] = ledger.error_kinds.get(name, 0) + 1
            time.sleep(0.2)

    def convert_client(self, who, mnt, region, up):
        i = 0
        while self.wait_up(up):
            i += 1
            src = self.sources[i % 2]
            target = (f"driver=raw,offset={region[0]},size={region[1]},file.driver=file,"
                      f"file.filename={mnt},file.locking=off")
            r = self.run("qemu-img", "convert", "-n", "-f", "raw", "-t", "none",
                         "--target-image-opts", src, target, check=False, timeout=600)
            with self.lock:
                self.converts[who] = None  # unknown until compared
            if r.returncode != 0:
                self.count(f"{who} converts failed")
                self.note_error(who, r.stderr)
                continue
            same = self.compare_after_convert(mnt, region, src, up)
            if same is None:
                self.count(f"{who} converts unread (export gone)")
            elif same:
                self.count(f"{who} converts done and compared")
                with self.lock:
                    self.converts[who] = src
            else:
                self.count(f"{who} CONVERT MISMATCHES")
                self.log(f"{who}: convert returned 0 and the export differs from {src}")

    def compare_after_convert(self, mnt, region, src, up):
        """Compares a region a convert returned 0 for with its source; a read cut by a
        daemon kill is done again once the export is back (the convert's flush made it
        durable: a kill after it must lose nothing)."""
        for _ in range(5):
            t = time.monotonic()
            same = self.compare(mnt, region, src)
            if same or not self.killed_since(t):
                return same
            self.count("compares cut by a kill, done again")
            if not self.wait_up(up):
                return None
        return None

    def compare(self, path, region, src):
        """Whether `region` of `path` holds `src`; None if it cannot be read.

        In a child (`cmp`), never here: this process must hold no descriptor on a mount.
        A fork/exec (nbdkit restarted, a daemon, a client) closes its copy of each one, and
        each close is a FUSE FLUSH, an NBD flush on the NBD export, which waits for the
        server -- the very nbdkit that exec may be starting: the exec hung until the
        `--reconnect-delay` ran out and the requests waiting failed with EIO (RELIABILITY.md,
        finding 2)."""
        r = subprocess.run(["cmp", "-s", f"--ignore-initial={region[0]}:0",
                            f"--bytes={region[1]}", path, src],
                           stderr=subprocess.DEVNULL, check=False)
        return {0: True, 1: False}.get(r.returncode)

    # -- the end
    def finish(self, threads):
        self.stop.set()
        self.log("stopping the clients")
        for t in threads:
            t.join(timeout=120)
        self.kill_daemon_cleanly()
        self.log("restart without faults, then SIGTERM")
        self.start_daemon(faults=False)
        self.daemon.send_signal(signal.SIGTERM)
        rc = self.daemon.wait(timeout=60)
        self.stderr_lines("daemon", self.daemon.stderr.read())
        self.count("final daemon exit status", rc)
        self.nbd_daemon.send_signal(signal.SIGTERM)
        self.count("final NBD daemon exit status", self.nbd_daemon.wait(timeout=60))
        self.stderr_lines("NBD daemon", self.nbd_daemon.stderr.read())
        self.nbdkit.send_signal(signal.SIGTERM)
        self.nbdkit.wait(timeout=30)
        self.nbdkit_stopped.set()

    def kill_daemon_cleanly(self):
        self.collect_stats()
        self.daemon.send_signal(signal.SIGTERM)
        try:
            rc = self.daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            rc = self.daemon.wait()
        self.stderr_lines("daemon", self.daemon.stderr.read())
        self.count("daemon SIGTERM exit status (faults on)", rc)
        self.umount_stale(self.mnt)

    def verify(self, ledgers):
        result = {}
        check = self.run("qemu-img", "check", self.image, check=False)
        result["qemu-img check"] = {"status": check.returncode,
                                    "output": check.stdout.strip().splitlines()[-3:]}
        raw = self.path("final.raw")
        self.run("qemu-img", "convert", "-O", "raw", "-f", "qcow2", self.image, raw)
        for ledger in ledgers:
            image = raw if ledger.path_of == self.mnt else self.nbd_file
            backing = self.backing if ledger.path_of == self.mnt else None
            bad = ledger.verify(image, backing)
            result[f"ledger {ledger.name}"] = {
                "blocks checked": len(ledger.allowed), "bad": len(bad),
                "first bad": [str(x) for x in bad[:5]]}
        for who, (image, region) in {"convert-qcow2": (raw, CONVERT),
                                     "convert-nbd": (self.nbd_file, NBD_CONVERT)}.items():
            src = self.converts.get(who)
            if src is None:
                result[who] = "the last convert did not complete: not checked"
            else:
                result[who] = "identical" if self.compare(image, region, src) else "DIFFERS"
        os.unlink(raw)
        mounts = open("/proc/mounts").read()
        result["mounts left"] = [m for m in (self.mnt, self.nbd_mnt) if f" {m} " in mounts]
        return result

    def teardown(self):
        self.nbdkit_stopped.set()
        for p in (self.daemon, self.nbd_daemon, self.nbdkit):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        for m in (self.mnt, self.nbd_mnt):
            self.umount_stale(m)
            self.run("chattr", "-i", m, check=False)
        self.run("umount", self.fs, check=False)
        if self.loop_dev:
            self.run("losetup", "-d", self.loop_dev, check=False)

    def main(self):
        self.setup()
        try:
            self.start_nbdkit()
            self.start_nbd_daemon()
            self.start_daemon()
            ledgers = [Ledger("pwrite-qcow2", self.mnt, *PWRITE),
                       Ledger("mmap-qcow2", self.mnt, *MMAP),
                       Ledger("pwrite-nbd", self.nbd_mnt, *NBD_PWRITE)]
            work = [
                (self.fio_client, ()),
                (self.ledger_client, (ledgers[0], "pwrite", self.up)),
                (self.ledger_client, (ledgers[1], "mmap", self.up)),
                (self.ledger_client, (ledgers[2], "pwrite", self.nbd_up)),
                (self.convert_client, ("convert-qcow2", self.mnt, CONVERT, self.up)),
                (self.convert_client, ("convert-nbd", self.nbd_mnt, NBD_CONVERT, self.nbd_up)),
            ]
            threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in work]
            chaos = [threading.Thread(target=self.killer, daemon=True),
                     threading.Thread(target=self.nbd_killer, daemon=True)]
            for t in threads + chaos:
                t.start()
            deadline = self.t0 + self.args.minutes * 60
            while time.monotonic() < deadline:
                time.sleep(1)
            self.stop.set()
            chaos[0].join(timeout=120)
            self.nbd_killer_done.wait(timeout=120)
            self.finish(threads)
            chaos[1].join(timeout=30)
            result = self.verify(ledgers)
            for ledger in ledgers:
                self.count(f"{ledger.name} writes", ledger.writes)
                self.count(f"{ledger.name} syncs returned 0", ledger.syncs)
                for kind, n in ledger.error_kinds.items():
                    self.count(f"errors: {ledger.name}: {kind}", n)
        finally:
            self.teardown()
        summary = {
            "minutes": round((time.monotonic() - self.t0) / 60, 1),
            "seed": self.args.seed,
            "faults spec": FAULTS,
            "faults fired": self.faults,
            "delays fired": self.delays,
            "counts": dict(sorted(self.counts.items())),
            "verification": result,
            "loop devices left": self.run("losetup", "-j", self.path("ext4.img")).stdout.strip(),
        }
        with open(self.path("summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print(json.dumps(summary, indent=1))
        bad = (any(v["bad"] for k, v in result.items() if k.startswith("ledger"))
               or result["qemu-img check"]["status"] != 0 or result["mounts left"]
               or "DIFFERS" in result.values()
               or any("FAILURES" in k or "MISMATCHES" in k for k in self.counts))
        return 1 if bad else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd")
    c = sub.add_parser("client")
    c.add_argument("--mode", choices=["pwrite", "mmap"])
    c.add_argument("--path")
    c.add_argument("--offset", type=int)
    c.add_argument("--length", type=int)
    c.add_argument("--gen", type=int)
    c.add_argument("--seed", type=int)
    p.add_argument("--minutes", type=float, default=20)
    p.add_argument("--corofuse", default="corofuse")
    p.add_argument("--dir", default=f"/var/tmp/corofuse-soak-{os.getpid()}")
    p.add_argument("--seed", type=int, default=int(time.time()))
    p.add_argument("--nbdkit-every", type=lambda v: tuple(float(x) for x in v.split("-")),
                   default=(20.0, 60.0), metavar="MIN-MAX",
                   help="seconds between nbdkit kills, drawn in [MIN, MAX] (default 20-60)")
    args = p.parse_args()
    if args.cmd == "client":
        client_main(args)
        return 0
    return Soak(args).main()


if __name__ == "__main__":
    sys.exit(main())
