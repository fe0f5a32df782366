"""Schemas from tracefs format files, CTF 1.8 metadata and Python mappings
(hwtrace.filter.sources), checked by filtering records built on them."""

from __future__ import annotations

import glob
import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.filter import evaluate

from hwtrace.filter.check import compile_check
from hwtrace.filter.errors import FilterError
from hwtrace.filter.packing import EventRecord
from hwtrace.filter.schema import (
    DEFAULT_CONTEXT,
    ROOT_CONTEXT,
    ArrayType,
    FloatType,
    IntType,
    Schema,
    SequenceType,
    StringType,
    StructType,
)
from hwtrace.filter.sources import (
    schema_from_mapping,
    schema_from_tracefs,
    schemas_from_ctf_metadata,
    tracefs_schema,
)

TRACEFS = "/sys/kernel/tracing"

# -- stored tracefs format files (Linux 6.18, x86-64) ---------------------------------------

SCHED_SWITCH = (
    "name: sched_switch\n"
    "ID: 372\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\n"
    "\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;\n"
    "\tfield:int prev_prio;\toffset:28;\tsize:4;\tsigned:1;\n"
    "\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;\n"
    "\tfield:char next_comm[16];\toffset:40;\tsize:16;\tsigned:0;\n"
    "\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;\n"
    "\tfield:int next_prio;\toffset:60;\tsize:4;\tsigned:1;\n"
    "\n"
    'print fmt: "prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s next_pid=%d next_prio=%d", REC->prev_comm, REC->prev_pid, REC->prev_prio, (REC->prev_state & ((((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - 1)) ? __print_flags(REC->prev_state & ((((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - 1), "|", { 0x00000001, "S" }, { 0x00000002, "D" }, { 0x00000004, "T" }, { 0x00000008, "t" }, { 0x00000010, "X" }, { 0x00000020, "Z" }, { 0x00000040, "P" }, { 0x00000080, "I" }) : "R", REC->prev_state & (((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) ? "+" : "", REC->next_comm, REC->next_pid, REC->next_prio\n'
)

SYS_ENTER_OPENAT = (
    "name: sys_enter_openat\n"
    "ID: 782\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;\n"
    "\tfield:int dfd;\toffset:16;\tsize:8;\tsigned:0;\n"
    "\tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;\n"
    "\tfield:int flags;\toffset:32;\tsize:8;\tsigned:0;\n"
    "\tfield:umode_t mode;\toffset:40;\tsize:8;\tsigned:0;\n"
    "\n"
    'print fmt: "dfd: 0x%08lx, filename: 0x%08lx, flags: 0x%08lx, mode: 0x%08lx", ((unsigned long)(REC->dfd)), ((unsigned long)(REC->filename)), ((unsigned long)(REC->flags)), ((unsigned long)(REC->mode))\n'
)

SYS_ENTER = (
    "name: sys_enter\n"
    "ID: 443\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:long id;\toffset:8;\tsize:8;\tsigned:1;\n"
    "\tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;\n"
    "\n"
    'print fmt: "NR %ld (%lx, %lx, %lx, %lx, %lx, %lx)", REC->id, REC->args[0], REC->args[1], REC->args[2], REC->args[3], REC->args[4], REC->args[5]\n'
)

SCHED_PROCESS_EXEC = (
    "name: sched_process_exec\n"
    "ID: 365\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n"
    "\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;\n"
    "\tfield:pid_t old_pid;\toffset:16;\tsize:4;\tsigned:1;\n"
    "\n"
    'print fmt: "filename=%s pid=%d old_pid=%d", __get_str(filename), REC->pid, REC->old_pid\n'
)

STORED = {
    ("sched", "sched_switch"): SCHED_SWITCH,
    ("syscalls", "sys_enter_openat"): SYS_ENTER_OPENAT,
    ("raw_syscalls", "sys_enter"): SYS_ENTER,
    ("sched", "sched_process_exec"): SCHED_PROCESS_EXEC,
}

CONTEXT = EventRecord(DEFAULT_CONTEXT, {"procname": "bash", "cpu_id": 1})


