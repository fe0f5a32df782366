/* hwtrace's demo program: a small workload with a function worth tracing.
 * `make demo` records `checksum` (and what it calls) and reports on it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOINLINE __attribute__((noinline))

NOINLINE static unsigned mix(unsigned h, unsigned char c) {
    h ^= c;
    return h * 16777619u;
}

NOINLINE static unsigned digest(const char *s) {
    unsigned h = 2166136261u;
    while (*s)
        h = mix(h, (unsigned char)*s++);
    return h;
}

static int by_value(const void *a, const void *b) {
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    return (x > y) - (x < y);
}

/* The traced function: digests some words (own code), sorts them (libc's
 * qsort, which calls back into by_value) and formats a line (libc). */
NOINLINE unsigned checksum(int n) {
    static const char *words[] = {"trace", "every", "instruction", "without",
                                  "slowing", "the", "system", "down"};
    unsigned h[64];
    char line[64];
    for (int i = 0; i < n; i++)
        h[i] = digest(words[i % 8]) + (unsigned)i;
    qsort(h, (size_t)n, sizeof h[0], by_value);
    snprintf(line, sizeof line, "%08x", h[0] ^ h[n - 1]);
    return (unsigned)strlen(line) + h[n / 2];
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 24;
    if (n < 1 || n > 64)
        n = 24;
    printf("checksum(%d) = %08x\n", n, checksum(n));
    return 0;
}
