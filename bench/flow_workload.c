/*
 * flow_workload - the program whose execution bench/bench_flow.py traces.
 *
 * A freestanding x86-64 program (no libc, no system calls) that runs under
 * the unicorn emulator: bench_flow.py maps its PT_LOAD segments, points the
 * stack somewhere, starts at _start and stops when execution reaches
 * `workload_done`.  The result is left in `workload_result`.
 *
 * The work is chosen for varied control flow, so the instruction-flow
 * decoders meet every kind of branch that real compiled code has:
 *
 *   - quicksort with an indirect comparator call, insertion sort for short
 *     runs (recursion, data-dependent conditional branches, indirect calls);
 *   - an open-addressing hash table (hashing loops, probe loops);
 *   - a binary search tree built and walked recursively (deep call/return
 *     chains, so return compression and its stack overflow both happen);
 *   - a bytecode interpreter with switch dispatch (a jump table: indirect
 *     jumps) and handlers called through a function-pointer table;
 *   - a tiny string scanner (short loops, byte compares).
 *
 * WORKLOAD_ROUNDS scales the run; bench_flow.py passes it with -D.
 *
 * Build (what bench_flow.py does):
 *   gcc -O2 -static -nostdlib -ffreestanding -fno-pie -no-pie
 *       -fno-builtin -fno-tree-loop-distribute-patterns
 *       -mstringop-strategy=loop -fcf-protection=none
 *       -fno-stack-protector -DWORKLOAD_ROUNDS=N -o flow_workload
 *       flow_workload.c
 * (the string-op flags keep `rep movs/stos` out: emulators and Intel PT
 * disagree on whether each repetition is an instruction).
 */

typedef unsigned long u64;
typedef unsigned int u32;
typedef unsigned char u8;

#ifndef WORKLOAD_ROUNDS
#define WORKLOAD_ROUNDS 8
#endif

/* Entry point: call the workload, then stop at workload_done. */
__asm__(".text\n"
	".globl _start\n"
	"_start:\n"
	"	call workload_main\n"
	".globl workload_done\n"
	"workload_done:\n"
	"	hlt\n"
	"	jmp workload_done\n");

volatile u64 workload_result;

/* --- pseudo-random numbers (xorshift64*) --------------------------------- */

static u64 rng_state = 0x9E3779B97F4A7C15ul;

static u64 rng(void)
{
	u64 x = rng_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545F4914F6CDD1Dul;
}

/* --- sorting -------------------------------------------------------------- */

#define SORT_N 2048

typedef int (*cmp_fn)(const u32 *, const u32 *);

static u32 sort_buf[SORT_N];

__attribute__((noinline)) static int cmp_asc(const u32 *a, const u32 *b)
{
	return (*a > *b) - (*a < *b);
}

__attribute__((noinline)) static int cmp_desc(const u32 *a, const u32 *b)
{
	return (*b > *a) - (*b < *a);
}

__attribute__((noinline)) static int cmp_low_bits(const u32 *a, const u32 *b)
{
	u32 x = *a & 0xff, y = *b & 0xff;

	if (x != y)
		return x < y ? -1 : 1;
	return cmp_asc(a, b);
}

static cmp_fn volatile comparators[3] = { cmp_asc, cmp_desc, cmp_low_bits };

static void insertion_sort(u32 *v, long n, cmp_fn cmp)
{
	for (long i = 1; i < n; ++i) {
		u32 key = v[i];
		long j = i - 1;

		while (j >= 0 && cmp(&v[j], &key) > 0) {
			v[j + 1] = v[j];
			--j;
		}
		v[j + 1] = key;
	}
}

__attribute__((noinline)) static void quicksort(u32 *v, long n, cmp_fn cmp)
{
	while (n > 12) {
		u32 pivot = v[n / 2];
		long i = 0, j = n - 1;

		for (;;) {
			while (cmp(&v[i], &pivot) < 0)
				++i;
			while (cmp(&v[j], &pivot) > 0)
				--j;
			if (i >= j)
				break;
			u32 t = v[i];
			v[i] = v[j];
			v[j] = t;
			++i;
			--j;
		}
		/* Recurse into the smaller half, loop on the larger. */
		if (j + 1 < n - j - 1) {
			quicksort(v, j + 1, cmp);
			v += j + 1;
			n -= j + 1;
		} else {
			quicksort(v + j + 1, n - j - 1, cmp);
			n = j + 1;
		}
	}
	insertion_sort(v, n, cmp);
}