def verdict(text: str, schema: Schema, values: dict) -> bool:
    record = EventRecord(schema, values)
    return evaluate(compile_check(text, schema), record.address, CONTEXT.address)


def fields(schema: Schema) -> dict:
    return {f.name: (f.type, f.offset) for f in schema.fields}


# -- tracefs ----------------------------------------------------------------------------------


def test_sched_switch():
    s = schema_from_tracefs(SCHED_SWITCH)
    assert s.name == "sched_switch" and s.size == 64
    f = fields(s)
    assert f["common_type"] == (IntType(2, False), 0)
    assert f["common_pid"] == (IntType(4, True), 4)
    assert f["prev_comm"] == (StringType("inline", 16), 8)
    assert f["prev_state"] == (IntType(8, True), 32)
    assert f["next_prio"] == (IntType(4, True), 60)
    text = 'prev_comm == "nginx*" && prev_state != 0 && next_pid > 0'
    assert verdict(text, s, {"prev_comm": "nginx: worker", "prev_state": 1, "next_pid": 7})
    assert not verdict(text, s, {"prev_comm": "nginx: worker", "prev_state": 0, "next_pid": 7})
    assert not verdict(text, s, {"prev_comm": "bash", "prev_state": 1, "next_pid": 7})
    # A comm of the full 16 bytes has no NUL: it ends at the capacity.
    assert verdict('next_comm == "0123456789abcdef"', s, {"next_comm": "0123456789abcdefXYZ"})


def test_sys_enter_openat_pointer_is_an_integer():
    s = schema_from_tracefs(SYS_ENTER_OPENAT)
    f = fields(s)
    assert f["filename"] == (IntType(8, False), 24)  # the pointer, not the string
    assert f["__syscall_nr"] == (IntType(4, True), 8)
    # The kernel records the argument's register (size 8, signed:0); the
    # call takes an int: AT_FDCWD is -100, not 4294967196.
    assert f["dfd"] == (IntType(4, True), 16)
    assert verdict("filename != 0 && dfd == -100", s, {"filename": 0x7FFF0000, "dfd": -100})
    registers = schema_from_tracefs(SYS_ENTER_OPENAT.replace("int dfd;", "unsigned long dfd;"))
    image = EventRecord(registers, {"filename": 0x7FFF0000, "dfd": 0xFFFFFF9C})
    for text, want in (("dfd == -100", True), ("dfd < 0", True), ("dfd == 4294967196", False)):
        assert evaluate(compile_check(text, s), image.address, CONTEXT.address) == want, text
    with pytest.raises(FilterError, match="cannot compare a string with a number"):
        compile_check('filename == "/etc/*"', s)


def test_sys_enter_openat_pointer_as_a_string_for_kernel_filters():
    # What the kernel back end reads through the pointer; the record keeps
    # the pointer's 8 bytes where they were.
    s = schema_from_tracefs(SYS_ENTER_OPENAT, pointer_strings=True)
    f = fields(s)
    assert f["filename"] == (StringType("ptr"), 24)
    assert f["dfd"] == (IntType(4, True), 16)
    assert s.size == schema_from_tracefs(SYS_ENTER_OPENAT).size
    tree = compile_check('filename == "/etc/*" && flags != 0', s)
    assert tree.type == "s64"


@pytest.mark.parametrize(
    "decl, string",
    [("const char * filename", True), ("char *name", True), ("const char __user * path", True),
     ("const char ** argv", False), ("unsigned char * buf", False), ("void * addr", False)],
)  # fmt: skip
def test_which_pointers_are_strings(decl, string):
    text = SYS_ENTER_OPENAT.replace("const char * filename", decl)
    name = decl.replace("*", " ").split()[-1]
    t = fields(schema_from_tracefs(text, pointer_strings=True))[name][0]
    assert isinstance(t, StringType) == string


