/* The machine code of the patch backend: the runtime routines and the
 * trampoline templates that write Intel PT packets from inside a traced
 * process.  Assembled once by scripts/gen_patchcode.py into _patchcode.py
 * (bytes and field offsets); nothing is assembled at run time.
 *
 * Per thread, the GS segment base points at the thread's control block
 * (offsets below).  Conditional branches append their outcome to W, which
 * holds the pending TNT bits under 16 zero bits and a stop bit (W0: none
 * pending), so the stop bit reaches bit 63 when 47 bits (eight TNT-8
 * packets) are pending.  Where the code a branch goes to writes the
 * arithmetic flags before it reads any (the sweep's liveness), the bit is
 * one shift of W through GS (`shl`, or `stc; rcl`), whose overflow flag
 * says the stop bit reached bit 63.  Elsewhere it is appended without
 * touching flags or any register but rcx and rdx (saved in the block);
 * bswap and a byte move bring W's top byte down for jrcxz, which so
 * writes the packets a few bits earlier (40 and more pending).  Everything else (TIP
 * with IP compression, TIP.PGD/PGE around system calls, PSB+) goes
 * through the runtime routines, which save rax, rdx, rbx and the
 * arithmetic flags in the block (lahf/seto, as DynamoRIO does), never on
 * the program's stack.
 *
 * The hot paths address the block through a base register loaded from
 * its SELF field, not through GS: AMD Zen forwards a store to a later
 * load of the same [base + displacement] at no cost ("memory renaming"),
 * which segment-relative addresses do not get; a chain of GS-relative
 * read-modify-writes of W cost about 6 cycles a branch here, the same
 * chain through a base register under 2.
 *
 * Return compression follows the decoder's call stack: every call pushes
 * (its return address negated, and where the return goes on when that
 * address is an int3 of the patches, else 0) onto a 256-entry ring in the
 * block, invalidating the entry 64 below (a decoder keeps 64); a return
 * to the top entry's address pops it and is a taken TNT bit, any other
 * return a TIP (no pop).  PSB+ and TIP.PGE invalidate the top entry, so a
 * decoder that empties its stack there never sees a compressed return
 * whose call came before.
 *
 * Routines are entered by a jump with the caller's rcx in SAVE_RCX and
 * their continuation in CONT; they keep every register but rcx.
 *
 * Address ranges (an Intel PT address filter): only the code inside them
 * is patched, with every system call.  ON says whether tracing is on; the
 * routines write nothing while it is off (TNT bits gathered then are
 * dropped when it goes on).  A range's start and the return address of
 * each call inside one enable it (tpl_enter: TIP.PGE when off); a branch
 * leaving the ranges disables it (TIP.PGD with the target, as the
 * processor writes it): a direct one in its template (tpl_leave), an
 * indirect one or a return in rt_tip, which looks the target up in RANGES.
 *
 * Calls' extents (CALLMODE): all code is patched, tracing is off but from
 * a chosen function's entry (tpl_enter, which keeps rsp there in EXTENT)
 * until the stack rises above it: rt_tip disables at the return (TIP.PGD
 * with its target), or before the indirect branch a longjmp or an
 * unwinder ends with, which runs above it (FUP with the branch's address,
 * from tpl_mark, and TIP.PGD).  The enable empties the return stack's
 * top, so that return is never compressed.
 */
        .intel_syntax noprefix
        .text

        .equ W, 0           /* TNT accumulator (W0: none pending) */
        .equ W0, 0x10000
        .equ CUR, 8         /* next byte to write in the thread's buffer */
        .equ END, 16        /* buffer end minus SLACK: no room at or past it */
        .equ LASTIP, 24     /* the decoder's last IP (IP compression) */
        .equ SAVE_RCX, 32
        .equ SAVE_RAX, 40
        .equ SAVE_RDX, 48
        .equ SAVE_FL, 56
        .equ CONT, 64       /* where a routine goes back to */
        .equ NEXTIP, 72     /* the IP tracing goes on at (FUP of PSB+, TIP.PGE) */
        .equ TARGET, 80     /* an indirect branch's target */
        .equ NEXTPSB, 88    /* buffer address at or after which a PSB+ is due */
        .equ PSBPERIOD, 96  /* bytes between PSB+ */
        .equ LOST, 104      /* packets dropped: the buffer was full */
        .equ TSCON, 112     /* nonzero: TSC packets */
        .equ OVF, 120       /* nonzero: packets were dropped, an OVF is due */
        .equ TNTBITS, 128   /* statistics: TNT bits flushed, TIPs, enables */
        .equ TIPS, 136
        .equ PGES, 144
        .equ SYSNR, 152     /* the last system call's number and prot argument */
        .equ SYSARG, 160
        .equ RTABLE, 168    /* redirect table: (from, to) pairs, open addressing */
        .equ RMASK, 176     /* its slot mask (slots - 1); 0: no table */
        .equ REDIRECTS, 184 /* statistics: indirect branches sent into trampolines */
        .equ SIDX, 192      /* the return stack's top entry (a byte: 256 entries) */
        .equ TSCNEXT, 200   /* the TSC at or after which a routine writes a TSC packet */
        .equ TSCSTEP, 208   /* TSC ticks between such packets (0: none, MTC's stand-in) */
        .equ TNTEND, 216    /* scratch: CUR while TNT packets are built */
        .equ ON, 224        /* nonzero: tracing is on (packets are written) */
        .equ SYSON, 232     /* the next rt_pge enables: tracing was on at the system call */
        .equ RANGEBYTES, 240 /* 16 x the address ranges traced (0: the whole program) */
        .equ RANGES, 256    /* their (start, end) pairs, up to MAXRANGES */
        .equ MAXRANGES, 128
        .equ CALLMODE, 2304 /* nonzero: traced are calls' extents (EXTENT) */
        .equ EXTENT, 2312   /* rsp at the traced call's entry */
        .equ POPPED, 2320   /* what the branch rt_tip goes to pops (a return's 8) */
        .equ BRANCHIP, 2328 /* the indirect branch rt_tip goes to (tpl_mark) */
        .equ SELF, 2336     /* the block's own address (the GS base) */
        .equ SAVE_RBX, 2344
        .equ TNTN, 2352     /* scratch: TNT packets being written */
        .equ TNTM, 2360     /* scratch: their stop bits */
        .equ RINGBASE, 2368 /* the thread's buffer: a ring of RINGSIZE bytes */
        .equ RINGSIZE, 2376
        .equ LAPEND, 2384   /* RINGBASE + RINGSIZE - SLACK: the ring's last room */
        .equ ENDBASE, 2392  /* END less DONE: LAPEND, less RINGSIZE a lap on */
        .equ DONE, 2400     /* bytes hwtrace copied out (laps x RINGSIZE + offset) */
        .equ LAPS, 2408     /* times the thread went round the ring */
        .equ WRAPEND, 2416  /* where the thread's last lap ended */
        .equ FASTEND, 2424  /* below it, the routines' fast paths (see RESTORE) */
        .equ FASTOK, 2432   /* nonzero: no ranges, calls or time points (hwtrace's) */
        .equ SHADOW, 4096   /* the return stack: 256 negated return addresses */
        .equ CONTS, 6144    /* beside each, where its return goes on (see tpl_push) */
        .equ ALT, 26        /* a redirected branch goes on ALT bytes before CONT */

