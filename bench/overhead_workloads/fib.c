/* Call-heavy recursion: Ackermann's function and a naive Fibonacci.
 *
 * Almost every block ends in a call or a return: the case where a tracer
 * that records returns (or a shadow stack) pays the most.  Both recursions
 * take their sizes from the command line so the compiler cannot fold them;
 * noinline keeps gcc from unrolling fib's recursion into loops.  Prints
 * the results.
 *
 *     fib N M        (fib(N) and ackermann(2, M); N = 39, M = 2000 runs
 *                     about half a second at -O2)
 */
#include <stdio.h>
#include <stdlib.h>

/* Modulo a prime: gcc turns `fib(n - 1) + fib(n - 2)` into a loop around one
 * call (an accumulator), which it cannot do through the modulo. */
__attribute__((noinline)) static unsigned long fib(unsigned n) {
    return n < 2 ? n : (fib(n - 1) + fib(n - 2)) % 1000000007ul;
}

__attribute__((noinline)) static unsigned long ack(unsigned long m, unsigned long n) {
    if (m == 0)
        return n + 1;
    if (n == 0)
        return ack(m - 1, 1);
    return ack(m - 1, ack(m, n - 1));
}

int main(int argc, char **argv) {
    unsigned n = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 39;
    unsigned long m = argc > 2 ? strtoul(argv[2], NULL, 10) : 2000;
    unsigned long f = fib(n);
    unsigned long a = 0;
    for (unsigned long k = 0; k <= m; k += 50)
        a += ack(2, k);
    printf("fib(%u)=%lu ack-sum(2, 0..%lu)=%lu\n", n, f, m, a);
    return 0;
}