def test_raw_syscalls_sys_enter_array():
    s = schema_from_tracefs(SYS_ENTER)
    f = fields(s)
    assert f["id"] == (IntType(8, True), 8)
    assert f["args"] == (ArrayType(IntType(8, False), 6), 16)
    assert s.size == 64
    values = {"id": 257, "args": [0xFFFFFF9C, 0x1000, 0o2000000, 0, 0, 0]}
    assert verdict("id == 257 && args[1] == 0x1000 && args[2] & 02000000 == 0", s, values) is False
    assert verdict("id == 257 && args[1] == 0x1000 && (args[2] & 02000000) != 0", s, values)
    assert not verdict("args[6] == 0 || 1", s, values)  # past the array: false


def test_sched_process_exec_data_loc():
    s = schema_from_tracefs(SCHED_PROCESS_EXEC)
    f = fields(s)
    assert f["filename"] == (StringType("data_loc"), 8)
    assert f["pid"] == (IntType(4, True), 12)
    assert s.size == 20
    values = {"filename": "/usr/bin/ls", "pid": 42, "old_pid": 42}
    record = EventRecord(s, values)
    raw = bytes(record)
    loc = struct.unpack_from("<I", raw, 8)[0]
    assert loc & 0xFFFF == 20 and loc >> 16 == len("/usr/bin/ls") + 1
    assert raw[20:] == b"/usr/bin/ls\0"
    assert verdict('filename == "/usr/bin/*" && pid == 42', s, values)
    assert not verdict('filename == "/usr/sbin/*"', s, values)
    assert verdict('filename == "*ls"', s, values)


def test_odd_declarations():
    text = (
        "name: odd\nID: 1\nformat:\n"
        "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
        "\tfield:__data_loc u64[] addrs;\toffset:4;\tsize:4;\tsigned:0;\n"
        "\tfield:__rel_loc char[] rel;\toffset:8;\tsize:4;\tsigned:0;\n"
        "\tfield:char comm[TASK_COMM_LEN];\toffset:12;\tsize:16;\tsigned:0;\n"
        "\tfield:u32 grid[2][3];\toffset:28;\tsize:24;\tsigned:0;\n"
        "\tfield:unsigned long words[NR];\toffset:56;\tsize:16;\tsigned:0;\n"
        "\tfield:void * ptr;\toffset:72;\tsize:8;\tsigned:0;\n"
        "\tfield:bool on;\toffset:80;\tsize:1;\tsigned:0;\n"
        "\tfield:char buf[];\toffset:81;\tsize:0;\tsigned:0;\n"
        '\nprint fmt: ""\n'
    )
    s = schema_from_tracefs(text)
    f = fields(s)
    assert f["addrs"] == (SequenceType(IntType(8, False), "data_loc"), 4)
    assert "rel" not in f and "buf" not in f  # __rel_loc and a flexible tail: left out
    assert f["comm"] == (StringType("inline", 16), 12)
    assert f["grid"] == (ArrayType(ArrayType(IntType(4, False), 3), 2), 28)
    assert f["words"] == (ArrayType(IntType(8, False), 2), 56)
    assert f["ptr"] == (IntType(8, False), 72)
    assert f["on"] == (IntType(1, False), 80)
    values = {"addrs": [1, 2**64 - 1], "grid": [[0, 1, 2], [3, 4, 5]]}
    assert verdict("addrs[1] == -1 && grid[1][2] == 5 && grid[0][1] == 1", s, values)
    assert not verdict("addrs[2] == 0 || 1", s, values)


@pytest.mark.parametrize(
    "text, message, line",
    [
        (
            "name: x\nformat:\n\tfield:int a;\toffset:0;\tsize:4;\tsigned:1;\n\tfield:int a;\toffset:4;\tsize:4;\tsigned:1;\n",
            "'a' appears twice",
            4,
        ),
        ("name: x\nformat:\n\tfield:int a;\toffset:zero;\tsize:4;\n", "cannot read field line", 3),
        (
            "name: x\nformat:\n\tfield:int a;\toffset:0;\tsize:4;\tsigned:1;\n\tfield:;\toffset:4;\tsize:4;\tsigned:1;\n",
            "cannot read",
            4,
        ),
        (
            "name: x\nformat:\n\tfield:__data_loc char[] s;\toffset:0;\tsize:8;\tsigned:0;\n",
            "size 8, not 4",
            3,
        ),
        (
            "name: x\nformat:\n\tfield:u32 a[3];\toffset:0;\tsize:10;\tsigned:0;\n",
            "does not divide",
            3,
        ),
    ],
)
def test_tracefs_errors_name_the_line(text, message, line):
    with pytest.raises(FilterError) as info:
        schema_from_tracefs(text)
    assert message in info.value.message
    assert info.value.where == f"x format line {line}"
    assert f"line {line}" in str(info.value)