.macro SAVE
        mov rcx, gs:[SELF]
        mov [rcx + SAVE_RBX], rbx
        mov rbx, rcx
        mov [rbx + SAVE_RAX], rax
        lahf
        seto al
        mov [rbx + SAVE_FL], ax
        mov [rbx + SAVE_RDX], rdx
        mov rcx, [rbx + CUR]
.endm

/* rcx: the new CUR (stored); flags and rax, rdx, rbx back; on to CONT.
 * The routines' fast paths (tracing on, nothing dropped, no ranges, calls
 * or time points, room and no PSB+ due) write their packets while CUR is
 * below FASTEND, which every other path sets again on its way out from
 * what decides it: min(END, NEXTPSB), or 0 (hwtrace writes 0 where it
 * changes any of them). */
.macro RESTORE
        mov rax, [rbx + END]
        mov rdx, [rbx + NEXTPSB]
        cmp rdx, rax
        cmovb rax, rdx
        xor edx, edx
        cmp qword ptr [rbx + OVF], 0
        cmovne rax, rdx
        cmp qword ptr [rbx + ON], 0
        cmove rax, rdx
        cmp qword ptr [rbx + FASTOK], 0
        cmove rax, rdx
        mov [rbx + FASTEND], rax
        RESTORE_FAST
.endm

/* RESTORE where nothing FASTEND depends on changed. */
.macro RESTORE_FAST
        mov [rbx + CUR], rcx
        mov rdx, [rbx + SAVE_RDX]
        mov ax, [rbx + SAVE_FL]
        add al, 0x7f
        sahf
        mov rax, [rbx + SAVE_RAX]
        mov rcx, [rbx + CONT]
        mov rbx, [rbx + SAVE_RBX]
        jmp rcx
.endm

/* The pending TNT bits as TNT-8 packets at rcx (6 bits each, as Intel's
 * processors write them: never larger than a TNT-64, smaller below 43
 * bits).  Up to six bits (most flushes before a TIP) are one byte, the
 * stop bit brought down onto the bits, with no branch on whether there
 * are any (none: the byte is written over).  More go without a branch on
 * how many: the 6-bit groups are spread into the bytes of one word in
 * three steps (24, 12 and 6 bits apart), shifted into place under their
 * stop bits, byte-swapped (oldest first) and stored at once; the bytes
 * past the packets are written over later. */
.macro FLUSH_TNT
        mov rax, [rbx + W]
        cmp rax, W0 << 7
        jae .Lflush_many\@
        mov qword ptr [rbx + W], W0
        mov edx, eax
        shr edx, 16             /* the stop bit above the n bits: 1 << n */
        or eax, edx
        add eax, eax            /* above the header's bit 0 */
        mov [rcx], al
        bsr edx, edx            /* n (0: W0, no packet) */
        add [rbx + TNTBITS], rdx
        cmp edx, 1
        sbb rcx, -1             /* rcx + 1 unless there were none */
        jmp .Lflush_done\@
