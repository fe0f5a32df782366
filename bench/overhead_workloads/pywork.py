"""A pure-Python workload for the overhead benchmark: CPython's interpreter.

N-queens by backtracking (recursion, list and set operations), then a
word count over generated text (string methods, dict updates, sorting):
CPython's evaluation loop and object code, a large and branchy program.
Prints a checksum.  About half a second natively.

    python3 pywork.py [N [LINES]]    (N queens, default 10; LINES of text, default 150000)
"""

import sys
import zlib


def queens(n: int) -> int:
    def place(row: int, cols: set[int], diag1: set[int], diag2: set[int]) -> int:
        if row == n:
            return 1
        found = 0
        for c in range(n):
            if c in cols or row + c in diag1 or row - c in diag2:
                continue
            cols.add(c)
            diag1.add(row + c)
            diag2.add(row - c)
            found += place(row + 1, cols, diag1, diag2)
            cols.remove(c)
            diag1.remove(row + c)
            diag2.remove(row - c)
        return found

    return place(0, set(), set(), set())


def word_counts(lines: int) -> list[tuple[str, int]]:
    syllables = ["ka", "lo", "mi", "ne", "su", "ta", "ro", "vi", "ze", "qu"]
    state = 42
    counts: dict[str, int] = {}
    for _ in range(lines):
        words = []
        for _ in range(6):
            state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            w = syllables[(state >> 33) % 10] + syllables[(state >> 40) % 10]
            words.append(w.upper() if state & 1 else w)
        for w in " ".join(words).lower().split():
            counts[w] = counts.get(w, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    lines = int(sys.argv[2]) if len(sys.argv) > 2 else 150000
    solutions = queens(n)
    ranked = word_counts(lines)
    digest = zlib.crc32(repr(ranked).encode())
    print(
        f"queens({n})={solutions} lines={lines} words={len(ranked)} top={ranked[0]} crc={digest:08x}"
    )


main()