def test_tracefs_not_a_format_file():
    with pytest.raises(FilterError, match="not a tracefs format file"):
        schema_from_tracefs("hello\n")
    with pytest.raises(FilterError, match=r"no tracefs at|no event"):
        tracefs_schema("sched", "sched_switch", tracefs="/nonexistent")


needs_tracefs = pytest.mark.skipif(
    not os.path.exists(f"{TRACEFS}/events/sched/sched_switch/format"),
    reason=f"no readable tracefs at {TRACEFS}",
)


@needs_tracefs
@pytest.mark.parametrize("system, event", sorted(STORED))
def test_live_tracefs_matches_the_stored_copy_in_kind(system, event):
    live = tracefs_schema(system, event, TRACEFS)
    stored = schema_from_tracefs(STORED[(system, event)])
    assert live.name == event
    # Offsets may move between kernels; the fields and their kinds do not.
    assert {f.name: type(f.type) for f in live.fields} == {
        f.name: type(f.type) for f in stored.fields
    }


@needs_tracefs
def test_every_live_format_file_reads():
    paths = glob.glob(f"{TRACEFS}/events/*/*/format")
    assert paths
    for path in paths:
        with open(path) as f:
            schema = schema_from_tracefs(f.read())
        assert schema.fields, path
        assert any(f.name == "common_pid" for f in schema.fields), path
    with pytest.raises(FilterError, match="no event sched:nosuch"):
        tracefs_schema("sched", "nosuch", TRACEFS)


@needs_tracefs
def test_live_schema_filters():
    s = tracefs_schema("sched", "sched_process_exec", TRACEFS)
    assert verdict('filename == "/bin/*"', s, {"filename": "/bin/true"})


# -- CTF 1.8 metadata -----------------------------------------------------------------------