static u64 sort_round(int round)
{
	cmp_fn cmp = comparators[round % 3];
	u64 check = 0;

	for (long i = 0; i < SORT_N; ++i)
		sort_buf[i] = (u32) rng();
	quicksort(sort_buf, SORT_N, cmp);
	for (long i = 1; i < SORT_N; ++i)
		if (cmp(&sort_buf[i - 1], &sort_buf[i]) > 0)
			check += 1000003;	/* never: the sort is correct */
	return check + sort_buf[SORT_N / 3];
}

/* --- hashing -------------------------------------------------------------- */

#define HASH_SLOTS 4096
#define HASH_KEYS 2600

struct slot {
	u64 key;
	u64 value;
	u8 used;
};

static struct slot table[HASH_SLOTS];

static u64 hash_bytes(const u8 *p, long n)
{
	u64 h = 0xcbf29ce484222325ul;	/* FNV-1a */

	for (long i = 0; i < n; ++i) {
		h ^= p[i];
		h *= 0x100000001b3ul;
	}
	return h;
}

static u64 hash_key(u64 key)
{
	u8 bytes[8];

	for (int i = 0; i < 8; ++i)
		bytes[i] = (u8) (key >> (8 * i));
	return hash_bytes(bytes, 1 + (long) (key & 7));
}

__attribute__((noinline)) static void hash_put(u64 key, u64 value)
{
	u64 i = hash_key(key) & (HASH_SLOTS - 1);

	while (table[i].used && table[i].key != key)
		i = (i + 1) & (HASH_SLOTS - 1);
	table[i].key = key;
	table[i].value = value;
	table[i].used = 1;
}

__attribute__((noinline)) static int hash_get(u64 key, u64 *value)
{
	u64 i = hash_key(key) & (HASH_SLOTS - 1);

	while (table[i].used) {
		if (table[i].key == key) {
			*value = table[i].value;
			return 1;
		}
		i = (i + 1) & (HASH_SLOTS - 1);
	}
	return 0;
}

static u64 hash_round(void)
{
	u64 sum = 0, v;

	for (long i = 0; i < HASH_SLOTS; ++i)
		table[i].used = 0;
	for (long i = 0; i < HASH_KEYS; ++i)
		hash_put(rng() % 5000, (u64) i);
	for (long i = 0; i < 2 * HASH_KEYS; ++i)
		if (hash_get(rng() % 5000, &v))
			sum += v;
		else
			sum ^= (u64) i;
	return sum;
}

/* --- a binary search tree ------------------------------------------------- */

#define TREE_NODES 3000

struct node {
	struct node *left, *right;
	u64 key;
};

static struct node nodes[TREE_NODES];
static long nodes_used;

static struct node *tree_insert(struct node *root, u64 key)
{
	if (!root) {
		struct node *n = &nodes[nodes_used++];

		n->left = n->right = 0;
		n->key = key;
		return n;
	}
	if (key < root->key)
		root->left = tree_insert(root->left, key);
	else
		root->right = tree_insert(root->right, key);
	return root;
}

__attribute__((noinline)) static u64 tree_walk(const struct node *n, int depth)
{
	if (!n)
		return (u64) depth;
	return tree_walk(n->left, depth + 1) * 3 + n->key +
	       tree_walk(n->right, depth + 1);
}

__attribute__((noinline)) static long tree_height(const struct node *n)
{
	if (!n)
		return 0;
	long l = tree_height(n->left), r = tree_height(n->right);

	return 1 + (l > r ? l : r);
}

static u64 tree_round(int round)
{
	struct node *root = 0;
	u64 run_base = 0;

	nodes_used = 0;
	for (long i = 0; i < TREE_NODES; ++i) {
		/* Every fourth round inserts runs of 80 ascending keys: list-like
		 * subtrees deeper than the 64-entry return-compression stack.
		 */
		if (i % 96 == 0)
			run_base = rng();
		u64 key = (round % 4 == 3 && i % 96 < 80) ? run_base + (u64) i : rng();

		root = tree_insert(root, key);
	}
	return tree_walk(root, 0) + (u64) tree_height(root);
}

/* --- a bytecode interpreter ----------------------------------------------- */

enum op {
	OP_PUSH, OP_LOAD, OP_STORE, OP_ADD, OP_SUB, OP_MUL, OP_XOR, OP_SHR,
	OP_JNZ, OP_DUP, OP_DROP, OP_CALLF, OP_HALT,
};

struct vm {
	long stack[64];
	long sp;
	long vars[8];
};

typedef long (*native_fn)(long);

__attribute__((noinline)) static long nat_square(long x)
{
	return x * x;
}

__attribute__((noinline)) static long nat_collatz(long x)
{
	long steps = 0;

	x = (x & 0xffff) + 1;
	while (x != 1 && steps < 40) {
		x = (x & 1) ? 3 * x + 1 : x / 2;
		++steps;
	}
	return steps;
}