.Lflush_many\@:
        mov qword ptr [rbx + W], W0
        bsr rdx, rax
        btc rax, rdx            /* the stop bit off: the bits, the oldest */
        sub edx, 16             /* highest, with zeros above them */
        bts rax, rdx            /* the last packet's stop bit above them */
        add [rbx + TNTBITS], rdx
        mov [rbx + TNTEND], rcx
        lea ecx, [rdx + 5]
        imul ecx, ecx, 43
        shr ecx, 8              /* ceil(bits / 6) packets (bits <= 47) */
        mov [rbx + TNTN], rcx
        imul edx, edx, 43
        shr edx, 8              /* floor(bits / 6): the full ones */
        lea ecx, [rdx * 8]
        mov edx, 1
        shl rdx, cl
        dec rdx
        movabs rcx, 0x8080808080808080
        and rdx, rcx            /* their stop bits (bit 7) */
        mov [rbx + TNTM], rdx
        mov rcx, rax            /* groups 4-7 to bytes 4-7 */
        shr rcx, 24
        shl rcx, 32
        and eax, 0xffffff
        or rax, rcx
        movabs rdx, 0x00fff00000fff000
        and rdx, rax            /* groups 2-3 of each half */
        shl rdx, 4
        movabs rcx, 0x00000fff00000fff
        and rax, rcx
        or rax, rdx
        movabs rdx, 0x0fc00fc00fc00fc0
        and rdx, rax            /* the odd group of each quarter */
        shl rdx, 2
        movabs rcx, 0x003f003f003f003f
        and rax, rcx
        or rax, rdx
        add rax, rax            /* each group above its header bit 0 */
        movabs rcx, 0x7e7e7e7e7e7e7e7e
        and rax, rcx
        or rax, [rbx + TNTM]
        bswap rax               /* the oldest packet first */
        mov rdx, [rbx + TNTN]
        lea ecx, [rdx * 8]
        neg ecx
        add ecx, 64
        shr rax, cl
        mov rcx, [rbx + TNTEND]
        mov [rcx], rax
        add rcx, rdx
.Lflush_done\@:
.endm

/* TIP with TARGET (the thread goes on there: NEXTIP). */
.macro TIP_PACKET
        inc qword ptr [rbx + TIPS]
        mov rax, [rbx + TARGET]
        IP_PACKET 0x0d
        mov rax, [rbx + TARGET]
        mov [rbx + NEXTIP], rax
.endm

/* An IP packet with opcode \op for the IP in rax, compressed against the
 * last IP as the SDM allows (hwtrace.pt.encode's choice). */
.macro IP_PACKET op
        mov rdx, [rbx + LASTIP]
        mov [rbx + LASTIP], rax
        xor rdx, rax
        shr rdx, 16
        jz 1f
        shr rdx, 16
        jz 2f
        mov rdx, rax
        sar rdx, 47
        jz 3f
        cmp rdx, -1
        je 3f
        mov byte ptr [rcx], \op | 0xc0
        mov [rcx + 1], rax
        add rcx, 9
        jmp 4f
1:      mov byte ptr [rcx], \op | 0x20
        mov [rcx + 1], ax
        add rcx, 3
        jmp 4f
2:      mov byte ptr [rcx], \op | 0x40
        mov [rcx + 1], eax
        add rcx, 5
        jmp 4f
3:      mov byte ptr [rcx], \op | 0x60
        mov [rcx + 1], rax
        add rcx, 7
4:
.endm

.macro TSC_PACKET
        cmp qword ptr [rbx + TSCON], 0
        je 5f
        rdtsc
        shl rdx, 32
        or rax, rdx
        shl rax, 8
        or rax, 0x19
        mov [rcx], rax
        add rcx, 8
5:
.endm

/* A TSC packet when TSCSTEP ticks went by since the last (the time points
 * MTC packets give a hardware trace; a TSC is what software can read). */
.macro TSC_IF_DUE
        cmp qword ptr [rbx + TSCSTEP], 0
        je .Ltsc_done\@
        rdtsc
        shl rdx, 32
        or rax, rdx
        cmp rax, [rbx + TSCNEXT]
        jb .Ltsc_done\@
        mov rdx, rax
        add rdx, [rbx + TSCSTEP]
        mov [rbx + TSCNEXT], rdx
        shl rax, 8
        or rax, 0x19
        mov [rcx], rax
        add rcx, 8
.Ltsc_done\@:
.endm

/* No compressed return to a call before this point. */
.macro RESET_RETSTACK
        movzx eax, byte ptr [rbx + SIDX]
        mov qword ptr [rbx + SHADOW + rax * 8], 0
.endm

/* PSB+ when due; with a FUP of NEXTIP when \fup (tracing is on). */
.macro PSB_IF_DUE fup
        cmp rcx, [rbx + NEXTPSB]
        jb 7f
        RESET_RETSTACK
        mov rax, 0x8202820282028202
        mov [rcx], rax
        mov [rcx + 8], rax
        add rcx, 16
        mov qword ptr [rbx + LASTIP], 0
        TSC_PACKET
        mov word ptr [rcx], 0x0199      /* MODE.Exec, 64-bit */
        add rcx, 2
.if \fup
        mov rax, [rbx + NEXTIP]
        IP_PACKET 0x1d
.endif
        mov word ptr [rcx], 0x2302      /* PSBEND */
        add rcx, 2
        mov rax, rcx
        add rax, [rbx + PSBPERIOD]
        mov [rbx + NEXTPSB], rax
7:
.endm

/* Room for a routine's packets, else drop them (counted, OVF due). */
.macro ROOM
        cmp rcx, [rbx + END]
        jb 6f
        MAKE_ROOM 6f
        DROP
        RESTORE