METADATA = r"""/* CTF 1.8 */

typealias integer { size = 8; align = 8; signed = false; } := uint8_t;
typealias integer { size = 16; align = 8; signed = false; } := uint16_t;
typealias integer { size = 32; align = 8; signed = false; } := uint32_t;
typealias integer { size = 64; align = 8; signed = false; } := uint64_t;
typealias integer { size = 64; align = 8; signed = false; } := unsigned long;
typealias integer { size = 5; align = 1; signed = false; } := uint5_t;
typealias integer { size = 27; align = 1; signed = false; } := uint27_t;

trace {
	major = 1;
	minor = 8;
	uuid = "2a6422d0-6cee-11e0-8c08-cb07d7b3a564";
	byte_order = le;
	packet.header := struct {
		uint32_t magic;
		uint8_t  uuid[16];
		uint32_t stream_id;
		uint64_t stream_instance_id;
	};
};

env {
	hostname = "host";
	domain = "ust";
	tracer_name = "lttng-ust";
	tracer_major = 2;
	tracer_minor = 13;
};

clock {
	name = "monotonic";
	uuid = "9f9c9e6c-1111-2222-3333-444455556666";
	description = "Monotonic Clock";
	freq = 1000000000; /* Frequency, in Hz */
	/* clock value offset from Epoch is: offset * (1/freq) */
	offset = 1700000000000000000;
};

typealias integer {
	size = 27; align = 1; signed = false;
	map = clock.monotonic.value;
} := uint27_clock_monotonic_t;

typealias integer {
	size = 64; align = 8; signed = false;
	map = clock.monotonic.value;
} := uint64_clock_monotonic_t;

struct packet_context {
	uint64_clock_monotonic_t timestamp_begin;
	uint64_clock_monotonic_t timestamp_end;
	uint64_t content_size;
	uint64_t packet_size;
	uint64_t packet_seq_num;
	unsigned long events_discarded;
	uint32_t cpu_id;
};

struct event_header_compact {
	enum : uint5_t { compact = 0 ... 30, extended = 31 } id;
	variant <id> {
		struct {
			uint27_clock_monotonic_t timestamp;
		} compact;
		struct {
			uint32_t id;
			uint64_clock_monotonic_t timestamp;
		} extended;
	} v;
} align(8);

stream {
	id = 0;
	event.header := struct event_header_compact;
	packet.context := struct packet_context;
	event.context := struct {
		integer { size = 32; align = 8; signed = 1; encoding = none; base = 10; } _vpid;
		integer { size = 8; align = 8; signed = 1; encoding = UTF8; base = 10; } _procname[17];
	};
};

event {
	name = "ust_tests_hello:tptest";
	id = 0;
	stream_id = 0;
	loglevel = 13;
	model.emf.uri = "http://example.com/path_to_model?q=ust_tests_hello:tptest";
	fields := struct {
		integer { size = 32; align = 8; signed = 1; encoding = none; base = 10; } _intfield;
		integer { size = 32; align = 8; signed = 1; encoding = none; base = 16; } _intfield2;
		integer { size = 64; align = 8; signed = 1; encoding = none; base = 10; } _longfield;
		integer { size = 32; align = 8; signed = 1; encoding = none; base = 10; byte_order = be; } _netintfield;
		integer { size = 64; align = 8; signed = 1; encoding = none; base = 10; } _arrfield1[3];
		integer { size = 8; align = 8; signed = 1; encoding = UTF8; base = 10; } _arrfield2[10];
		integer { size = 64; align = 8; signed = 0; encoding = none; base = 10; } __seqfield1_length;
		integer { size = 8; align = 8; signed = 1; encoding = none; base = 10; } _seqfield1[ __seqfield1_length ];
		integer { size = 64; align = 8; signed = 0; encoding = none; base = 10; } __seqfield2_length;
		integer { size = 8; align = 8; signed = 1; encoding = UTF8; base = 10; } _seqfield2[ __seqfield2_length ];
		string _stringfield;
		floating_point { exp_dig = 8; mant_dig = 24; align = 8; } _floatfield;
		floating_point { exp_dig = 11; mant_dig = 53; align = 8; } _doublefield;
		integer { size = 1; align = 1; signed = 0; encoding = none; base = 10; } _boolfield;
		enum : integer { size = 8; align = 8; signed = 0; encoding = none; base = 10; } { "VALUE" = 0, "OTHER" = 1 ... 5, } _enumfield;
	};
};

event {
	name = "ust_tests_hello:tptest_sighandler";
	id = 1;
	stream_id = 0;
	loglevel = 13;
	fields := struct {
		struct {
			uint16_t _port;
			string _host;
		} _peer;
		uint8_t __n_length;
		struct { uint16_t _a; } _items[ __n_length ];
		integer { size = 16; signed = 1; } _grid[2][3];
	};
};
"""


