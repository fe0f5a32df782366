"""`hwtrace ptdump` and `hwtrace ptxed` on real Intel PT recordings, against
Intel's own tools.

The recordings are public test data of other projects (see
:mod:`realdata`): DynamoRIO's drpt2trace test (a raw AUX stream, perf
sideband and the static binary, recorded on Skylake-SP; two versions of it)
and quipper's perf.data files recorded with ``intel_pt//`` (user and kernel,
file and pipe mode), whose AUX data is cut out per CPU with hwtrace's
perf.data reader.  The golden files under ``golden/real`` are the outputs of
Intel's ``ptdump`` and ``ptxed`` (libipt built with XED, which passes all of
Intel's conformance cases) run with the same arguments; where the recording
is not available here the case skips and says why.
"""

from __future__ import annotations

import difflib
import hashlib
import lzma
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import run_captured
from realdata import real_input

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "real"


@dataclass(frozen=True)
class Recording:
    """A raw PT stream and what decoding it needs: the trace configuration
    (``cpu``: ptdump's and ptxed's options), the images (ptxed's ``--elf``
    or ``--pevent`` sideband options) and the real input it comes from."""

    source: str  # REAL_INPUTS name
    cpu: tuple[str, ...]
    aux_cpu: int | None = None  # perf.data: the CPU whose AUX data is the trace
    sideband: bool = False  # drpt2trace: pevent files beside the trace


_DRPT_CPU = ("--cpu", "6/85/4", "--mtc-freq", "3", "--nom-freq", "37",
             "--cpuid-0x15.eax", "2", "--cpuid-0x15.ebx", "308")  # fmt: skip
# From the perf.data header: cpuid 6,78,3, intel_pt config 0x300e601
# (MTC frequency 3), max_non_turbo_ratio 12, TSC/CTC ratio 100/2.
_QUIPPER_CPU = ("--cpu", "6/78/3", "--mtc-freq", "3", "--nom-freq", "12",
                "--cpuid-0x15.eax", "2", "--cpuid-0x15.ebx", "100")  # fmt: skip

RECORDINGS: dict[str, Recording] = {
    "drpt": Recording("drpt2trace-simple", _DRPT_CPU, sideband=True),
    "drpt2022": Recording("drpt2trace-simple-2022", _DRPT_CPU, sideband=True),
    "quipper0": Recording("quipper-intel_pt", _QUIPPER_CPU, aux_cpu=0),
    "quipper3": Recording("quipper-intel_pt", _QUIPPER_CPU, aux_cpu=3),
    "piped0": Recording("quipper-intel_pt-piped", _QUIPPER_CPU, aux_cpu=0),
    "piped3": Recording("quipper-intel_pt-piped", _QUIPPER_CPU, aux_cpu=3),
}

# drpt2trace's perf settings (its test's command line, from libipt's
# perf-get-opts.bash).
_PEVENT = ("--pevent:sample-type", "0x10086", "--pevent:time-shift", "31",
           "--pevent:time-mult", "581029125", "--pevent:time-zero", "18444502336406842448",
           "--pevent:sysroot", "{dir}", "--pevent:primary", "{dir}/primary.sideband.pevent",
           "--pevent:secondary", "{dir}/secondary.sideband.pevent")  # fmt: skip

PTDUMP_SETS: dict[str, tuple[str, ...]] = {
    "default": (),
    "no-pad": ("--no-pad",),
    "lastip": ("--lastip", "--exec-mode"),
    "time": ("--time",),
    "tcal": ("--tcal",),
    "time-delta": ("--time", "--time-delta"),
    "no-tcal": ("--time", "--no-tcal"),
    "no-cyc": ("--time", "--no-cyc"),
}
PTDUMP_SB_SETS: dict[str, tuple[str, ...]] = {
    "pevent": (),
    "pevent-time": ("--time",),
    "pevent-no-tcal": ("--no-tcal",),
    "pevent-sb": ("--sb:compact", "--sb:offset", "--sb:time"),
}
PTXED_SETS: dict[str, tuple[str, ...]] = {
    "default": ("--stat",),
    "insn": ("--insn-decoder", "--stat"),
    "blocks": ("--block:show-blocks", "--stat"),
    "resync": ("--resync-on-error", "--stat"),
    "insn-resync": ("--insn-decoder", "--resync-on-error"),
    "time": ("--time", "--offset", "--event:time", "--event:ip"),
}


