#!/usr/bin/env python3
"""Splits a `perf record --call-graph dwarf` profile of `examples/cycle_profile.rs` by where
each sample ran (the cycling tasks, the connection's driver task, the runtime) and by the code
at its leaf (lock-core, tokio, redis, malloc, the kernel, ...), in microseconds per cycle.

    perf record -e cpu-clock -F 4000 --call-graph dwarf,16384 -o kit.data \\
        target/release/examples/cycle_profile kit 64 1000
    perf script -i kit.data -F comm,tid,ip,sym > kit.txt
    python3 lock-bench/tools/perf_split.py kit.txt 64000 4000

Arguments: the `perf script` output, the cycles of the run (tasks x cycles per task), the
sampling frequency. Build the example with line tables
(`CARGO_PROFILE_RELEASE_DEBUG=line-tables-only`) so that inlined steps have names.
"""
import collections
import re
import sys

MALLOC = ('_int_malloc', 'malloc', '_int_free', 'cfree', 'free', 'realloc', '_int_realloc',
          'unlink_chunk', 'malloc_consolidate', '__libc_malloc', '__libc_free', 'tcache')


def read_samples(path):
    """Each sample's frames, innermost first."""
    samples, frames = [], None
    for line in open(path):
        if not line.strip():
            if frames:
                samples.append(frames)
            frames = None
        elif not line.startswith('\t'):
            frames = []
        elif frames is not None:
            parts = line.strip().split(' ', 1)
            frames.append(parts[1] if len(parts) > 1 else '?')
    if frames:
        samples.append(frames)
    return samples


def where(frames):
    """The task a sample ran in."""
    chain = ' | '.join(frames)
    if 'cycle_profile::main::' in chain and ('{closure#4}' in chain or '{{closure}}::{{closure}}' in chain):
        return 'the cycling tasks'
    if 'multiplexed_connection' in chain or 'connection_manager' in chain:
        return "the connection's driver task"
    if 'lock_core' in chain:
        return "lock-core's background tasks"
    if 'park' in chain or 'Parker' in chain or 'epoll' in chain or 'Driver::turn' in chain:
        return 'the runtime parked or polling the socket'
    if 'execve' in chain:
        return 'start-up'
    return 'the runtime, other'


def what(frames):
    """The code a sample's leaf belongs to."""
    leaf = frames[0]
    if leaf.startswith(MALLOC):
        return 'malloc/free'
    if 'memmove' in leaf or 'memcpy' in leaf or 'memset' in leaf:
        return 'memcpy'
    chain = ' '.join(frames)
    if 'entry_SYSCALL' in chain or 'asm_' in chain or leaf.startswith('finish_task_switch'):
        return 'kernel'
    if leaf.startswith('__vdso'):
        return 'clock'
    for frame in frames:
        if '(inlined)' in frame:
            continue
        if 'lock_core' in frame or 'poll_fn::PollFn' in frame:
            return 'lock-core'
        if 'floor::' in frame:
            return "the floor's functions"
        if frame.startswith(('redis::', '<redis::', 'combine', '<combine')):
            return 'redis'
        if 'tokio' in frame:
            return 'tokio'
        break
    return 'other'


def module(frames):
    """The lock-core module of a lock-core sample: the innermost frame that names one."""
    for frame in frames:
        found = re.search(r'lock_core::([a-z_]+(?:::[a-z_]+)?)', frame)
        if found:
            return found.group(1)
    return '(unnamed)'


def main():
    path, cycles, hz = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    samples = read_samples(path)
    per_cycle = lambda n: n / hz * 1e6 / cycles
    by_where, by_both, by_module = (collections.Counter() for _ in range(3))
    for frames in samples:
        w, c = where(frames), what(frames)
        by_where[w] += 1
        by_both[(w, c)] += 1
        if w == 'the cycling tasks' and c == 'lock-core':
            by_module[module(frames)] += 1
    print(f'in all: {per_cycle(len(samples)):.2f} us a cycle ({len(samples)} samples)')
    for w, n in by_where.most_common():
        parts = ', '.join(f'{c} {per_cycle(m):.2f}' for (ww, c), m in by_both.most_common() if ww == w)
        print(f'  {w}: {per_cycle(n):.2f} ({parts})')
    if by_module:
        print('  lock-core by module: ' + ', '.join(f'{m} {per_cycle(n):.2f}' for m, n in by_module.most_common()))


if __name__ == '__main__':
    main()