def test_ctf_events():
    schemas = schemas_from_ctf_metadata(METADATA)
    assert set(schemas) == {"ust_tests_hello:tptest", "ust_tests_hello:tptest_sighandler"}
    s = schemas["ust_tests_hello:tptest"]
    f = fields(s)
    assert f["intfield"] == (IntType(4, True), 0)  # leading underscore dropped
    assert f["longfield"][0] == IntType(8, True)
    assert f["arrfield1"][0] == ArrayType(IntType(8, True), 3)
    assert f["arrfield2"][0] == StringType("ptr")  # ctf_array_text
    assert f["seqfield1"][0] == SequenceType(IntType(1, True), "ptr", "_seqfield1_length")
    assert f["_seqfield1_length"][0] == IntType(8, False)
    assert f["seqfield2"][0] == StringType("ptr")  # ctf_sequence_text
    assert f["stringfield"][0] == StringType("ptr")
    assert f["floatfield"][0] == FloatType(4)
    assert f["doublefield"][0] == FloatType(8)
    assert f["boolfield"][0] == IntType(1, False)  # 1 bit, rounded up to a byte
    assert f["enumfield"][0] == IntType(1, False)
    # Laid out as a C struct.
    assert f["longfield"][1] == 8 and f["stringfield"][1] % 8 == 0
    values = {
        "intfield": 501,
        "seqfield1": [1, 2, 3],
        "stringfield": "test string",
        "doublefield": 2.0,
        "arrfield2": "text",
    }
    text = 'intfield > 500 && intfield < 503 && seqfield1[2] == 3 && stringfield == "test*"'
    assert verdict(text, s, values)
    assert verdict('doublefield > 1.5 && arrfield2 == "te*"', s, values)
    assert not verdict("seqfield1[3] == 0 || 1", s, values)

    h = schemas["ust_tests_hello:tptest_sighandler"]
    f = fields(h)
    assert isinstance(f["peer"][0], StructType)
    assert f["items"][0] == SequenceType(
        StructType(f["items"][0].element.fields, 2), "ptr", "_n_length"
    )
    assert f["grid"][0] == ArrayType(ArrayType(IntType(2, True), 3), 2)
    values = {"peer": {"port": 80, "host": "example.org"}, "items": [{"a": 1}, {"a": 5}]}
    assert verdict('peer.port == 80 && peer.host == "*.org" && items[1].a == 5', h, values)
    assert not verdict("items[2].a == 0 || 1", h, values)


def test_ctf_packetized_metadata():
    body = METADATA.encode()
    packets = b""
    for start in range(0, len(body), 1000):
        chunk = body[start : start + 1000]
        header = struct.pack(
            "<I16sIIIBBBBB",
            0x75D11D57,
            bytes(16),
            0,
            8 * (37 + len(chunk)),
            8 * (37 + len(chunk) + 3),
            0,
            0,
            0,
            1,
            8,
        )
        packets += header + chunk + b"\0\0\0"
    assert set(schemas_from_ctf_metadata(packets)) == set(schemas_from_ctf_metadata(METADATA))


VARIANT_EVENT = """
typealias integer { size = 8; align = 8; signed = false; } := uint8_t;
event {
	name = "p:v";
	fields := struct {
		uint8_t _tag;
		uint8_t _before;
		variant <_tag> { uint8_t a; string b; } _choice;
	};
};
"""


def test_ctf_variant_fields():
    with pytest.raises(FilterError) as info:
        schemas_from_ctf_metadata(VARIANT_EVENT)
    assert "variant fields are not supported" in info.value.message
    assert "'choice'" in info.value.message
    assert info.value.where == "metadata line 8"
    s = schemas_from_ctf_metadata(VARIANT_EVENT, skip_unsupported=True)["p:v"]
    assert [f.name for f in s.fields] == ["tag", "before"]


@pytest.mark.parametrize(
    "text, message, line",
    [
        (
            'event {\n name = "e";\n fields := struct {\n  uint99_t _x;\n };\n};\n',
            "unknown type 'uint99_t'",
            4,
        ),
        (
            'event {\n fields := struct {\n  floating_point { exp_dig = 5; mant_dig = 11; } _h;\n };\n name = "e";\n};\n',
            "exp_dig 5 and mant_dig 11",
            3,
        ),
        (
            'event {\n name = "e";\n fields := struct {\n  integer { size = 128; } _x;\n };\n};\n',
            "integer size 128",
            4,
        ),
        (
            'event {\n name = "e";\n fields := struct {\n  integer { size = 8; } _x[_n];\n };\n};\n',
            "counted by 'n'",
            4,
        ),
        ("event {\n id = 1;\n};\n", "event without a name", 1),
        ('event {\n name = "e"\n};\n', "expected ';'", 3),
        ("trace {\n major = 1;\n", "unexpected end of metadata", 2),
        ("bogus;\n", "unexpected 'bogus'", 1),
        (
            'event {\n name = "e";\n fields := struct { integer { size = 8; } _x @ };\n};\n',
            "unexpected character '@'",
            3,
        ),
    ],
)
def test_ctf_errors_name_the_line(text, message, line):
    with pytest.raises(FilterError) as info:
        schemas_from_ctf_metadata(text)
    assert message in info.value.message
    assert info.value.where == f"metadata line {line}"


