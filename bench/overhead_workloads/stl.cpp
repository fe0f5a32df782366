// C++ library code: std::map, std::vector, std::string, and throw/catch.
//
// A word-frequency index over generated text (string building, map
// lookups and inserts: allocator and red-black-tree code in libstdc++),
// sorted by count (std::sort with a lambda), and a parser that throws on
// every bad token (the unwinder: libgcc's personality routine and DWARF
// CFI walk, code a tracer sees through calls, returns and indirect jumps
// that plain C loops never take).  Prints a checksum.
//
//     stl N        (N = 300000 lines runs about half a second at -O2)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct BadToken : std::runtime_error {
    explicit BadToken(const std::string &t) : std::runtime_error("bad token: " + t) {}
};

uint64_t lcg(uint64_t &s) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s >> 33;
}

const char *const kSyllables[] = {"ka", "lo", "mi", "ne", "su", "ta", "ro", "vi", "ze", "qu"};

std::string word(uint64_t &s) {
    std::string w;
    for (unsigned k = 0, n = 1 + lcg(s) % 3; k < n; k++)
        w += kSyllables[lcg(s) % 10];
    return w;
}

// A number, or throws: every token with a 'q' is "bad".
long parse(const std::string &t) {
    if (t.find('q') != std::string::npos)
        throw BadToken(t);
    long v = 0;
    for (char c : t)
        v = v * 31 + c;
    return v;
}

}  // namespace

int main(int argc, char **argv) {
    long lines = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 300000;
    uint64_t seed = 42;
    std::map<std::string, long> counts;
    long errors = 0, total = 0, what = 0;
    for (long i = 0; i < lines; i++) {
        std::vector<std::string> tokens;
        for (unsigned k = 0, n = 4 + lcg(seed) % 6; k < n; k++)
            tokens.push_back(word(seed));
        for (const std::string &t : tokens) {
            counts[t]++;
            try {
                total += parse(t);
            } catch (const BadToken &e) {
                errors++;
                what += static_cast<long>(std::string(e.what()).size());
            }
        }
    }
    std::vector<std::pair<std::string, long>> byCount(counts.begin(), counts.end());
    std::sort(byCount.begin(), byCount.end(), [](const auto &a, const auto &b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    uint64_t h = 1469598103934665603ull;
    for (const auto &[w, c] : byCount)
        for (char ch : w + ":" + std::to_string(c))
            h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
    std::printf("stl lines=%ld words=%zu top=%s:%ld errors=%ld/%ld total=%ld hash=%016llx\n", lines,
                byCount.size(), byCount[0].first.c_str(), byCount[0].second, errors, what, total,
                static_cast<unsigned long long>(h));
    return 0;
}
