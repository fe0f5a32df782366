"""The software recorder follows every thread, and with ``follow_fork`` every
child process: each thread's trace, decoded by hwtrace and by Linux perf
from the perf.data ``hwtrace record`` writes, lists exactly the
instructions the stepper saw that thread run.

A small C program (built with gcc) runs four threads, each a different
function of a few thousand instructions; or, attached to while its threads
wait, lets them go, starts another and has one end inside its traced
function; or forks (and execs itself) or spawns a child.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_record_software import SKIP, compile_program, expected_instructions

from hwtrace.cli.main import main as hwtrace_main
from hwtrace.pt.decode import decode_trace
from hwtrace.record import SoftwareRecording, record_software

pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))

PERF = "/usr/bin/perf" if os.access("/usr/bin/perf", os.X_OK) else shutil.which("perf")
needs_perf = pytest.mark.skipif(PERF is None, reason="perf is not installed (Debian: linux-perf)")

PROGRAM = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define NOINLINE __attribute__((noinline))

extern char **environ;
static volatile long sink[8];
static int gated;

/* Four different pieces of work, a few thousand instructions each. */
NOINLINE long work_a(long n) {
    long s = 1;
    for (long i = 0; i < n; i++)
        s = s * 31 + (i ^ (s >> 7));
    return s;
}
NOINLINE long work_b(long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += (i & 1) ? i * 3 : -(i >> 1);
    return s;
}
NOINLINE long fold(long x, long k) { return k == 0 ? x : fold((x * 7) ^ k, k - 1); }
NOINLINE long work_c(long n) {
    long s = 0;
    for (long i = 0; i < n / 8; i++)
        s += fold(i, 6);  /* untraced unless fold is */
    return s;
}
NOINLINE long work_d(long n) {
    char buf[64];
    long s = 0;
    for (long i = 0; i < n / 16; i++) {
        for (int j = 0; j < 16; j++)
            buf[j] = (char)('a' + (i + j) % 26);
        buf[16] = 0;
        s += (long)strlen(buf) + buf[i % 16];  /* libc, untraced */
    }
    return s;
}
/* Ends its thread inside the traced code: exit as a raw system call. */
NOINLINE void quit_early(long n) {
    sink[5] = work_b(n / 4);
    __asm__ volatile("syscall" : : "a"(60L), "D"(0L) : "rcx", "r11", "memory");
    for (;;) {}
}

static long (*const works[4])(long) = {work_a, work_b, work_c, work_d};

/* Threads that wait for each other: a mutex taken in turns (futex waits
 * inside the traced code when contended). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
NOINLINE void bump(long n) {
    for (long i = 0; i < n; i++) {
        pthread_mutex_lock(&mu);
        sink[6] += i;
        pthread_mutex_unlock(&mu);
    }
}
static void *bumper(void *arg) {
    (void)arg;
    bump(40);
    return NULL;
}

/* A thread killed while it is stepped: the process exits under it. */
static volatile int spinning;
NOINLINE void forever(void) {
    for (long i = 0;; i++) {
        if (i & 1)
            sink[7]++;
        if (i == 500)
            spinning = 1;
    }
}
static void *spinner(void *arg) {
    (void)arg;
    forever();
    return NULL;
}

/* Waits for a child; whether it exited with status 0. */
static int child_ok(pid_t pid) {
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void *run(void *arg) {
    long k = (long)arg;
    if (gated) {  /* wait for a byte on stdin */
        char c;
        if (read(0, &c, 1) != 1)
            _exit(3);
    }
    if (k == 4)
        quit_early(400);
    sink[k] = works[k](400);
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argv[1];
    pthread_t t[8];
    if (!strcmp(mode, "four")) {
        for (long k = 0; k < 4; k++)
            pthread_create(&t[k], NULL, run, (void *)k);
        for (int k = 0; k < 4; k++)
            pthread_join(t[k], NULL);
    } else if (!strcmp(mode, "attach")) {
        /* Two threads wait for a byte each; once main gets its own it
         * starts a third; the second ends early, in its traced code. */
        gated = 1;
        pthread_create(&t[0], NULL, run, (void *)0);
        pthread_create(&t[1], NULL, run, (void *)4);
        printf("ready\n");
        fflush(stdout);
        char c;
        if (read(0, &c, 1) != 1)
            return 3;
        gated = 0;
        pthread_create(&t[2], NULL, run, (void *)2);
        for (int k = 0; k < 3; k++)
            pthread_join(t[k], NULL);
    } else if (!strcmp(mode, "fork")) {
        /* A child that works, then execs this program to work again. */
        sink[0] = work_a(300);
        pid_t pid = fork();
        if (pid == 0) {
            sink[1] = work_b(300);
            execl(argv[0], argv[0], "solo", (char *)NULL);
            _exit(4);
        }
        if (!child_ok(pid))
            return 5;
        sink[3] = work_d(300);
    } else if (!strcmp(mode, "spawn")) {
        /* posix_spawn: a vfork-like child sharing memory until it execs. */
        sink[0] = work_a(300);
        pid_t pid;
        char *args[] = {argv[0], "solo", NULL};
        if (posix_spawn(&pid, argv[0], NULL, NULL, args, environ))
            return 6;
        if (!child_ok(pid))
            return 7;
        sink[3] = work_d(300);
    } else if (!strcmp(mode, "solo")) {
        sink[2] = work_c(300);
    } else if (!strcmp(mode, "mutex")) {
        for (long k = 0; k < 4; k++)
            pthread_create(&t[k], NULL, bumper, NULL);
        for (int k = 0; k < 4; k++)
            pthread_join(t[k], NULL);
    } else if (!strcmp(mode, "killed")) {
        pthread_create(&t[0], NULL, spinner, NULL);
        while (!spinning)
            sched_yield();
        exit(0);
    }
    printf("%ld %ld %ld %ld %ld\n", sink[0], sink[1], sink[2], sink[3], sink[5]);
    return 0;
}
"""