# -- Python mappings ------------------------------------------------------------------------


def test_schema_from_mapping():
    s = schema_from_mapping(
        "req",
        {
            "id": "u32",
            "n": "u8",
            "vals": ("seq", "s32", "n"),
            "peer": {"addr": "u8[4]", "port": "u16", "name": "string"},
            "comm": "char[16]",
            "path": ("data_loc", "string"),
            "raw": ("data_loc", "u16"),
            "pts": ("array", {"x": "double", "y": "double"}, 2),
            "ratio": "float",
        },
    )
    f = fields(s)
    assert f["id"] == (IntType(4, False), 0)
    assert f["vals"] == (SequenceType(IntType(4, True), "ptr", "n"), 8)
    assert f["peer"][0].member("port").type == IntType(2, False)
    assert f["comm"][0] == StringType("inline", 16)
    assert f["path"][0] == StringType("data_loc")
    assert f["raw"][0] == SequenceType(IntType(2, False), "data_loc")
    assert f["pts"][0].length == 2 and f["pts"][0].element.size == 16
    assert f["ratio"][0] == FloatType(4)
    values = {
        "id": 7,
        "vals": [4, 5],
        "peer": {"addr": [127, 0, 0, 1], "port": 8080, "name": "localhost"},
        "path": "/tmp/x",
        "raw": [9],
        "pts": [{"x": 0.5}, {"y": -1.5}],
    }
    text = (
        'id == 7 && vals[1] == 5 && peer.addr[0] == 127 && peer.name == "local*"'
        ' && path == "/tmp/*" && raw[0] == 9 && pts[1].y < -1 && n == 2'
    )
    assert verdict(text, s, values)
    ctx = schema_from_mapping("ctx", {"pid": "s64", "prov:x": "s32"}, root=ROOT_CONTEXT)
    assert ctx.root == ROOT_CONTEXT


@pytest.mark.parametrize(
    "mapping, message",
    [
        ({"a": "s33"}, "req.a: unknown type 's33'"),
        ({"a": ("seq", "s32", "n")}, "req.a: length field 'n'"),
        ({"n": "double", "a": ("seq", "s32", "n")}, "length field 'n' is not an integer"),
        ({"a": ("tuple?",)}, "req.a: cannot read type"),
        ({"a b": "s32"}, "not an identifier"),
        ({"s": {"x": 5}}, "req.s.x: cannot read type 5"),
    ],
)
def test_schema_from_mapping_errors(mapping, message):
    with pytest.raises(FilterError, match=None) as info:
        schema_from_mapping("req", mapping)
    assert message in str(info.value)


# -- bad input never escapes as anything but FilterError -------------------------------------


def _damaged(text: str):
    """``text`` with a slice cut out and, perhaps, some characters put in."""
    return st.tuples(
        st.integers(0, len(text)), st.integers(0, 40), st.text('{}[];:="_ab1\n', max_size=4)
    ).map(lambda t: text[: t[0]] + t[2] + text[t[0] + t[1] :])


@settings(max_examples=300, deadline=None)
@given(_damaged(METADATA))
def test_damaged_ctf_metadata_gives_filter_errors(text):
    try:
        schemas = schemas_from_ctf_metadata(text)
    except FilterError as e:
        assert e.where and e.where.startswith("metadata")
        return
    for s in schemas.values():
        EventRecord(s, {})


@settings(max_examples=300, deadline=None)
@given(_damaged(SCHED_PROCESS_EXEC + SCHED_SWITCH))
def test_damaged_tracefs_format_gives_filter_errors(text):
    try:
        s = schema_from_tracefs(text)
    except FilterError as e:
        assert e.where
        return
    EventRecord(s, {})
