#!/usr/bin/env python3
"""fio against several servers of one export, interleaved, as users measure: the one way
corofuse is compared with its peers and with its own explicit configurations.

Suites (each a list of exports x workloads x servers; every server runs every cell once
per round, in an order reversed every other round, each on a freshly started daemon):

  defaults   null:1G, a 1 GiB tmpfs image and the lab's 2 GiB ext4 image (--direct):
             corofuse's default against its explicit configurations (--placement all,
             --queues 1, --transport uring, --dispatch threads:2), qemu-storage-daemon as
             packaged, and QEMU's multi-threaded FUSE export series on 1 and 2 iothreads
             ($QSD_SERIES, left out where it is not built; benches/export/build-series.sh
             builds it); fio straight on the tmpfs and ext4 images as the limit.
  clients    the same exports and servers (and qsd on one iothread), with 1, 2 and 4 fio
             jobs at iodepth 1 (psync) and 64 (io_uring) of 4 KiB random reads, and the
             mixed row: one qd1 randread job beside one qd64 randwrite job, each job's
             IOPS and p99 reported.
  dir        a 1 GiB file in a directory on ext4: corofuse mount-dir (default, and
             --passthrough never), libfuse's passthrough_hp (its defaults, and
             --nopassthrough; $PASSTHROUGH_HP) and fio straight on the source file.
  image      the lab's ext4 image: corofuse mount -w, with and without --passthrough,
             buffered and --direct, and fio straight on the image (the device).
  nbd        that image served by one qemu-nbd on a unix socket: corofuse's NBD client
             against qsd's driver=nbd, and fio's nbd engine straight at the same qemu-nbd
             as the limit.
  meta       metadata on a directory export of ext4: create, stat, ls -l and unlink of
             20,000 files (fio's filecreate, filestat and filedelete engines), corofuse
             mount-dir with the calls on the loop (--metadata on-loop, the default on a
             local source) and off it (off-loop), each in its own directory, a fresh
             mount per run.
  qcow2      a fresh empty 1 GiB qcow2 image on /var/tmp for every run, filled through
             the export: `qemu-img convert -t none` of 1 GiB (seconds, the result checked
             with `qemu-img compare`), 1 MiB sequential writes once through and 4 KiB
             random writes at qd64: corofuse, $COROFUSE_B (a second binary) and qsd.

Prints one TSV line per run (round, export, workload, server, IOPS or seconds, daemon CPU
us per I/O over all its threads from /proc, fio's CPU %, p99 completion latency us; the
mixed row one line per job), then a markdown table of the medians: IOPS (daemon CPU us
per I/O), with p99 on the iodepth-1 and mixed rows. `--from FILE...` prints that table
for the TSV lines of earlier runs instead (runs of one suite pooled: more rounds).

With $COROFUSE_B (a second binary, e.g. a build of the commit before a change) every
image suite also runs its default as the server "corofuse-b": an interleaved A/B.

Needs root, fio, /dev/fuse, qemu-storage-daemon (qemu-img and qemu-nbd for their suites);
`cargo build --release -p corofuse` first ($COROFUSE names another binary). Turns the fuse
module's enable_uring on for the run and restores it. Holds off a virtual machine's free
page reporting for the run and restores it, and where it was on, first touches the free
memory but 2 GiB once (~40 s; `machine_settings`: why). Stops only the daemons it started,
and unmounts what they leave.

    benches/export/fio-servers.py defaults --rounds 2 --seconds 4
    benches/export/fio-servers.py clients --rounds 2 --seconds 4
    benches/export/fio-servers.py defaults --only randread-qd64 --servers 'corofuse,corofuse --queues 1'
    benches/export/fio-servers.py clients --also '--readers 1' --servers 'corofuse,corofuse --readers 1'
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COROFUSE = os.environ.get('COROFUSE', os.path.join(HERE, '../../target/release/corofuse'))
COROFUSE_B = os.environ.get('COROFUSE_B')
QSD = 'qemu-storage-daemon'
QSD_SERIES = os.environ.get('QSD_SERIES', '/work/peers/bin/qsd-series')
PASSTHROUGH_HP = os.environ.get('PASSTHROUGH_HP', '/work/peers/bin/passthrough_hp')
SCRATCH = '/dev/shm/fio-servers'
EXT4_IMAGE = '/var/tmp/corofuse-bench/corofuse-bench.raw'
DIR_SOURCE = '/var/tmp/fio-servers/src'
QCOW2 = '/var/tmp/fio-servers/fill.qcow2'
FILL_SOURCE = '/var/tmp/fio-servers/fill.raw'
NBD_SOCKET = f'{SCRATCH}/nbd.sock'
NBD_URI = f'nbd+unix:///?socket={NBD_SOCKET}'
ENABLE_URING = '/sys/module/fuse/parameters/enable_uring'
# A guest's free page reporting (virtio-balloon): free blocks of 2^order pages go back to
# the host, which drops them. One above the buddy allocator's largest order (10): none is
# ever reported.
PAGE_REPORTING = '/sys/module/page_reporting/parameters/page_reporting_order'
NO_REPORTING_ORDER = '11'
# Free memory `machine_settings.warm` leaves untouched (as the lab's WARM_MARGIN).
WARM_MARGIN = 2 << 30

PSYNC_QD1 = '--ioengine=psync --iodepth=1'
URING_QD64 = '--ioengine=io_uring --iodepth=64'
WORKLOADS = {
    'randread-psync-qd1': f'--rw=randread {PSYNC_QD1}',
    'randwrite-psync-qd1': f'--rw=randwrite {PSYNC_QD1}',
    'randread-qd64': f'--rw=randread {URING_QD64}',
    'randwrite-qd64': f'--rw=randwrite {URING_QD64}',
    'write1m-qd4': '--rw=randwrite --ioengine=io_uring --iodepth=4 --bs=1m',
    'read1m-qd4': '--rw=read --ioengine=io_uring --iodepth=4 --bs=1m',
    'write1m-16jobs-qd64': f'--rw=randwrite {URING_QD64} --bs=1m --numjobs=16',
    'fill1m-qd4': '--rw=write --ioengine=io_uring --iodepth=4 --bs=1m --time_based=0',
    # The mixed row: two jobs, each its own reporting group.
    'mixed': f'--name=qd1-randread --rw=randread {PSYNC_QD1} '
             f'--name=qd64-randwrite --new_group --rw=randwrite {URING_QD64}',
}
for _jobs in (2, 4):
    for _name in ('randread-qd64', 'randwrite-qd64', 'randread-psync-qd1'):
        WORKLOADS[f'{_name}-{_jobs}jobs'] = f'{WORKLOADS[_name]} --numjobs={_jobs}'
# The meta suite: fio's file engines over this many files, and `ls -l` of them.
META_FILES = 20000
# In this order: ls -l lists what create and stat left, before unlink removes it.
META = {'create': 'filecreate', 'stat': 'filestat', 'ls-l': None, 'unlink': 'filedelete'}
# Options every fio run gets (--jobs).
EXTRA_FIO = []
# Rows whose p99 the summary shows beside the IOPS.
P99_ROWS = ('randread-psync-qd1', 'mixed')


class Server:
    """One server of a cell: `command(mountpoint)` starts it (None: fio straight on the
    export's file, no FUSE, or with `fio_args` instead of it); `fuse_unmount` stops it by
    unmounting (passthrough_hp); `fresh()` runs before every start (a new image)."""

    def __init__(self, name, command=None, fuse_unmount=False, fio_args=None, fresh=None):
        self.name, self.command, self.fuse_unmount = name, command, fuse_unmount
        self.fio_args, self.fresh = fio_args, fresh


def corofuse(name, spec, *args, sub='mount', binary=COROFUSE):
    extra = ['-w'] if sub == 'mount' else []
    return Server(name, lambda mnt: [binary, sub, *extra, spec, mnt, *args])


def qsd(name, program, blockdev, iothreads=0, listed=True):
    """qsd exporting `blockdev` (node f) on `iothreads` iothreads: the series' list form
    (iothread.K=...), or with `listed` False a release's single iothread=..."""
    def command(mnt):
        cmd = [program, '--blockdev', blockdev]
        export = f'type=fuse,id=e,node-name=f,mountpoint={mnt},writable=on'
        for i in range(iothreads):
            cmd += ['--object', f'iothread,id=iot{i}']
            export += f',iothread.{i}=iot{i}' if listed else f',iothread=iot{i}'
        return cmd + ['--export', export]
    return Server(name, command)


def file_node(path, direct=False):
    cache = ',cache.direct=on' if direct else ''
    return f'node-name=f,driver=file,filename={path},aio=io_uring{cache}'


def peers(blockdev, one_iothread=False):
    """qemu-storage-daemon as packaged (and on one iothread), then the series if built."""
    found = [qsd('qsd 10.0', QSD, blockdev)]
    if one_iothread:
        found.append(qsd('qsd 1 iothread', QSD, blockdev, 1, listed=False))
    if os.access(QSD_SERIES, os.X_OK):
        found += [qsd('series 1 iothread', QSD_SERIES, blockdev, 1),
                  qsd('series 2 iothreads', QSD_SERIES, blockdev, 2)]
    return found


# Further corofuse configurations for the image suites (`--also`), e.g. a candidate default.
ALSO = []


def image_servers(spec, blockdev, direct, one_iothread=False):
    opts = ['--direct'] if direct else []
    explicit = [['--placement', 'all'], ['--queues', '1'], ['--transport', 'uring'],
                ['--dispatch', 'threads:2']] + ALSO
    second = [corofuse('corofuse-b', spec, *opts, binary=COROFUSE_B)] if COROFUSE_B else []
    return ([corofuse('corofuse', spec, *opts)] + second
            + [corofuse(f'corofuse {" ".join(e)}', spec, *opts, *e) for e in explicit]
            + peers(blockdev, one_iothread))


def matrix(workloads, one_iothread):
    """The defaults and clients suites: null, tmpfs and ext4 --direct, every server."""
    tmpfs = f'{SCRATCH}/image.raw'
    null = 'node-name=f,driver=null-co,size=1073741824,read-zeroes=on'
    return [
        ('null', None, workloads('null'), image_servers('null:1G', null, False, one_iothread),
         False),
        ('tmpfs', tmpfs, workloads('tmpfs'),
         image_servers(tmpfs, file_node(tmpfs), False, one_iothread) + [Server('limit')],
         False),
        ('ext4 --direct', EXT4_IMAGE, workloads('ext4'),
         image_servers(EXT4_IMAGE, file_node(EXT4_IMAGE, True), True, one_iothread)
         + [Server('limit')], False),
    ]


def suite(name):
    """[(export, file the servers export or fio opens, [workloads], [servers], mount is a
    directory)]"""
    if name == 'defaults':
        four_k = ['randread-psync-qd1', 'randread-qd64', 'randwrite-qd64']
        null_more = ['write1m-qd4', 'randread-qd64-2jobs', 'randwrite-qd64-2jobs',
                     'randread-psync-qd1-2jobs']
        return matrix(lambda e: four_k + (null_more if e == 'null' else
                                          ['write1m-qd4'] if e == 'tmpfs' else []), False)
    if name == 'clients':
        rows = [f'{w}{j}' for w in ('randread-psync-qd1', 'randread-qd64')
                for j in ('', '-2jobs', '-4jobs')] + ['mixed']
        return matrix(lambda e: rows, True)
    if name == 'dir':
        def hp(name, *opts):
            return Server(name, lambda mnt: [PASSTHROUGH_HP, '--foreground', *opts,
                                             DIR_SOURCE, mnt], fuse_unmount=True)
        servers = [
            corofuse('corofuse mount-dir', DIR_SOURCE, sub='mount-dir'),
            corofuse('corofuse --passthrough never', DIR_SOURCE, '--passthrough', 'never',
                     sub='mount-dir'),
            hp('passthrough_hp'), hp('passthrough_hp --nopassthrough', '--nopassthrough'),
            Server('source'),
        ]
        work = ['randread-psync-qd1', 'randwrite-psync-qd1', 'randread-qd64',
                'randwrite-qd64', 'write1m-16jobs-qd64']
        return [('ext4 dir', f'{DIR_SOURCE}/f', work, servers, True)]
    if name == 'image':
        servers = [
            corofuse('disk', EXT4_IMAGE), corofuse('disk --passthrough', EXT4_IMAGE,
                                                   '--passthrough'),
            corofuse('disk-direct', EXT4_IMAGE, '--direct'),
            corofuse('disk-direct --passthrough', EXT4_IMAGE, '--direct', '--passthrough'),
            Server('device'),
        ]
        work = ['randread-psync-qd1', 'randread-qd64', 'randwrite-qd64', 'read1m-qd4']
        return [('ext4 image', EXT4_IMAGE, work, servers, False)]
    if name == 'nbd':
        node = f'node-name=f,driver=nbd,server.type=unix,server.path={NBD_SOCKET}'
        servers = [corofuse('corofuse', NBD_URI), qsd('qsd driver=nbd', QSD, node),
                   Server('limit', fio_args=['--ioengine=nbd', f'--uri={NBD_URI}'])]
        work = ['randread-psync-qd1', 'randwrite-psync-qd1', 'randread-qd64',
                'randwrite-qd64', 'write1m-qd4', 'read1m-qd4']
        return [('nbd', None, work, servers, False)]
    if name == 'meta':
        return [(f'meta {where}', f'{DIR_SOURCE}/{where}', list(META),
                 [corofuse(f'--metadata {where}', DIR_SOURCE, '--metadata', where,
                           sub='mount-dir')], True) for where in ('on-loop', 'off-loop')]
    if name == 'qcow2':
        def fresh():
            subprocess.run(['qemu-img', 'create', '-q', '-f', 'qcow2', QCOW2, '1G'], check=True)
        node = f'node-name=f,driver=qcow2,file.driver=file,file.filename={QCOW2},file.aio=io_uring'
        servers = [corofuse('corofuse', QCOW2)]
        if COROFUSE_B:
            servers.append(corofuse('corofuse-b', QCOW2, binary=COROFUSE_B))
        servers.append(qsd('qsd 10.0', QSD, node))
        for server in servers:
            server.fresh = fresh
        return [('qcow2', None, ['convert', 'fill1m-qd4', 'randwrite-qd64'], servers, False)]
    sys.exit(f'unknown suite {name}: defaults, clients, dir, image, nbd, meta or qcow2')


def mounted(mnt):
    with open('/proc/mounts') as f:
        return any(line.split()[1] == mnt for line in f)


def cpu_ticks(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            fields = f.read().rsplit(')', 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0


def fio(path, workload, seconds, size, extra=()):
    """(total IOPS, fio's CPU %, [(job group, IOPS, p99 us)], I/Os done)"""
    if workload == 'convert':
        return convert(path)
    if workload in META:
        return meta(path, workload)
    job = WORKLOADS[workload]
    args = ['fio', f'--filename={path}', '--direct=1', '--bs=4k', f'--runtime={seconds}',
            '--time_based', '--group_reporting', '--output-format=json', f'--size={size}',
            *([] if job.startswith('--name=') else ['--name=w']), *job.split(), *extra,
            *EXTRA_FIO]
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f'fio failed: {out.stderr.strip()}')
    return fio_result(out.stdout)


def fio_result(stdout):
    groups, fcpu, ios = [], 0, 0
    for job in json.loads(stdout[stdout.index('{'):])['jobs']:
        side = job['read'] if job['read']['iops'] >= job['write']['iops'] else job['write']
        p99 = side['clat_ns'].get('percentile', {}).get('99.000000', 0) / 1000
        groups.append((job['jobname'], job['read']['iops'] + job['write']['iops'], p99))
        fcpu += job['usr_cpu'] + job['sys_cpu']
        ios += job['read']['total_ios'] + job['write']['total_ios']
    return sum(g[1] for g in groups), fcpu, groups, ios


def meta(path, workload):
    """One metadata row on the directory `path`: fio's file engine, or `ls -l` timed."""
    os.makedirs(path, exist_ok=True)
    if META[workload] is None:
        start = time.monotonic()
        listed = subprocess.run(['ls', '-l', path], capture_output=True, check=True)
        entries = listed.stdout.count(b'\n') - 1
        rate = entries / (time.monotonic() - start)
        return rate, 0, [('w', rate, 0)], entries
    out = subprocess.run(['fio', '--name=w', f'--ioengine={META[workload]}',
                          f'--directory={path}', f'--nrfiles={META_FILES}', '--filesize=4k',
                          '--openfiles=1', '--output-format=json'],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f'fio failed: {out.stderr.strip()}')
    return fio_result(out.stdout)


def convert(path):
    """`qemu-img convert -t none` of FILL_SOURCE into the export: (seconds, 0, check,
    1e6 I/Os: the daemon's CPU is then given in seconds)."""
    start = time.monotonic()
    subprocess.run(['qemu-img', 'convert', '-n', '-f', 'raw', '-O', 'raw', '-t', 'none',
                    FILL_SOURCE, path], check=True)
    took = time.monotonic() - start
    same = subprocess.run(['qemu-img', 'compare', '-q', '-f', 'raw', FILL_SOURCE, path])
    return took, 0, [('identical' if same.returncode == 0 else 'CORRUPT', took, 0)], 1e6


def run_server(server, mnt, target, workload, seconds, size):
    """(IOPS, daemon CPU us per I/O or None, fio CPU %, [(job group, IOPS, p99 us)]), or
    None if it did not mount. A workload `A>B` runs A first on the same daemon and
    measures B only (a server's state carried from one job to the next)."""
    if server.fresh:
        server.fresh()
    if server.command is None:
        path = 'nbd' if server.fio_args else target
        iops, fcpu, groups, _ = fio(path, workload, seconds, size, server.fio_args or ())
        return iops, None, fcpu, groups
    log = open(f'{SCRATCH}/daemon.log', 'w')
    daemon = subprocess.Popen(server.command(mnt), stdout=subprocess.DEVNULL, stderr=log)
    try:
        for _ in range(1000):
            if mounted(mnt) or daemon.poll() is not None:
                break
            time.sleep(0.01)
        if not mounted(mnt):
            return None
        time.sleep(0.1)
        path = f'{mnt}/{os.path.basename(target)}' if os.path.isdir(mnt) else mnt
        *earlier, workload = workload.split('>')
        for lead in earlier:
            fio(path, lead, seconds, size)
        before = cpu_ticks(daemon.pid)
        iops, fcpu, groups, ios = fio(path, workload, seconds, size)
        ticks = cpu_ticks(daemon.pid) - before
        return iops, ticks * 10000 / max(ios, 1), fcpu, groups
    finally:
        if daemon.poll() is None:
            if server.fuse_unmount and mounted(mnt):
                subprocess.run(['umount', mnt])
            else:
                daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        for _ in range(100):
            if not mounted(mnt):
                break
            time.sleep(0.02)
        if mounted(mnt):
            subprocess.run(['umount', '-l', mnt])


class machine_settings:
    """The run's kernel settings, restored at the end: the fuse module's enable_uring on
    (`--transport uring`), and a guest's free page reporting held off.

    Why the second (issue 37): on a VM with free page reporting, memory freed by
    `drop_caches` or an ended run goes back to the host within milliseconds, and the next
    writer faults every page back in from the host: 1 MiB buffered writes into ext4 fell
    from 6,000-8,000 to 350-410 IOPS with 4 ms of daemon CPU each (`perf`:
    copy_folio_from_iter_atomic 51%, the other writer spinning on the inode lock 19%), for
    whichever server ran first after a 2 GiB run, explicit configurations and fio straight
    on the file alike. That is the host's cost, not the server's; held off, the same
    sequence serves 6,000-8,000 for every server. Then `warm` touches the free memory the
    idle VM had already reported, once, so that the first run does not pay for it either."""

    def __enter__(self):
        self.saved = {}
        for path, value in ((ENABLE_URING, 'Y'), (PAGE_REPORTING, NO_REPORTING_ORDER)):
            if os.path.exists(path):
                before = open(path).read().strip()
                try:
                    open(path, 'w').write(value)
                    self.saved[path] = before
                except OSError as e:
                    print(f'# cannot set {path} to {value}: {e}', flush=True)
        if PAGE_REPORTING in self.saved:
            print(f'# free page reporting held off for the run (order '
                  f'{self.saved[PAGE_REPORTING]} -> {NO_REPORTING_ORDER})', flush=True)
        elif os.path.exists(PAGE_REPORTING):
            print('# free page reporting stays on: buffered rows may pay host page faults',
                  flush=True)
        return self

    def warm(self):
        """Touches the machine's free memory but WARM_MARGIN once and frees it, when free
        page reporting was found on and held off (as `lab::setting::warm_free_memory`):
        what the idle guest reported before the run is gone from the host, and the first
        buffered writer would fault it back in. Touching 4 GiB was not enough (the first
        1 MiB writer after idle: 602 IOPS), all free memory was (6,195). It costs the
        host's faults once: 40-45 s for 17.5 GiB on this VM."""
        if self.saved.get(PAGE_REPORTING, NO_REPORTING_ORDER) == NO_REPORTING_ORDER:
            return
        size = warm_size()
        if size == 0:
            return
        print(f'# touching {size >> 20} MiB of free memory once, which the host took back '
              f'while this VM was idle (free page reporting), so that no run pays for it ...',
              flush=True)
        import mmap
        start = time.monotonic()
        try:
            area = mmap.mmap(-1, size)
        except OSError as e:
            print(f'# cannot take it ({e}): the first buffered rows may pay host page faults',
                  flush=True)
            return
        for offset in range(0, size, mmap.PAGESIZE):
            area[offset] = 1
        area.close()
        print(f'# touched in {time.monotonic() - start:.1f} s', flush=True)

    def __exit__(self, *exc):
        for path, before in self.saved.items():
            open(path, 'w').write(before)


def warm_size(meminfo='/proc/meminfo'):
    """Bytes `machine_settings.warm` touches: MemFree but WARM_MARGIN, 0 if no more."""
    with open(meminfo) as f:
        free_kib = next((int(line.split()[1]) for line in f if line.startswith('MemFree:')), 0)
    return max(free_kib * 1024 - WARM_MARGIN, 0)


def prepare(rows):
    os.makedirs(SCRATCH, exist_ok=True)
    for export, target, _, _, _ in rows:
        if export.startswith('meta'):
            os.makedirs(target, exist_ok=True)
            continue
        if export == 'qcow2':
            target = FILL_SOURCE
        elif export == 'nbd':
            target = EXT4_IMAGE
        if target is None or os.path.exists(target):
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        size = 2048 if target == EXT4_IMAGE else 1024
        subprocess.run(['dd', 'if=/dev/urandom', f'of={target}', 'bs=1M', f'count={size}',
                        'status=none'], check=True)


def start_nbd_server():
    """The nbd suite's qemu-nbd, serving the ext4 image until the suite ends."""
    if os.path.exists(NBD_SOCKET):
        os.remove(NBD_SOCKET)
    server = subprocess.Popen(
        ['qemu-nbd', '-f', 'raw', '-x', '', f'--socket={NBD_SOCKET}', '--persistent',
         '--shared=0', '--cache=writeback', '--aio=io_uring', EXT4_IMAGE],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(NBD_SOCKET):
            return server
        time.sleep(0.05)
    server.kill()
    sys.exit('qemu-nbd did not come up')


def summary(results, servers):
    """The medians as a markdown table: a row per export, workload (and job group)."""
    print(f'\n| export | workload | {" | ".join(servers)} |')
    print(f'|---|---|{"---|" * len(servers)}')
    for (export, workload, group), by_server in results.items():
        cells = []
        for name in servers:
            runs = by_server.get(name)
            if not runs:
                cells.append('')
                continue
            iops = statistics.median(r[0] for r in runs)
            cell = f'{iops / 1000:.1f}k' if iops >= 1000 else f'{iops:.2f}'
            cpu = [r[1] for r in runs if r[1] is not None]
            cell += f' ({statistics.median(cpu):.1f})' if cpu else ''
            if workload in P99_ROWS:
                cell += f' p99 {statistics.median(r[2] for r in runs):.0f}'
            cells.append(cell)
        label = f'{workload}: {group}' if group not in ('w', '') else workload
        print(f'| {export} | {label} | {" | ".join(cells)} |')


def pooled(files):
    """The results and server names (in order of appearance) of saved TSV lines."""
    results, names = {}, []
    for line in (line for f in files for line in open(f)):
        f = line.rstrip('\n').split('\t')
        if len(f) < 8 or not f[0].isdigit():
            continue
        workload, _, group = f[2].partition(':')
        us = None if f[5] == '-' else float(f[5])
        runs = results.setdefault((f[1], workload, group), {}).setdefault(f[3], [])
        runs.append((float(f[4]), us, float(f[7])))
        names += [f[3]] if f[3] not in names else []
    return results, names


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('suite')
    p.add_argument('--from', dest='saved', nargs='+', help='summarise these TSV files')
    p.add_argument('--rounds', type=int, default=2)
    p.add_argument('--seconds', type=int, default=4)
    p.add_argument('--only', help='comma-separated workloads or exports')
    p.add_argument('--servers', help='comma-separated server names (as printed)')
    p.add_argument('--jobs', type=int, default=1, help='fio jobs per run (--numjobs)')
    p.add_argument('--also', action='append', default=[], metavar='ARGS',
                   help="one more corofuse configuration of the image suites, named "
                        "'corofuse ARGS' (repeatable), e.g. --also '--readers 1'")
    args = p.parse_args()
    ALSO.extend(a.split() for a in args.also)
    if args.jobs > 1:
        EXTRA_FIO.append(f'--numjobs={args.jobs}')
    if args.saved:
        return summary(*pooled(args.saved))
    rows = suite(args.suite)
    prepare(rows)
    only = args.only.split(',') if args.only else None
    with machine_settings() as settings:
        settings.warm()
        results, names = run_rounds(args, rows, only)
    summary(results, names)


def warm_disk(path):
    """Reads the disk image once, O_DIRECT, before its first measured run: the first
    server to read it cold paid for the host's disk (2026-12-06: 883 IOPS and a p99 of
    16 ms for psync qd1 where the same server made 11,030 in the next round), and the
    first server of round 1 is always the same one."""
    start = time.monotonic()
    subprocess.run(['fio', '--name=warm', f'--filename={path}', '--rw=read', '--bs=1m',
                    '--direct=1', '--ioengine=io_uring', '--iodepth=8',
                    '--output=/dev/null'], check=True)
    print(f'# read {path} once to warm the disk ({time.monotonic() - start:.1f} s)',
          flush=True)


def run_rounds(args, rows, only):
    """Every round of the suite: {cell: {server: [(IOPS, CPU, p99)]}}, server names."""
    nbd = start_nbd_server() if args.suite == 'nbd' else None
    results, names = {}, []
    try:
        for r in range(1, args.rounds + 1):
            for export, target, workloads, servers, directory in rows:
                mnt = f'{SCRATCH}/mnt'
                if directory and not os.path.isdir(mnt):
                    if os.path.exists(mnt):
                        os.remove(mnt)
                    os.mkdir(mnt)
                elif not directory:
                    if os.path.isdir(mnt):
                        os.rmdir(mnt)
                    open(mnt, 'a').close()
                size = '2g' if target == EXT4_IMAGE or export == 'nbd' else '1g'
                if r == 1 and target == EXT4_IMAGE:
                    warm_disk(target)
                for workload in workloads:
                    if only and workload not in only and export not in only:
                        continue
                    chosen = [x for x in servers if not args.servers
                              or x.name in args.servers.split(',') or x.name == 'limit']
                    names += [x.name for x in chosen if x.name not in names]
                    for server in chosen if r % 2 else list(reversed(chosen)):
                        if server.name == 'limit' and r > 1:
                            continue
                        got = run_server(server, mnt, target, workload, args.seconds, size)
                        if got is None:
                            print(f'{r}\t{export}\t{workload}\t{server.name}\tFAILED', flush=True)
                            continue
                        _, us, fcpu, groups = got
                        shown = '-' if us is None else f'{us:.2f}'
                        for group, iops, p99 in groups:
                            key = (export, workload, group if len(groups) > 1 else '')
                            results.setdefault(key, {}).setdefault(server.name, []).append(
                                (iops, us, p99))
                            tag = f'{workload}:{group}' if group != 'w' else workload
                            print(f'{r}\t{export}\t{tag}\t{server.name}\t{iops:.0f}\t'
                                  f'{shown}\t{fcpu:.0f}\t{p99:.0f}', flush=True)
    finally:
        if nbd is not None:
            nbd.send_signal(signal.SIGTERM)
            nbd.wait()
    return results, names


if __name__ == '__main__':
    main()