6:
.endm

/* rcx is at END: on to \room if hwtrace copied more out since END was
 * set (END moves to where its copy ends, less SLACK: the thread may be
 * RINGSIZE bytes ahead of hwtrace), or if the lap is over and the ring's
 * start is free (the thread goes on there; WRAPEND says where the lap
 * ended); else (full) on past the macro.  Only the thread writes END, CUR
 * and LAPS, only hwtrace DONE: hwtrace reads LAPS before CUR, so CUR is
 * stored first.  The buffer's pages stay mapped lap after lap, with no
 * page fault after the first. */
.macro MAKE_ROOM room
        mov rax, [rbx + DONE]
        add rax, [rbx + ENDBASE]
        cmp rax, [rbx + LAPEND]
        jb .Lend\@
        mov rax, [rbx + LAPEND]
        cmp rcx, rax
        jb .Lend\@
        mov [rbx + WRAPEND], rcx
        mov rax, [rbx + NEXTPSB]        /* as far from the next PSB+ */
        sub rax, rcx
        mov rcx, [rbx + RINGBASE]
        add rax, rcx
        mov [rbx + NEXTPSB], rax
        mov [rbx + CUR], rcx
        inc qword ptr [rbx + LAPS]
        mov rax, [rbx + RINGSIZE]
        sub [rbx + ENDBASE], rax
        mov rax, [rbx + DONE]
        add rax, [rbx + ENDBASE]
.Lend\@:
        mov [rbx + END], rax
        cmp rcx, rax
        jb \room
.endm

.macro DROP
        inc qword ptr [rbx + LOST]
        mov qword ptr [rbx + OVF], 1
        mov qword ptr [rbx + W], W0
.endm

/* Packets were dropped and there is room again (hwtrace drained the
 * buffer): on to \lost, which writes OVF (the TNT bits of the lost stretch
 * dropped too) and then, as the processor does, a FUP with the full IP
 * where tracing goes on, or nothing while tracing is off (the next
 * TIP.PGE). */
.macro OVERFLOWED lost
        cmp qword ptr [rbx + OVF], 0
        jne \lost
.endm

.macro OVF_PACKET
        mov word ptr [rcx], 0xf302
        add rcx, 2
        mov qword ptr [rbx + OVF], 0
        mov qword ptr [rbx + W], W0
        mov qword ptr [rbx + LASTIP], 0
        RESET_RETSTACK
.endm

/* The redirect table's slot for the key in \key: \slot at the entry
 * (the table's address in \base), on to \missing when there is none
 * (hwtrace's record.patch.layout.redirect_table writes it). */
.macro TABLE_PROBE key, slot, base, mask, missing
        imul \slot, \key, 0x5bd1e995
        shr \slot, 12
        and \slot, \mask
        shl \slot, 4
        add \slot, \base
1:      cmp [\slot], \key
        je 2f
        cmp qword ptr [\slot], 0
        je \missing
        add \slot, 16
        jmp 1b
2:
.endm

/* A target inside a window (or a block moved whole) would trap: go to its
 * copy in the trampoline instead (a table lookup, see hwtrace's
 * record.patch.tracer). */
.macro REDIRECT
        cmp qword ptr [rbx + RTABLE], 0
        je 3f
        mov rax, [rbx + TARGET]
        TABLE_PROBE rax, rdx, "[rbx + RTABLE]", "[rbx + RMASK]", 3f
        mov rax, [rdx + 8]
        mov [rbx + TARGET], rax
        sub qword ptr [rbx + CONT], ALT
        inc qword ptr [rbx + REDIRECTS]
3:
.endm

/* Tracing off at a branch to TARGET outside the ranges: the pending TNT,
 * TIP.PGD with the target (Intel PT's filter exit); with \fup, where the
 * code before TARGET falls through to it, FUP with it and TIP.PGD without
 * (as hwtrace.pt.encode writes a disable between two instructions). */
.macro LEAVE fup=0  /* 2: FUP BRANCHIP, TIP.PGD (tracing off before the branch) */
        mov qword ptr [rbx + ON], 0
        cmp rcx, [rbx + END]
        jb .Lleave_room\@
        MAKE_ROOM .Lleave_room\@
        DROP
        jmp .Lleave_done\@
.Lleave_room\@:
        cmp qword ptr [rbx + OVF], 0
        je .Lleave_pgd\@
        OVF_PACKET                  /* tracing off after it: no TIP.PGD */
        jmp .Lleave_done\@
.Lleave_pgd\@:
        FLUSH_TNT
        TSC_PACKET                  /* when it left: each stretch timed */
        mov rax, [rbx + TARGET]
.if \fup == 2
        mov rax, [rbx + BRANCHIP]
.endif
.if \fup
        IP_PACKET 0x1d
        mov byte ptr [rcx], 0x01
        inc rcx
.else
        IP_PACKET 0x01
.endif
        PSB_IF_DUE 0
.Lleave_done\@:
.endm

        .globl rt_begin
rt_begin:

/* 47 TNT bits pending: out as TNT-8s, then PSB+ if due (FUP: NEXTIP). */
rt_tnt_full:
        SAVE
        cmp rcx, [rbx + FASTEND]
        jae .Ltnt_slow
        FLUSH_TNT
        RESTORE_FAST
