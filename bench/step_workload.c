/* The stepping benchmark's workload: one function of plain computation
 * (loops and branches, no calls), stepped from its entry to its return. */
#include <stdlib.h>

__attribute__((noinline)) unsigned long hot(unsigned long n) {
    unsigned long x = 88172645463325252UL, s = 0;
    for (unsigned long i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (x & 1)
            s += x >> 3;
        else
            s ^= x;
    }
    return s;
}

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], 0, 0) : 1000;
    return (int)(hot(n) & 0x7f);
}
