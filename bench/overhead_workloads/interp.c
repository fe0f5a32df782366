/* A bytecode interpreter: a register machine with a switch dispatch.
 *
 * The classic hard case for branch prediction and for branch tracers: one
 * indirect jump (the switch) per bytecode, to a target that depends on the
 * program, plus the program's own conditional jumps.  The bytecode (an LCG
 * feeding a small histogram, with a data-dependent branch per iteration)
 * is built at run time so the compiler cannot fold it.  Prints a checksum.
 *
 *     interp N        (N = 30000000 iterations runs about half a second at -O2)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum op { LOADI, ADD, SUB, MUL, AND, XOR, SHR, LOAD, STORE, JLT, JODD, JMP, HALT };

struct insn {
    uint8_t op, a, b, c; /* c: a register, or unused */
    int32_t imm;         /* an immediate, or a jump target */
};

static uint64_t run(const struct insn *code, uint64_t *reg, uint64_t *mem) {
    size_t pc = 0;
    for (;;) {
        const struct insn *i = &code[pc++];
        switch (i->op) {
        case LOADI: reg[i->a] = (uint64_t)(int64_t)i->imm; break;
        case ADD: reg[i->a] = reg[i->b] + reg[i->c]; break;
        case SUB: reg[i->a] = reg[i->b] - reg[i->c]; break;
        case MUL: reg[i->a] = reg[i->b] * reg[i->c]; break;
        case AND: reg[i->a] = reg[i->b] & reg[i->c]; break;
        case XOR: reg[i->a] = reg[i->b] ^ reg[i->c]; break;
        case SHR: reg[i->a] = reg[i->b] >> (reg[i->c] & 63); break;
        case LOAD: reg[i->a] = mem[reg[i->b] & 1023]; break;
        case STORE: mem[reg[i->b] & 1023] = reg[i->a]; break;
        case JLT: if (reg[i->a] < reg[i->b]) pc = (size_t)i->imm; break;
        case JODD: if (reg[i->a] & 1) pc = (size_t)i->imm; break;
        case JMP: pc = (size_t)i->imm; break;
        case HALT: return reg[i->a];
        default: abort();
        }
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? strtol(argv[1], NULL, 10) : 30000000;
    /* r0 i, r1 n, r2 x, r3 acc, r4 mult, r5 inc, r6 one, r7 tmp, r8 shift */
    const struct insn code[] = {
        /* 0 */ {LOADI, 0, 0, 0, 0},
        /* 1 */ {LOADI, 1, 0, 0, (int32_t)n},
        /* 2 */ {LOADI, 2, 0, 0, 12345},
        /* 3 */ {LOADI, 3, 0, 0, 0},
        /* 4 */ {LOADI, 4, 0, 0, 1103515245},
        /* 5 */ {LOADI, 5, 0, 0, 12345},
        /* 6 */ {LOADI, 6, 0, 0, 1},
        /* 7 */ {LOADI, 8, 0, 0, 16},
        /* loop: x = x * mult + inc; tmp = x >> 16 */
        /* 8 */ {MUL, 2, 2, 4, 0},
        /* 9 */ {ADD, 2, 2, 5, 0},
        /* 10 */ {SHR, 7, 2, 8, 0},
        /* 11 */ {JODD, 7, 0, 0, 16},
        /* even: acc ^= i; mem[tmp] += i */
        /* 12 */ {XOR, 3, 3, 0, 0},
        /* 13 */ {LOAD, 9, 7, 0, 0},
        /* 14 */ {ADD, 9, 9, 0, 0},
        /* 15 */ {JMP, 0, 0, 0, 19},
        /* odd: acc += tmp; mem[tmp] -= 1 */
        /* 16 */ {ADD, 3, 3, 7, 0},
        /* 17 */ {LOAD, 9, 7, 0, 0},
        /* 18 */ {SUB, 9, 9, 6, 0},
        /* join */
        /* 19 */ {STORE, 9, 7, 0, 0},
        /* 20 */ {ADD, 0, 0, 6, 0},
        /* 21 */ {JLT, 0, 1, 0, 8},
        /* 22 */ {HALT, 3, 0, 0, 0},
    };
    uint64_t reg[16] = {0};
    static uint64_t mem[1024];
    uint64_t acc = run(code, reg, mem);
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < 1024; k++)
        h = (h ^ mem[k]) * 1099511628211ull;
    printf("interp n=%ld acc=%016llx mem=%016llx\n", n, (unsigned long long)acc,
           (unsigned long long)h);
    return 0;
}