.Ltnt_slow:
        cmp qword ptr [rbx + ON], 0
        jne 1f
        mov qword ptr [rbx + W], W0     /* tracing is off: no packets */
        RESTORE
1:      ROOM
        OVERFLOWED .Ltnt_ovf
        FLUSH_TNT
        TSC_IF_DUE
        PSB_IF_DUE 1
        RESTORE
.Ltnt_ovf:
        OVF_PACKET
        mov rax, [rbx + NEXTIP]
        IP_PACKET 0x1d
        RESTORE

/* TIP to TARGET, after the pending TNT; PSB+ if due (FUP: TARGET). */
rt_tip:
        mov qword ptr gs:[POPPED], 0
.Ltip:
        SAVE
        cmp rcx, [rbx + FASTEND]
        jae .Ltip_slow
        FLUSH_TNT
        TIP_PACKET
        REDIRECT
        RESTORE_FAST
.Ltip_slow:
        cmp qword ptr [rbx + ON], 0
        jne 8f
        mov qword ptr [rbx + W], W0     /* tracing is off: no packets */
        REDIRECT
        RESTORE
8:      cmp qword ptr [rbx + CALLMODE], 0
        je 10f
        mov rax, [rbx + POPPED]
        add rax, rsp
        cmp rax, [rbx + EXTENT]
        jbe 10f
        cmp qword ptr [rbx + POPPED], 0
        jne .Ltip_leave             /* the return leaves the call */
        LEAVE 2                     /* the stack rose before this branch */
        REDIRECT
        RESTORE
10:     mov rdx, [rbx + RANGEBYTES]
        test rdx, rdx
        jz 5f
        mov rax, [rbx + TARGET]
9:      sub rdx, 16
        jb .Ltip_leave              /* in no range: tracing goes off */
        cmp rax, [rbx + RANGES + rdx]
        jb 9b
        cmp rax, [rbx + RANGES + 8 + rdx]
        jae 9b
5:      cmp rcx, [rbx + END]
        jb 6f
        MAKE_ROOM 6f
        DROP
        REDIRECT
        RESTORE
.Ltip_ovf:
        OVF_PACKET                  /* on at TARGET: its FUP, no TIP */
        mov rax, [rbx + TARGET]
        IP_PACKET 0x1d
        REDIRECT
        RESTORE
6:      OVERFLOWED .Ltip_ovf
        FLUSH_TNT
        TSC_IF_DUE
        TIP_PACKET
        PSB_IF_DUE 1
        REDIRECT
        RESTORE
.Ltip_leave:
        LEAVE
        REDIRECT
        RESTORE

/* rt_tip for a return (it pops its address). */
rt_tip_ret:
        mov qword ptr gs:[POPPED], 8
        jmp .Ltip

/* A direct branch leaving the ranges, to TARGET (tpl_leave). */
rt_leave:
        SAVE
        cmp qword ptr [rbx + ON], 0
        je .Lleave_off
        LEAVE
.Lleave_off:
        RESTORE

/* The ranges' code falling through to TARGET, outside them. */
rt_leave_fup:
        SAVE
        cmp qword ptr [rbx + ON], 0
        je .Lleave_fup_off
        LEAVE 1
.Lleave_fup_off:
        RESTORE


/* Tracing off before a system call: the pending TNT, TSC, TIP.PGD with
 * the IP suppressed (the target is in the kernel, not traced). */
rt_pgd:
        mov gs:[SYSNR], rax
        mov gs:[SYSARG], rdx
        SAVE
        /* rt_sigreturn goes back where the signal came: hwtrace follows it
         * to the system call's exit to enable tracing there. */
        cmp qword ptr [rbx + SYSNR], 15
        jne 1f
        .globl rt_sigreturn_notify
rt_sigreturn_notify:
        int3
1:      mov rax, [rbx + ON]
        mov [rbx + SYSON], rax
        test rax, rax
        jnz 2f
        RESTORE                     /* tracing is off: it stays off */
2:      mov qword ptr [rbx + ON], 0
        ROOM
        OVERFLOWED .Lpgd_ovf
        FLUSH_TNT
        TSC_PACKET
        mov byte ptr [rcx], 0x01
        inc rcx
        PSB_IF_DUE 0
        RESTORE
.Lpgd_ovf:
        OVF_PACKET                  /* tracing off after it: no TIP.PGD */
        RESTORE

/* Tracing on again at NEXTIP: PSB+ if due, TSC, MODE.Exec, TIP.PGE. */
rt_pge:
        SAVE
        /* Code mapped executable (mmap, mprotect, pkey_mprotect): hwtrace
         * patches it before the program can run it. */
        mov rax, [rbx + SYSNR]
        cmp rax, 9
        je 1f
        cmp rax, 10
        je 1f
        cmp rax, 329
        jne 3f
1:      test byte ptr [rbx + SYSARG], 4
        jz 3f
        cmp qword ptr [rbx + SAVE_RAX], -4095
        jae 3f
        .globl rt_notify
rt_notify:
        int3
3:      mov qword ptr [rbx + SYSNR], -1
        cmp qword ptr [rbx + SYSON], 0
        jne 4f
        RESTORE                     /* tracing was off: it stays off */
4:      mov qword ptr [rbx + SYSON], 0
        mov qword ptr [rbx + ON], 1
        mov qword ptr [rbx + W], W0     /* bits gathered while off are dropped */
        ROOM
        OVERFLOWED .Lpge_ovf