def _cases() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(golden name, recording, tool, arguments before the trace's)."""
    out = []
    for rec_name, rec in RECORDINGS.items():
        for set_name, args in PTDUMP_SETS.items():
            out.append((f"{rec_name}-ptdump-{set_name}", rec_name, "ptdump", args))
        if rec.sideband:
            for set_name, args in PTDUMP_SB_SETS.items():
                out.append((f"{rec_name}-ptdump-{set_name}", rec_name, "ptdump", args + _PEVENT))
        images = (
            [("elf", ("--elf", "{dir}/hello")), ("pevent", _PEVENT)] if rec.sideband else [("", ())]
        )
        # --no-inst: the text of the disassembly is XED's there, iced-x86's
        # here; the flow is what is compared.
        image_args = [(n, ("--no-inst", *a)) for n, a in images]
        for image_name, image in image_args:
            for set_name, args in PTXED_SETS.items():
                name = "-".join(x for x in (rec_name, "ptxed", image_name, set_name) if x)
                out.append((name, rec_name, "ptxed", args + image))
    return out


CASES = _cases()


def recording_dir(name: str, workdir: Path) -> Path:
    """A folder holding the recording ``name`` as ``pt.bin`` (with its
    binary and sideband files for drpt2trace); skips when the real input is
    not available here."""
    rec = RECORDINGS[name]
    path = real_input(rec.source)
    if rec.aux_cpu is None:
        return path
    from hwtrace.perf.data import read_perf_data

    out = workdir / name
    if not (out / "pt.bin").exists():
        pd = read_perf_data(path)
        cols = pd.auxtrace_columns()
        pick = [i for i in range(len(cols["row"])) if int(cols["cpu"][i]) == rec.aux_cpu]
        assert pick, f"{path}: no AUX data of cpu {rec.aux_cpu}"
        pick.sort(key=lambda i: int(cols["offset"][i]))
        data = b"".join(
            bytes(
                pd.buf[
                    int(cols["data_offset"][i]) : int(cols["data_offset"][i]) + int(cols["size"][i])
                ]
            )
            for i in pick
        )
        out.mkdir(parents=True, exist_ok=True)
        (out / "pt.bin").write_bytes(data)
    return out


def argv_of(rec_name: str, tool: str, args: tuple[str, ...], folder: Path) -> list[str]:
    """The command line (without the program) of a case."""
    rec = RECORDINGS[rec_name]
    args = tuple(a.replace("{dir}", str(folder)) for a in args)
    pt = str(folder / "pt.bin")
    if tool == "ptdump":
        return [*rec.cpu, *args, pt]
    return [*rec.cpu, *args, "--pt", pt]


def normalize(text: bytes, folder: Path) -> list[str]:
    """Lines as Intel's tools print them, the recording's folder named
    ``{dir}`` (sideband messages name their files)."""
    return text.decode("utf-8", "replace").replace(str(folder), "{dir}").splitlines()


def golden_lines(name: str) -> list[str] | tuple[str, int]:
    """A golden listing, or (sha256, line count) where only its digest is
    kept (the listing is large)."""
    full = GOLDEN / f"{name}.txt.xz"
    if full.exists():
        return lzma.decompress(full.read_bytes()).decode().splitlines()
    digest = (GOLDEN / f"{name}.sha256").read_text().split()
    return digest[0], int(digest[1])


def digest_of(lines: list[str]) -> tuple[str, int]:
    return hashlib.sha256(("\n".join(lines) + "\n").encode()).hexdigest(), len(lines)


# Cases that do not match Intel's yet.  A case passing that is listed here,
# or a case failing that is not, fails the test.
KNOWN_FAILING: set[str] = set()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("real-pt")


@pytest.mark.parametrize("name,rec,tool,args", [pytest.param(*c, id=c[0]) for c in CASES])
def test_real_recording(name, rec, tool, args, workdir):
    folder = recording_dir(rec, workdir)
    argv = argv_of(rec, tool, args, folder)
    got = normalize(run_captured([tool, *argv]), folder)
    want = golden_lines(name)
    same = digest_of(got) == want if isinstance(want, tuple) else got == want
    if not same:
        if name in KNOWN_FAILING:
            pytest.xfail("known to differ")
        if isinstance(want, tuple):
            pytest.fail(f"hwtrace {tool} {' '.join(argv)}: differs from Intel's (digest)")
        diff = difflib.unified_diff(want, got, "intel", "hwtrace", lineterm="")
        pytest.fail(f"hwtrace {tool} {' '.join(argv)}\n" + "\n".join(list(diff)[:60]))
    assert name not in KNOWN_FAILING, "now identical: remove it from KNOWN_FAILING"


def test_sideband_naming_a_file_not_here_is_a_sideband_error(workdir):
    """Without --pevent:sysroot the sideband's MMAP names /hello, which is
    not on this machine: libipt's sideband reports "bad file" there and
    decoding goes on (it was an ImageError traceback)."""
    folder = recording_dir("drpt", workdir)
    args = tuple(a for a in _PEVENT if a not in ("--pevent:sysroot", "{dir}"))
    argv = argv_of("drpt", "ptxed", ("--no-inst", "--sb:warn", "--elf", "{dir}/hello", *args),
                   folder)  # fmt: skip
    got = run_captured(["ptxed", *argv]).decode()
    assert "sideband error: bad file]" in got and "[enabled]" in got