WORKS = ["work_a", "work_b", "work_c", "work_d", "quit_early"]


def build() -> Path:
    flags = ("-O1", "-g0", "-fno-omit-frame-pointer", "-fno-pie", "-no-pie", "-pthread")
    return compile_program(PROGRAM, "threads", flags)


def stepped(rec: SoftwareRecording) -> dict[int, np.ndarray]:
    """Per tid, what its stepped log says it ran (its traces in time order);
    each trace checked against its log and against hwtrace's decoder."""
    out: dict[int, list[np.ndarray]] = collections.defaultdict(list)
    for tr in rec.threads:
        want = expected_instructions(tr.log)
        assert np.array_equal(tr.instructions, want), tr.tid
        res = decode_trace(tr.data, rec.image(tr.image), rec.config)
        assert not res.gaps, [str(g) for g in res.gaps]
        assert np.array_equal(res.instructions(), want), tr.tid
        out[tr.tid].append(want)
    return {tid: np.concatenate(parts) for tid, parts in out.items()}


def perf_lists(path: Path) -> dict[int, np.ndarray]:
    """Per tid, the instructions ``perf script --itrace=i0ns`` lists."""
    out = subprocess.run(
        [PERF, "script", "-i", str(path), "--itrace=i0ns", "-F", "tid,ip"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    per: dict[int, list[int]] = collections.defaultdict(list)
    for line in out.stdout.splitlines():
        tid, ip = line.split()
        per[int(tid)].append(int(ip, 16))
    return {tid: np.array(ips, np.uint64) for tid, ips in per.items()}


def hwtrace_lists(path: Path, capsys) -> tuple[dict[int, np.ndarray], dict[int, set[str]]]:
    """Per tid, the instructions ``hwtrace script`` lists, and the names
    (comm) it gives the thread."""
    capsys.readouterr()
    assert hwtrace_main(["script", "-i", str(path)]) == 0
    per: dict[int, list[int]] = collections.defaultdict(list)
    comms: dict[int, set[str]] = collections.defaultdict(set)
    for line in capsys.readouterr().out.splitlines():
        comm, tid, _, ip = line.split()[:4]
        per[int(tid)].append(int(ip, 16))
        comms[int(tid)].add(comm)
    return {tid: np.array(ips, np.uint64) for tid, ips in per.items()}, comms


def same_lists(got: dict[int, np.ndarray], want: dict[int, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for tid, ips in want.items():
        assert got[tid].shape == ips.shape, (tid, got[tid].shape, ips.shape)
        assert np.array_equal(got[tid], ips), tid


def check_listings(
    path: Path, want: dict[int, np.ndarray], capsys, rec: SoftwareRecording | None = None
) -> dict[int, set[str]]:
    """``hwtrace script`` and ``perf script`` (when installed) on the
    perf.data at ``path`` (written from ``rec`` first, when given) list per
    thread exactly ``want``; the names hwtrace gives the threads."""
    if rec is not None:
        from hwtrace.record.perfdata import write_perf_data

        write_perf_data(rec, path)
    got, comms = hwtrace_lists(path, capsys)
    same_lists(got, want)
    if PERF is not None:
        same_lists(perf_lists(path), want)
    return comms


def record_cli(monkeypatch, args: list[str], path: Path) -> SoftwareRecording:
    """``hwtrace record`` (in this process); the recording it wrote, kept."""
    import hwtrace.record.perfdata as perfdata

    kept = []
    write = perfdata.write_perf_data

    def keep(rec, out, **options):
        kept.append(rec)
        write(rec, out, **options)

    monkeypatch.setattr(perfdata, "write_perf_data", keep)
    assert hwtrace_main(["record", "--backend", "step", "-o", str(path), *args]) == 0
    (rec,) = kept
    return rec


def first_function(rec: SoftwareRecording, ips: np.ndarray) -> str:
    """The traced function a thread's trace starts in."""
    start = int(ips[0])
    return next(r.name for r in rec.ranges if r.start <= start < r.end)


@pytest.mark.parametrize("option", ["-f", "--call"])
def test_four_threads(tmp_path, monkeypatch, capsys, option):
    """Four threads, each running a different function (traced as an address
    range, or each call with what it calls: libc, a recursion): every
    thread gets its own trace, and perf and hwtrace list exactly what each
    ran."""
    exe = build()
    path = tmp_path / "perf.data"
    args = [a for w in WORKS for a in (option, w)]
    rec = record_cli(monkeypatch, [*args, "--", str(exe), "four"], path)
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    want = stepped(rec)
    # Four threads other than main, each in its own function.
    assert len(want) == 4 and rec.pid not in want
    if option == "-f":
        assert {first_function(rec, ips) for ips in want.values()} == set(WORKS[:4])
    else:
        starts = {c.start: c.name for c in rec.calls}
        assert {starts[int(ips[0])] for ips in want.values()} == set(WORKS[:4])
        # Each thread's call is one stretch, from the entry to the return.
        assert all(len(tr.log.segments) == 1 for tr in rec.threads)
    assert {tr.pid for tr in rec.threads} == {rec.pid}
    kinds = collections.Counter(ev.kind for ev in rec.steps.events)
    assert kinds["fork"] == 4 and kinds["exit"] == 5 and kinds["start"] == 1
    comms = check_listings(path, want, capsys)
    assert all(c == {exe.name[:15]} for c in comms.values())


def test_threads_of_an_attached_process(tmp_path, capsys):
    """Attached to a process whose two threads wait: both are followed; a
    thread started afterwards is followed from its start; one ends early,
    inside its traced function (its last instruction, the exit system call,
    is its trace's last)."""
    exe = build()
    proc = subprocess.Popen([str(exe), "attach"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"ready\n"
        box: dict[str, object] = {}

        def record() -> None:  # ptrace belongs to the thread that attaches
            try:
                box["rec"] = record_software(proc.pid, functions=WORKS)
            except BaseException as exc:  # pragma: no cover - reported below
                box["error"] = exc

        recorder = threading.Thread(target=record)
        recorder.start()
        # Let the threads go once every one of them is traced (no deadline:
        # it is a state to reach, not a time to wait).
        while not _all_traced(proc.pid) and recorder.is_alive():
            time.sleep(0.01)
        proc.stdin.write(b"abc")
        proc.stdin.flush()
        recorder.join()
        assert "error" not in box, box["error"]
        rec = box["rec"]
        assert isinstance(rec, SoftwareRecording)
    finally:
        proc.kill()
        proc.wait()
    want = stepped(rec)
    names = {tid: first_function(rec, ips) for tid, ips in want.items()}
    assert sorted(names.values()) == ["quit_early", "work_a", "work_c"]
    early = next(tid for tid, name in names.items() if name == "quit_early")
    (trace,) = [tr for tr in rec.threads if tr.tid == early]
    assert trace.log.segments[-1].end_reason == "exit"
    assert trace.log.read_code(int(want[early][-1]), 2) == b"\x0f\x05"  # the exit syscall
    comm_events = [ev.tid for ev in rec.steps.events if ev.kind == "comm"]
    forks = [ev.tid for ev in rec.steps.events if ev.kind == "fork"]
    assert len(comm_events) == 2 and len(forks) == 1  # two there, one started
    assert names[forks[0]] == "work_c"
    check_listings(tmp_path / "perf.data", want, capsys, rec)


def _all_traced(pid: int) -> bool:
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                if "TracerPid:\t0\n" in f.read():
                    return False
        except OSError:
            return False
    return True


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_children_not_followed(tmp_path, mode):
    """Without follow_fork a child is let go with its memory free of
    breakpoints (forked), or watched untraced until it execs (spawned, it
    shares its parent's memory): it runs correctly and only the parent's
    thread is traced."""
    exe = build()
    rec = record_software([str(exe), mode], functions=WORKS)
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    want = stepped(rec)
    assert list(want) == [rec.pid]
    assert [tr.tid for tr in rec.threads] == [rec.pid]


@pytest.mark.parametrize("mode", ["fork", "spawn"])
def test_children_followed(tmp_path, mode, capsys):
    """With follow_fork the child is traced too: a forked child in its copy
    of the parent (work_b), then, like a spawned child, in the program it
    execs (work_c, functions looked up again); perf and hwtrace attribute
    each instruction to the right process and thread."""
    exe = build()
    rec = record_software([str(exe), mode], functions=WORKS, follow_fork=True)
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    want = stepped(rec)
    (child,) = [tid for tid in want if tid != rec.pid]
    traces = [tr for tr in rec.threads if tr.tid == child]
    functions = [first_function(rec, tr.instructions) for tr in traces]
    assert functions == (["work_b", "work_c"] if mode == "fork" else ["work_c"])
    execs = [ev for ev in rec.steps.events if ev.kind == "exec"]
    assert [ev.pid for ev in execs] == [child]
    assert traces[-1].image == execs[0].image != 0
    forks = [ev for ev in rec.steps.events if ev.kind == "fork"]
    assert [(ev.pid, ev.ppid) for ev in forks] == [(child, rec.pid)]
    check_listings(tmp_path / "perf.data", want, capsys, rec)


@pytest.mark.parametrize("option", ["-f", "--call"])
def test_threads_waiting_on_a_mutex(tmp_path, capsys, option):
    """Four threads taking one mutex in turns: with ``-f`` each leaves and
    re-enters the function at the same return addresses (their resume
    points share breakpoints); with ``--call`` the lock's futex waits are
    stepped inside the call while other threads go on.  Each thread's trace
    is exactly what it ran, whoever ran first."""
    exe = build()
    kind = {"-f": "functions", "--call": "calls"}[option]
    rec = record_software([str(exe), "mutex"], **{kind: ["bump"]})
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    want = stepped(rec)
    assert len(want) == 4
    check_listings(tmp_path / "perf.data", want, capsys, rec)


def test_thread_killed_while_stepped(tmp_path, capsys):
    """The process exits while a thread is being stepped inside its traced
    function: that thread's registers at its exit say whether its last
    stepped instruction ran; its trace ends there."""
    exe = build()
    rec = record_software([str(exe), "killed"], functions=["forever"])
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    want = stepped(rec)
    (tr,) = rec.threads
    assert tr.tid != rec.pid and tr.log.segments[-1].end_reason == "exit"
    assert tr.instructions.shape[0] > 500 * 4  # it ran its loop 500 times first
    check_listings(tmp_path / "perf.data", want, capsys, rec)


LIBRARY = r"""
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <unistd.h>
#define NOINLINE __attribute__((noinline))
static pthread_t helper;
static sem_t go;
static volatile long lib_sink;
pid_t ctor_child;  /* the child the constructor forked (0 in that child) */

NOINLINE long lib_work(long n) {
    long s = 3;
    for (long i = 0; i < n; i++)
        s = s * 17 + i;
    return s;
}
static void *helper_main(void *arg) {
    (void)arg;
    sem_wait(&go);
    lib_sink = lib_work(300);
    return 0;
}
/* Like LTTng-UST's: runs before the program's entry, starts a thread
   (and here also forks a child, which goes on to run the program too). */
__attribute__((constructor)) static void start_helper(void) {
    sem_init(&go, 0, 0);
    if (pthread_create(&helper, 0, helper_main, 0) != 0)
        abort();
    ctor_child = fork();
    if (ctor_child < 0)
        abort();
}
void lib_go(void) {
    sem_post(&go);
    pthread_join(helper, 0);
}
"""

CTOR_PROGRAM = r"""
#include <sys/wait.h>
#include <unistd.h>
extern pid_t ctor_child;
void lib_go(void);
static volatile long sink;
__attribute__((noinline)) long work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i ^ (s >> 3);
    return s;
}
int main(void) {
    sink = work(200);
    if (ctor_child == 0)
        return 0;  /* the constructor's child: it reached main too */
    lib_go();
    int st;
    if (waitpid(ctor_child, &st, 0) != ctor_child || !WIFEXITED(st) || WEXITSTATUS(st))
        return 3;
    return 0;
}
"""


def test_threads_and_children_of_library_constructors(tmp_path, capsys):
    """A library's constructor runs before the program's entry (where the
    recorder reads the process's mappings) and starts a thread and forks a
    child there, as LTTng-UST starts its listener threads: the thread is
    followed and traced in the library's function, the child, let go, runs
    the program to its end (no breakpoint left in its memory)."""
    lib = compile_program(LIBRARY, "ctorlib", ("-O1", "-g0", "-shared", "-fPIC", "-pthread"))
    exe = compile_program(
        CTOR_PROGRAM, "ctorprog", ("-O1", "-g0", "-pthread", "-Wl,--no-as-needed", str(lib))
    )
    rec = record_software([str(exe)], calls=["work", "lib_work"])
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    want = stepped(rec)
    assert sorted(want) == sorted({rec.pid, *(tr.tid for tr in rec.threads)})
    assert len(want) == 2 and rec.pid in want
    starts = {c.start: c.name for c in rec.calls}
    assert {starts[int(ips[0])] for ips in want.values()} == {"work", "lib_work"}
    assert starts[int(want[rec.pid][0])] == "work"
    check_listings(tmp_path / "perf.data", want, capsys, rec)


def test_clock_pairs_are_the_narrowest_of_their_reads(monkeypatch) -> None:
    """A clock pair read while the recorder lost the CPU (a wide window
    between its two monotonic reads) gives way to a narrower read: the
    placement error of events is the window's half width."""
    from hwtrace.record import stepper

    # (monotonic before, monotonic after) of each try: preempted in the first
    reads = iter([1_000, 3_001_000, 5_000_000, 5_000_400, 6_000_000, 6_000_100,
                  7_000_000, 7_000_300, 8_000_000, 8_000_900])  # fmt: skip
    monkeypatch.setattr(stepper.time, "clock_gettime_ns", lambda clock: next(reads))
    monkeypatch.setattr(stepper.nat, "rdtsc", iter([11, 22, 33, 44, 55]).__next__)
    windows: list[int] = []
    assert stepper._clock_pair("tsc", np.zeros(2, np.int64), windows) == (33, 6_000_050)
    assert windows == [50]