.Lpge_on:
        RESET_RETSTACK
        PSB_IF_DUE 0
        TSC_PACKET
        inc qword ptr [rbx + PGES]
        mov word ptr [rcx], 0x0199
        add rcx, 2
        mov rax, [rbx + NEXTIP]
        IP_PACKET 0x11
        RESTORE
.Lpge_ovf:
        OVF_PACKET
        jmp .Lpge_on

/* An asynchronous disable where a signal interrupts the thread at NEXTIP:
 * the pending TNT, FUP, TIP.PGD; then stops for hwtrace (CONT: rt_halt). */
rt_async_off:
        mov gs:[SAVE_RCX], rcx
        mov qword ptr gs:[ON], 0
        SAVE
        ROOM
        OVERFLOWED .Loff_ovf
        FLUSH_TNT
        mov rax, [rbx + NEXTIP]
        IP_PACKET 0x1d
        mov byte ptr [rcx], 0x01
        inc rcx
        PSB_IF_DUE 0
        jmp .Loff_done
.Loff_ovf:
        OVF_PACKET                  /* tracing off after it: no FUP, TIP.PGD */
.Loff_done:
        mov qword ptr [rbx + FASTEND], 0
        mov [rbx + CUR], rcx
        mov rcx, [rbx + SAVE_RCX]
        mov rdx, [rbx + SAVE_RDX]
        mov ax, [rbx + SAVE_FL]
        add al, 0x7f
        sahf
        mov rax, [rbx + SAVE_RAX]
        mov rbx, [rbx + SAVE_RBX]
        .globl rt_halt
rt_halt:
        int3

/* A thread starts being traced at NEXTIP and goes on at TARGET. */
rt_start:
        mov gs:[SAVE_RCX], rcx
        mov qword ptr gs:[SYSON], 1
        lea rcx, [rip + 2f]
        mov gs:[CONT], rcx
        jmp rt_pge
2:      mov rcx, gs:[SAVE_RCX]
        jmp qword ptr gs:[TARGET]

/* SIGTRAP handler (sig, info, ucontext), for when hwtrace is not there to
 * send a thread on from an int3 of the patches: the int3's address is
 * looked up in the redirect table (which also holds the runtime's own
 * int3s, continuing after them); an int3 that is not hwtrace's gets the
 * default action (the handler is removed and the int3 runs again). */
        .equ UC_RIP, 168
rt_trap_handler:
        mov rax, [rdx + UC_RIP]
        cmp dword ptr [rsi + 8], 0x80   /* si_code SI_KERNEL: an int3 */
        jne 8f
        dec rax
        mov r8, gs:[RTABLE]
        test r8, r8
        jz 9f
        TABLE_PROBE rax, rcx, r8, "gs:[RMASK]", 9f
        mov rax, [rcx + 8]
        mov [rdx + UC_RIP], rax
        ret
9:      mov [rdx + UC_RIP], rax
8:      sub rsp, 40
        xor eax, eax
        mov [rsp], rax          /* struct sigaction: SIG_DFL, no flags */
        mov [rsp + 8], rax
        mov [rsp + 16], rax
        mov [rsp + 24], rax
        mov edi, 5              /* SIGTRAP */
        mov rsi, rsp
        xor edx, edx
        mov r10d, 8
        mov eax, 13             /* rt_sigaction */
        syscall
        add rsp, 40
        ret

        .globl rt_restorer
rt_restorer:
        mov eax, 15             /* rt_sigreturn */
        syscall

/* hwtrace's own system calls in a running program go here (never run by
 * the program's code). */
        .globl rt_syscall
rt_syscall:
        syscall
        int3

        .globl rt_end
rt_end:

/* ---- trampoline templates (fields: F_<template>_<name>) ---- */

/* The head of an indirect branch's trampoline (its operand is loaded next). */
        .globl tpl_head
tpl_head:
        mov gs:[SAVE_RCX], rcx
tpl_head_end:

/* Appends bit \bit; a full TNT goes out with NEXTIP = \ip's field.  W is
 * reached through a base register (the block's SELF, rdx saved beside
 * rcx): the processor then forwards each branch's store of W to the next
 * branch's load at no cost, where a GS-relative address is a full
 * store-to-load round trip per branch (a few cycles on AMD Zen; see the
 * optimization guides' "memory renaming"). */
.macro TNT_BIT tpl, bit, ip, rt, dst
        mov gs:[SAVE_RCX], rcx
        mov rcx, gs:[SELF]
        mov [rcx + SAVE_RDX], rdx
        mov rdx, rcx
        mov rcx, [rdx + W]
        lea rcx, [rcx + rcx + \bit]
        mov [rdx + W], rcx
        bswap rcx                       /* W's top byte, flag-free */
        movzx ecx, cl
        jrcxz 2f
        mov rdx, [rdx + SAVE_RDX]
        lea rcx, [rip + 3f]
        mov gs:[CONT], rcx
        movabs rcx, 0
        .equ \ip, . - 8 - \tpl
        mov gs:[NEXTIP], rcx
        .byte 0xe9
        .long 0
        .equ \rt, . - 4 - \tpl
3:      mov rdx, gs:[SELF]
2:      mov rcx, [rdx + SAVE_RCX]
        mov rdx, [rdx + SAVE_RDX]
        .byte 0xe9
        .long 0
        .equ \dst, . - 4 - \tpl