__attribute__((noinline)) static long nat_popcount(long x)
{
	long c = 0;

	while (x) {
		x &= x - 1;
		++c;
	}
	return c;
}

static native_fn volatile natives[3] = { nat_square, nat_collatz, nat_popcount };

/* for (i = n; i; --i) acc = acc * 3 + native[i % 3](i ^ acc) ... */
static const long program[] = {
	OP_LOAD, 0, OP_STORE, 1,		/* i = n */
	/* loop (pc 4): */
	OP_LOAD, 2, OP_PUSH, 3, OP_MUL,		/* acc * 3 */
	OP_LOAD, 1, OP_LOAD, 2, OP_XOR,		/* i ^ acc */
	OP_CALLF, 0,
	OP_ADD,
	OP_LOAD, 1, OP_LOAD, 2, OP_XOR, OP_CALLF, 1, OP_ADD,
	OP_LOAD, 1, OP_CALLF, 2, OP_ADD,
	OP_PUSH, 7, OP_SHR, OP_STORE, 2,	/* acc = (...) >> 7 */
	OP_LOAD, 1, OP_PUSH, 1, OP_SUB, OP_DUP, OP_STORE, 1,
	OP_JNZ, 4,
	OP_LOAD, 2, OP_HALT,
};

__attribute__((noinline)) static long interpret(const long *code, long n)
{
	struct vm vm;
	long pc = 0, a, b;

	vm.sp = 0;
	for (int i = 0; i < 8; ++i)
		vm.vars[i] = 0;
	vm.vars[0] = n;
	for (;;) {
		switch (code[pc++]) {
		case OP_PUSH:
			vm.stack[vm.sp++] = code[pc++];
			break;
		case OP_LOAD:
			vm.stack[vm.sp++] = vm.vars[code[pc++]];
			break;
		case OP_STORE:
			vm.vars[code[pc++]] = vm.stack[--vm.sp];
			break;
		case OP_ADD:
			b = vm.stack[--vm.sp];
			a = vm.stack[--vm.sp];
			vm.stack[vm.sp++] = a + b;
			break;
		case OP_SUB:
			b = vm.stack[--vm.sp];
			a = vm.stack[--vm.sp];
			vm.stack[vm.sp++] = a - b;
			break;
		case OP_MUL:
			b = vm.stack[--vm.sp];
			a = vm.stack[--vm.sp];
			vm.stack[vm.sp++] = a * b;
			break;
		case OP_XOR:
			b = vm.stack[--vm.sp];
			a = vm.stack[--vm.sp];
			vm.stack[vm.sp++] = a ^ b;
			break;
		case OP_SHR:
			b = vm.stack[--vm.sp];
			a = vm.stack[--vm.sp];
			vm.stack[vm.sp++] = (long) ((u64) a >> b);
			break;
		case OP_JNZ:
			a = vm.stack[--vm.sp];
			if (a)
				pc = code[pc];
			else
				++pc;
			break;
		case OP_DUP:
			a = vm.stack[vm.sp - 1];
			vm.stack[vm.sp++] = a;
			break;
		case OP_DROP:
			--vm.sp;
			break;
		case OP_CALLF:
			a = vm.stack[--vm.sp];
			vm.stack[vm.sp++] = natives[code[pc++]](a);
			break;
		case OP_HALT:
			return vm.stack[vm.sp - 1];
		default:
			return -1;
		}
	}
}

/* --- string scanning ------------------------------------------------------ */

static const char text[] =
	"the quick brown fox jumps over the lazy dog; pack my box with five "
	"dozen liquor jugs. how vexingly quick daft zebras jump! sphinx of "
	"black quartz, judge my vow. the five boxing wizards jump quickly.";

__attribute__((noinline)) static long count_words(const char *s, char first)
{
	long words = 0;
	int in_word = 0;

	for (; *s; ++s) {
		int alpha = (*s >= 'a' && *s <= 'z');

		if (alpha && !in_word && *s == first)
			++words;
		in_word = alpha;
	}
	return words;
}

static u64 text_round(void)
{
	u64 sum = 0;

	for (char c = 'a'; c <= 'z'; ++c)
		sum = sum * 31 + (u64) count_words(text, c);
	return sum;
}

/* --- main ----------------------------------------------------------------- */

void workload_main(void)
{
	u64 acc = 0;

	for (int round = 0; round < WORKLOAD_ROUNDS; ++round) {
		acc = acc * 7 + sort_round(round);
		acc = acc * 7 + hash_round();
		acc = acc * 7 + tree_round(round);
		acc = acc * 7 + (u64) interpret(program, 1500 + round);
		acc = acc * 7 + text_round();
	}
	workload_result = acc;
}
