/* Branchy integer kernel: the Collatz stopping times of 1..N and a sort.
 *
 * Every step is a data-dependent branch (odd or even), and the insertion
 * sort of the step counts branches on each comparison: a conditional-branch
 * heavy loop, the case where a branch tracer writes the most per
 * instruction.  Prints a checksum of the step counts and the sorted order.
 *
 *     collatz N        (N = 1500000 runs about half a second at -O2)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint32_t steps(uint64_t n) {
    uint32_t k = 0;
    while (n != 1) {
        if (n & 1)
            n = 3 * n + 1;
        else
            n >>= 1;
        k++;
    }
    return k;
}

/* Shell sort with gaps from Ciura's sequence: branchy, data-dependent. */
static void shell_sort(uint32_t *a, size_t n) {
    static const size_t gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
    for (size_t g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
        size_t gap = gaps[g];
        for (size_t i = gap; i < n; i++) {
            uint32_t v = a[i];
            size_t j = i;
            while (j >= gap && a[j - gap] > v) {
                a[j] = a[j - gap];
                j -= gap;
            }
            a[j] = v;
        }
    }
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1500000;
    uint32_t *k = malloc(n * sizeof *k);
    if (k == NULL)
        return 1;
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        k[i] = steps(i + 1);
        sum += k[i];
    }
    shell_sort(k, n);
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the sorted counts */
    for (size_t i = 0; i < n; i += 97)
        h = (h ^ k[i]) * 1099511628211ull;
    printf("collatz n=%zu steps=%llu max=%u hash=%016llx\n", n, (unsigned long long)sum,
           k[n - 1], (unsigned long long)h);
    free(k);
    return 0;
}