.endm

/* A conditional branch's TNT bits: after the site's own condition as a
 * rel8 branch over the not-taken bit's code, that code, then the taken
 * bit's; each the flag-free template or, where the flags are dead at its
 * destination, the shift. */
        .globl tpl_bit1
tpl_bit1:
        TNT_BIT tpl_bit1, 1, F_bit1_ip, F_bit1_rt, F_bit1_dst
tpl_bit1_end:

        .globl tpl_bit0
tpl_bit0:
        TNT_BIT tpl_bit0, 0, F_bit0_ip, F_bit0_rt, F_bit0_dst
tpl_bit0_end:

/* Appends bit \bit where the flags are dead: one read-modify-write of W
 * through GS, its overflow flag set when the stop bit reached bit 63. */
.macro TNT_SHIFT tpl, bit, ip, rt, dst
.if \bit
        stc
        rcl qword ptr gs:[W], 1
.else
        shl qword ptr gs:[W], 1
.endif
        jo 3f
5:      .byte 0xe9
        .long 0
        .equ \dst, . - 4 - \tpl
3:      mov gs:[SAVE_RCX], rcx
        lea rcx, [rip + 4f]
        mov gs:[CONT], rcx
        movabs rcx, 0
        .equ \ip, . - 8 - \tpl
        mov gs:[NEXTIP], rcx
        .byte 0xe9
        .long 0
        .equ \rt, . - 4 - \tpl
4:      mov rcx, gs:[SAVE_RCX]
        jmp 5b
.endm

        .globl tpl_shift1
tpl_shift1:
        TNT_SHIFT tpl_shift1, 1, F_shift1_ip, F_shift1_rt, F_shift1_dst
tpl_shift1_end:

        .globl tpl_shift0
tpl_shift0:
        TNT_SHIFT tpl_shift0, 0, F_shift0_ip, F_shift0_rt, F_shift0_dst
tpl_shift0_end:

/* The target in rcx to rt_tip, which goes on at the next label 2. */
.macro TO_TIP tpl, rt
        mov gs:[TARGET], rcx
        lea rcx, [rip + 2f]
        mov gs:[CONT], rcx
        .byte 0xe9
        .long 0
        .equ \rt, . - 4 - \tpl
.endm

/* After `mov gs:[SAVE_RCX], rcx; mov rcx, <the branch's operand>`. */
        .globl tpl_ijmp
tpl_ijmp:
        TO_TIP tpl_ijmp, F_ijmp_rt
1:      mov rcx, gs:[SAVE_RCX]
        jmp qword ptr gs:[TARGET]
        .fill ALT - (. - 1b), 1, 0xcc
2:      mov rcx, gs:[SAVE_RCX]
        jmp qword ptr gs:[TARGET]
tpl_ijmp_end:

        .globl tpl_icall
tpl_icall:
        TO_TIP tpl_icall, F_icall_rt
1:      mov rcx, gs:[SAVE_RCX]
        push qword ptr [rip + 3f]
        jmp qword ptr gs:[TARGET]
        .fill ALT - (. - 1b), 1, 0xcc
2:      mov rcx, gs:[SAVE_RCX]
        push qword ptr [rip + 3f]
        jmp qword ptr gs:[TARGET]
3:      .quad 0
        .equ F_icall_ret, . - 8 - tpl_icall
tpl_icall_end:

/* A call's push onto the return stack (see the top), before the call:
 * the call itself runs in place after it (a jump back) or moved (tpl_call);
 * an indirect call's template follows it. */
        .globl tpl_push
tpl_push:
        mov gs:[SAVE_RCX], rcx
        mov rcx, gs:[SELF]
        mov [rcx + SAVE_RAX], rax
        mov [rcx + SAVE_RDX], rdx
        movzx eax, byte ptr [rcx + SIDX]
        lea edx, [rax + 1 - 64 + 256]   /* the entry a decoder's stack drops */
        movzx edx, dl
        mov qword ptr [rcx + SHADOW + rdx * 8], 0
        lea eax, [rax + 1]
        mov [rcx + SIDX], al
        movzx eax, al
        movabs rdx, 0
        .equ F_push_neg, . - 8 - tpl_push
        mov [rcx + SHADOW + rax * 8], rdx
        movabs rdx, 0
        .equ F_push_cont, . - 8 - tpl_push
        mov [rcx + CONTS + rax * 8], rdx
        mov rax, [rcx + SAVE_RAX]
        mov rdx, [rcx + SAVE_RDX]
        mov rcx, [rcx + SAVE_RCX]
tpl_push_end:

/* A direct call moved into its trampoline (after tpl_push): the return
 * address is the original's. */
        .globl tpl_call
tpl_call:
        push qword ptr [rip + 3f]
        .byte 0xe9
        .long 0
        .equ F_call_dst, . - 4 - tpl_call
3:      .quad 0
        .equ F_call_ret, . - 8 - tpl_call
tpl_call_end:

/* Followed by the site's own ret (or ret imm16), which the compressed
 * path also ends with (F_ret_ret: 3 bytes).  A return to the top entry's
 * address pops it and appends a taken bit (flag-free, as TNT_BIT); any
 * other return is a TIP. */
        .globl tpl_ret
