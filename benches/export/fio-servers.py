#!/usr/bin/env python3
"""fio against several servers of one export, interleaved, as users measure: the referee
for corofuse's defaults (issue 19) and for FUSE passthrough (issue 20).

Suites (each a list of exports x workloads x servers; every server runs every cell once
per round, in an order reversed every other round, each on a freshly started daemon):

  defaults   null:1G, a 1 GiB tmpfs image and the lab's 2 GiB ext4 image (--direct):
             corofuse's default against its explicit configurations (--placement all,
             --queues 1, --transport uring, --dispatch threads:2), qemu-storage-daemon as
             packaged, and QEMU's multi-threaded FUSE export series on 1 and 2 iothreads
             ($QSD_SERIES); fio straight on the tmpfs and ext4 images as the limit.
  dir        a 1 GiB file in a directory on ext4: corofuse mount-dir (default, and
             --passthrough never), libfuse's passthrough_hp (its defaults, and
             --nopassthrough; $PASSTHROUGH_HP) and fio straight on the source file.
  image      the lab's ext4 image: corofuse mount -w, with and without --passthrough,
             buffered and --direct, and fio straight on the image (the device).

Prints one TSV line per run: round, export, workload, server, IOPS, daemon CPU us per
I/O (all the daemon's threads, /proc), fio's CPU %, p99 completion latency us. Medians
and ratios are left to the reader (BENCHMARKS.md shows how they were taken).

Needs root, fio, /dev/fuse; `cargo build --release -p corofuse` first ($COROFUSE to name
another binary). Turns the fuse module's enable_uring on for the run and restores it.
Stops only the daemons it started, and unmounts what they leave.

    benches/export/fio-servers.py defaults --rounds 2 --seconds 4
    benches/export/fio-servers.py dir --rounds 3 --seconds 5
    benches/export/fio-servers.py image --rounds 3 --seconds 4
    benches/export/fio-servers.py defaults --only randread-qd64 --servers 'corofuse,corofuse --queues 1'
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COROFUSE = os.environ.get('COROFUSE', os.path.join(HERE, '../../target/release/corofuse'))
QSD = 'qemu-storage-daemon'
QSD_SERIES = os.environ.get('QSD_SERIES', '/work/peers/bin/qsd-series')
PASSTHROUGH_HP = os.environ.get('PASSTHROUGH_HP', '/work/peers/bin/passthrough_hp')
SCRATCH = '/dev/shm/fio-servers'
EXT4_IMAGE = '/var/tmp/corofuse-bench/corofuse-bench.raw'
DIR_SOURCE = '/var/tmp/fio-servers/src'
ENABLE_URING = '/sys/module/fuse/parameters/enable_uring'

WORKLOADS = {
    'randread-psync-qd1': '--rw=randread --ioengine=psync --iodepth=1',
    'randwrite-psync-qd1': '--rw=randwrite --ioengine=psync --iodepth=1',
    'randread-qd64': '--rw=randread --ioengine=io_uring --iodepth=64',
    'randwrite-qd64': '--rw=randwrite --ioengine=io_uring --iodepth=64',
    'write1m-qd4': '--rw=randwrite --ioengine=io_uring --iodepth=4 --bs=1m',
    'read1m-qd4': '--rw=read --ioengine=io_uring --iodepth=4 --bs=1m',
    'write1m-16jobs-qd64': '--rw=randwrite --ioengine=io_uring --iodepth=64 --bs=1m --numjobs=16',
    'randread-qd64-2jobs': '--rw=randread --ioengine=io_uring --iodepth=64 --numjobs=2',
    'randwrite-qd64-2jobs': '--rw=randwrite --ioengine=io_uring --iodepth=64 --numjobs=2',
    'randread-psync-qd1-2jobs': '--rw=randread --ioengine=psync --iodepth=1 --numjobs=2',
}


class Server:
    """One server of a cell: `command(mountpoint)` starts it (None: fio straight on
    `direct`, no FUSE); `fuse_unmount` stops it by unmounting (passthrough_hp)."""

    def __init__(self, name, command=None, fuse_unmount=False):
        self.name, self.command, self.fuse_unmount = name, command, fuse_unmount


def corofuse(name, spec, *args, sub='mount'):
    extra = ['-w'] if sub == 'mount' else []
    return Server(name, lambda mnt: [COROFUSE, sub, *extra, spec, mnt, *args])


def qsd(name, program, blockdev, iothreads=0):
    def command(mnt):
        cmd = [program, '--blockdev', blockdev]
        export = f'type=fuse,id=e,node-name=f,mountpoint={mnt},writable=on'
        for i in range(iothreads):
            cmd += ['--object', f'iothread,id=iot{i}']
            export += f',iothread.{i}=iot{i}'
        return cmd + ['--export', export]
    return Server(name, command)


def image_servers(spec, qsd_file, direct):
    opts = ['--direct'] if direct else []
    return [
        corofuse('corofuse', spec, *opts),
        corofuse('corofuse --placement all', spec, *opts, '--placement', 'all'),
        corofuse('corofuse --queues 1', spec, *opts, '--queues', '1'),
        corofuse('corofuse --transport uring', spec, *opts, '--transport', 'uring'),
        corofuse('corofuse --dispatch threads:2', spec, *opts, '--dispatch', 'threads:2'),
        qsd('qsd 10.0', QSD, qsd_file),
        qsd('series 1 iothread', QSD_SERIES, qsd_file, 1),
        qsd('series 2 iothreads', QSD_SERIES, qsd_file, 2),
    ]


def suite(name):
    """[(export, file the servers export or fio opens, [workloads], [servers], mount is a
    directory)]"""
    tmpfs = f'{SCRATCH}/image.raw'
    if name == 'defaults':
        null = 'node-name=f,driver=null-co,size=1073741824,read-zeroes=on'
        tmpfs_qsd = f'node-name=f,driver=file,filename={tmpfs},aio=io_uring'
        ext4_qsd = f'node-name=f,driver=file,filename={EXT4_IMAGE},aio=io_uring,cache.direct=on'
        four_k = ['randread-psync-qd1', 'randread-qd64', 'randwrite-qd64']
        return [
            ('null', None, four_k + ['write1m-qd4', 'randread-qd64-2jobs',
                                     'randwrite-qd64-2jobs', 'randread-psync-qd1-2jobs'],
             image_servers('null:1G', null, False), False),
            ('tmpfs', tmpfs, four_k + ['write1m-qd4'],
             image_servers(tmpfs, tmpfs_qsd, False) + [Server('limit')], False),
            ('ext4 --direct', EXT4_IMAGE, four_k,
             image_servers(EXT4_IMAGE, ext4_qsd, True) + [Server('limit')], False),
        ]
    if name == 'dir':
        servers = [
            corofuse('corofuse mount-dir', DIR_SOURCE, sub='mount-dir'),
            corofuse('corofuse --passthrough never', DIR_SOURCE, '--passthrough', 'never',
                     sub='mount-dir'),
            Server('passthrough_hp', lambda mnt: [PASSTHROUGH_HP, '--foreground',
                                                  DIR_SOURCE, mnt], fuse_unmount=True),
            Server('passthrough_hp --nopassthrough',
                   lambda mnt: [PASSTHROUGH_HP, '--foreground', '--nopassthrough',
                                DIR_SOURCE, mnt], fuse_unmount=True),
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
    sys.exit(f'unknown suite {name}: defaults, dir or image')


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


def fio(path, workload, seconds, size):
    args = ['fio', '--name=w', f'--filename={path}', '--direct=1', '--bs=4k',
            f'--runtime={seconds}', '--time_based', '--group_reporting',
            '--output-format=json', f'--size={size}'] + WORKLOADS[workload].split()
    out = subprocess.run(args, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f'fio failed: {out.stderr.strip()}')
    job = json.loads(out.stdout[out.stdout.index('{'):])['jobs'][0]
    side = job['read'] if job['read']['iops'] >= job['write']['iops'] else job['write']
    p99 = side['clat_ns']['percentile'].get('99.000000', 0) / 1000
    return job['read']['iops'] + job['write']['iops'], job['usr_cpu'] + job['sys_cpu'], p99


def run_server(server, mnt, target, workload, seconds, size):
    """(IOPS, daemon CPU us per I/O or None, fio CPU %, p99 us), or None if it did not
    mount."""
    if server.command is None:
        iops, fcpu, p99 = fio(target, workload, seconds, size)
        return iops, None, fcpu, p99
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
        before = cpu_ticks(daemon.pid)
        path = f'{mnt}/{os.path.basename(target)}' if os.path.isdir(mnt) else mnt
        iops, fcpu, p99 = fio(path, workload, seconds, size)
        ticks = cpu_ticks(daemon.pid) - before
        return iops, ticks * 10000 / max(iops * seconds, 1), fcpu, p99
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


def prepare(rows):
    os.makedirs(SCRATCH, exist_ok=True)
    for _, target, _, _, _ in rows:
        if target is None or os.path.exists(target):
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        size = 2048 if target == EXT4_IMAGE else 1024
        subprocess.run(['dd', 'if=/dev/urandom', f'of={target}', 'bs=1M', f'count={size}',
                        'status=none'], check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('suite')
    p.add_argument('--rounds', type=int, default=2)
    p.add_argument('--seconds', type=int, default=4)
    p.add_argument('--only', help='comma-separated workloads or exports')
    p.add_argument('--servers', help='comma-separated server names (as printed)')
    args = p.parse_args()
    rows = suite(args.suite)
    prepare(rows)
    only = args.only.split(',') if args.only else None
    uring = open(ENABLE_URING).read().strip() if os.path.exists(ENABLE_URING) else None
    if uring is not None:
        open(ENABLE_URING, 'w').write('Y')
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
                size = '1g' if directory or export != 'ext4 --direct' else '2g'
                for workload in workloads:
                    if only and workload not in only and export not in only:
                        continue
                    chosen = [x for x in servers if not args.servers
                              or x.name in args.servers.split(',') or x.name == 'limit']
                    order = chosen if r % 2 else list(reversed(chosen))
                    for server in order:
                        if server.name == 'limit' and r > 1:
                            continue
                        got = run_server(server, mnt, target, workload, args.seconds, size)
                        if got is None:
                            print(f'{r}\t{export}\t{workload}\t{server.name}\tFAILED', flush=True)
                            continue
                        iops, us, fcpu, p99 = got
                        us = '-' if us is None else f'{us:.2f}'
                        print(f'{r}\t{export}\t{workload}\t{server.name}\t{iops:.0f}\t{us}\t'
                              f'{fcpu:.0f}\t{p99:.0f}', flush=True)
    finally:
        if uring is not None:
            open(ENABLE_URING, 'w').write(uring)


if __name__ == '__main__':
    main()