tpl_ret:
        mov gs:[SAVE_RCX], rcx
        mov rcx, gs:[SELF]
        mov [rcx + SAVE_RAX], rax
        mov [rcx + SAVE_RDX], rdx
        mov rdx, rcx
        movzx eax, byte ptr [rdx + SIDX]
        mov rcx, [rdx + SHADOW + rax * 8]
        mov rax, [rsp]
        lea rcx, [rcx + rax]
        jrcxz 5f
        mov rax, [rdx + SAVE_RAX]
        mov rdx, [rdx + SAVE_RDX]
        mov rcx, [rsp]
        TO_TIP tpl_ret, F_ret_rt
5:      movzx eax, byte ptr [rdx + SIDX]
        lea ecx, [rax - 1]
        mov [rdx + SIDX], cl
        mov rcx, [rdx + W]
        lea rcx, [rcx + rcx + 1]
        mov [rdx + W], rcx
        bswap rcx                       /* W's top byte, flag-free */
        movzx ecx, cl
        jrcxz 6f
        mov rcx, [rsp]
        mov [rdx + NEXTIP], rcx
        mov rax, [rdx + SAVE_RAX]
        mov rdx, [rdx + SAVE_RDX]
        lea rcx, [rip + 7f]
        mov gs:[CONT], rcx
        .byte 0xe9
        .long 0
        .equ F_ret_trt, . - 4 - tpl_ret
7:      mov rdx, gs:[SELF]
        movzx eax, byte ptr [rdx + SIDX]
        lea eax, [rax + 1]              /* the entry popped */
        movzx eax, al
6:      mov rcx, [rdx + CONTS + rax * 8] /* an int3 at the return address: its copy */
        mov rax, [rdx + SAVE_RAX]
        jrcxz 8f
        mov [rdx + TARGET], rcx
        mov rdx, [rdx + SAVE_RDX]
        jmp 1f
8:      mov rcx, [rdx + SAVE_RCX]
        mov rdx, [rdx + SAVE_RDX]
        .byte 0xcc, 0xcc, 0xcc
        .equ F_ret_ret, . - 3 - tpl_ret
1:      mov rcx, gs:[SAVE_RCX]
        lea rsp, [rsp + 0x1000]         /* the return's pop (8 + its immediate) */
        .equ F_ret_pop, . - 4 - tpl_ret
        jmp qword ptr gs:[TARGET]
        .fill ALT - (. - 1b), 1, 0xcc
2:      mov rcx, gs:[SAVE_RCX]
tpl_ret_end:

/* A range's entry point (its start, a call's return address): TIP.PGE at
 * the field's IP where tracing is off.  The entry's instructions follow. */
        .globl tpl_enter
tpl_enter:
        mov gs:[SAVE_RCX], rcx
        mov rcx, gs:[ON]
        jrcxz 1f
        mov rcx, gs:[SAVE_RCX]
        jmp 2f
1:      movabs rcx, 0
        .equ F_enter_ip, . - 8 - tpl_enter
        mov gs:[NEXTIP], rcx
        mov gs:[EXTENT], rsp
        mov qword ptr gs:[SYSON], 1
        lea rcx, [rip + 3f]
        mov gs:[CONT], rcx
        .byte 0xe9
        .long 0
        .equ F_enter_rt, . - 4 - tpl_enter
3:      mov rcx, gs:[SAVE_RCX]
2:
tpl_enter_end:

/* Where the indirect branch after it is (for rt_tip: calls' extents). */
        .globl tpl_mark
tpl_mark:
        mov gs:[SAVE_RCX], rcx
        movabs rcx, 0
        .equ F_mark_ip, . - 8 - tpl_mark
        mov gs:[BRANCHIP], rcx
        mov rcx, gs:[SAVE_RCX]
tpl_mark_end:

/* A direct branch about to leave the ranges for the field's target: TIP.PGD
 * there (where tracing is on); the branch follows. */
        .globl tpl_leave
tpl_leave:
        mov gs:[SAVE_RCX], rcx
        movabs rcx, 0
        .equ F_leave_ip, . - 8 - tpl_leave
        mov gs:[TARGET], rcx
        lea rcx, [rip + 2f]
        mov gs:[CONT], rcx
        .byte 0xe9
        .long 0
        .equ F_leave_rt, . - 4 - tpl_leave
2:      mov rcx, gs:[SAVE_RCX]
tpl_leave_end:

/* A system call: TIP.PGD before, TIP.PGE at the next instruction after;
 * rcx as the kernel leaves it (the next instruction's address). */
        .globl tpl_sys
tpl_sys:
        mov gs:[SAVE_RCX], rcx
        lea rcx, [rip + 2f]
        mov gs:[CONT], rcx
        .byte 0xe9
        .long 0
        .equ F_sys_pgd, . - 4 - tpl_sys
2:      mov rcx, gs:[SAVE_RCX]
        .equ F_sys_syscall, . - tpl_sys
        syscall
        movabs rcx, 0
        .equ F_sys_next1, . - 8 - tpl_sys
        mov gs:[NEXTIP], rcx
        lea rcx, [rip + 3f]
        mov gs:[CONT], rcx
        .byte 0xe9
        .long 0
        .equ F_sys_pge, . - 4 - tpl_sys
3:      movabs rcx, 0
        .equ F_sys_next2, . - 8 - tpl_sys
        .byte 0xe9
        .long 0
        .equ F_sys_dst, . - 4 - tpl_sys
tpl_sys_end:
