/* The KV pool's bookkeeping loops (sim/kvcache.py), one C pass each instead of a dozen numpy passes.
 *
 * Compiled on first use by sim/poolkernel.py and called through ctypes; sim/kvcache.py keeps its numpy code as the
 * fallback and the reference: tests/test_poolkernel.py runs both on the same operations and compares every array and
 * result. Each function does, element by element and in the same order, what the numpy code does over the whole
 * array, so the two agree exactly (the hash index's slot placement may differ; which block a hash finds may not).
 *
 * Layouts (all C-contiguous, owned by numpy):
 *   rows   int64[num_blocks][4]: reference count, free-queue stamp, cached hash, cache group (-1: none)
 *   queue  int32[capacity]: the free queue; an entry at position p is live while its block has no reference and
 *          its stamp is p
 *   table  int64[1 << bits][2]: the hash index, key (-1: empty) and block, linear probing from the key's home slot
 */
#include <stdint.h>

#define REF 0
#define STAMP 1
#define HASH 2
#define GROUP 3
#define EMPTY (-1)
#define GOLDEN 0x9E3779B97F4A7C15ULL

static inline int64_t home(int64_t h, int bits) { return (int64_t)(((uint64_t)h * GOLDEN) >> (64 - bits)); }

/* How many leading hashes find a live block of group g; their blocks go to out. */
int64_t al_find_live(const int64_t *table, int bits, const int64_t *rows, const int64_t *hashes, int64_t n, int64_t g,
                     int32_t *out) {
    const int64_t mask = ((int64_t)1 << bits) - 1;
    for (int64_t i = 0; i < n; i++) {
        const int64_t h = hashes[i];
        int64_t slot = home(h, bits);
        for (;;) {
            const int64_t k = table[2 * slot];
            if (k == h) break;
            if (k == EMPTY) return i;
            slot = (slot + 1) & mask;
        }
        const int64_t b = table[2 * slot + 1];
        if (rows[4 * b + GROUP] != g || rows[4 * b + HASH] != h) return i;
        out[i] = (int32_t)b;
    }
    return n;
}

/* How many leading blocks still hold their hash in group g. */
int64_t al_check(const int64_t *rows, const int32_t *blocks, const int64_t *hashes, int64_t n, int64_t g) {
    for (int64_t i = 0; i < n; i++) {
        const int64_t b = blocks[i];
        if (rows[4 * b + GROUP] != g || rows[4 * b + HASH] != hashes[i]) return i;
    }
    return n;
}

/* Cache blocks[i] under chain[i] in group g: a live entry keeps its block (the first block cached under a hash
 * keeps it), a stale one (its block evicted) is taken over, a new hash claims an empty slot. Returns the slots
 * newly claimed. */
int64_t al_register(int64_t *table, int bits, int64_t *rows, const int32_t *blocks, const int64_t *chain, int64_t n,
                    int64_t g) {
    const int64_t mask = ((int64_t)1 << bits) - 1;
    int64_t claimed = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t h = chain[i];
        int64_t slot = home(h, bits);
        for (;;) {
            const int64_t k = table[2 * slot];
            if (k == h || k == EMPTY) break;
            slot = (slot + 1) & mask;
        }
        if (table[2 * slot] == h) {
            const int64_t owner = table[2 * slot + 1];
            if (rows[4 * owner + GROUP] == g && rows[4 * owner + HASH] == h) continue;
        } else {
            table[2 * slot] = h;
            claimed++;
        }
        const int64_t b = blocks[i];
        table[2 * slot + 1] = b;
        rows[4 * b + GROUP] = g;
        rows[4 * b + HASH] = h;
    }
    return claimed;
}

/* Put n distinct keys and their blocks into a table (a rebuild); returns the slots claimed. */
int64_t al_insert(int64_t *table, int bits, const int64_t *keys, const int32_t *blocks, int64_t n) {
    const int64_t mask = ((int64_t)1 << bits) - 1;
    int64_t claimed = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t h = keys[i];
        int64_t slot = home(h, bits);
        while (table[2 * slot] != h && table[2 * slot] != EMPTY) slot = (slot + 1) & mask;
        if (table[2 * slot] == EMPTY) {
            table[2 * slot] = h;
            claimed++;
        }
        table[2 * slot + 1] = blocks[i];
    }
    return claimed;
}

/* Take the first `need` live entries from the free queue at head (the caller checked there are that many): each
 * referenced once, its cached hash evicted. Writes them to out, the evicted count to *evicted; returns the new
 * head (just past the last entry taken). */
int64_t al_take(int64_t *rows, const int32_t *queue, int64_t head, int64_t need, int32_t *out, int64_t *evicted) {
    int64_t k = 0, gone = 0, p = head;
    while (k < need) {
        const int64_t b = queue[p];
        int64_t *row = rows + 4 * b;
        if (row[REF] == 0 && row[STAMP] == p) {
            row[REF] = 1;
            if (row[GROUP] >= 0) {
                row[GROUP] = -1;
                gone++;
            }
            out[k++] = (int32_t)b;
        }
        p++;
    }
    *evicted = gone;
    return p;
}

/* Drop one reference from each block (last first when reverse is set); each left with none joins the free queue at
 * tail, stamped with its position, as its reference goes (one pass over the rows: a finished request's thousands of
 * blocks each cost a cache miss). The caller made room for n entries at tail; returns how many were queued. */
int64_t al_free(int64_t *rows, int32_t *queue, int64_t tail, const int32_t *blocks, int64_t n, int reverse) {
    int64_t f = 0;
    for (int64_t j = 0; j < n; j++) {
        const int64_t b = blocks[reverse ? n - 1 - j : j];
        int64_t *row = rows + 4 * b;
        if (--row[REF] == 0) {
            queue[tail + f] = (int32_t)b;
            row[STAMP] = tail + f;
            f++;
        }
    }
    return f;
}

/* Copy the live entries of src[head:tail] to the front of dst (which may be src), restamped; returns how many. */
int64_t al_compact(int64_t *rows, const int32_t *src, int64_t head, int64_t tail, int32_t *dst) {
    int64_t k = 0;
    for (int64_t p = head; p < tail; p++) {
        const int64_t b = src[p];
        int64_t *row = rows + 4 * b;
        if (row[REF] == 0 && row[STAMP] == p) {
            dst[k] = (int32_t)b;
            row[STAMP] = k;
            k++;
        }
    }
    return k;
}

/* Add a reference to each block (a prefix hit); returns how many had none. */
int64_t al_acquire(int64_t *rows, const int32_t *blocks, int64_t n) {
    int64_t f = 0;
    for (int64_t i = 0; i < n; i++) f += rows[4 * (int64_t)blocks[i] + REF]++ == 0;
    return f;
}

/* Undo al_acquire: drop the reference it added to each block (a block back at none is live in the queue again, its
 * entry and stamp untouched). */
void al_unacquire(int64_t *rows, const int32_t *blocks, int64_t n) {
    for (int64_t i = 0; i < n; i++) rows[4 * (int64_t)blocks[i] + REF]--;
}

/* Block hashes as sim/tokens.py's chain_hash computes them, hash((parent, tuple(block))), for blocks of int64
 * tokens: CPython's hash of an int (|x| mod 2^61 - 1, with x's sign, -1 becoming -2) and of a tuple (the xxHash-style
 * lanes of Objects/tupleobject.c, unchanged since Python 3.8). sim/poolkernel.py checks the result against Python's
 * own hash when it loads the library and leaves this function unused if they ever differ. */
#define XXPRIME_1 11400714785074694791ULL
#define XXPRIME_2 14029467366897019727ULL
#define XXPRIME_5 2870177450012600261ULL
#define MODULUS ((1ULL << 61) - 1)

static inline uint64_t int_hash(int64_t x) {
    const uint64_t magnitude = x < 0 ? (uint64_t)(-(x + 1)) + 1 : (uint64_t)x;
    const int64_t m = (int64_t)(magnitude % MODULUS);
    const int64_t h = x < 0 ? -m : m;
    return (uint64_t)(h == -1 ? -2 : h);
}

static inline uint64_t lane(uint64_t acc, uint64_t hash) {
    acc += hash * XXPRIME_2;
    acc = (acc << 31) | (acc >> 33);
    return acc * XXPRIME_1;
}

static inline uint64_t tuple_end(uint64_t acc, uint64_t len) {
    acc += len ^ (XXPRIME_5 ^ 3527539ULL);
    return acc == (uint64_t)-1 ? 1546275796ULL : acc;
}

void al_chain_hashes(const int64_t *tokens, int64_t blocks, int64_t block_size, int64_t parent, int64_t *out) {
    for (int64_t b = 0; b < blocks; b++) {
        uint64_t inner = XXPRIME_5;
        const int64_t *t = tokens + b * block_size;
        for (int64_t i = 0; i < block_size; i++) inner = lane(inner, int_hash(t[i]));
        inner = tuple_end(inner, (uint64_t)block_size);
        uint64_t outer = lane(XXPRIME_5, int_hash(parent));
        outer = tuple_end(lane(outer, inner), 2);
        parent = (int64_t)outer;
        out[b] = parent;
    }
}

/* numpy's Generator.integers(0, high, n) for 1 < high < 2^32, written to out: random_bounded_uint64_fill's 32-bit
 * path (Lemire's multiply and reject), each draw from the bit generator's own next_uint32 (state and function as its
 * ctypes interface gives them), so the generator's state moves on exactly as numpy's call would move it. Numpy's call
 * costs ~3 us before its first draw (a turn draws twice); sim/poolkernel.py checks the two give the same tokens and
 * leave the same state when it loads the library, and leaves this function unused if they ever differ. */
typedef uint32_t (*next_uint32_fn)(void *state);

void al_draw_below(void *state, void *next_uint32, int64_t high, int64_t n, int64_t *out) {
    const next_uint32_fn next = (next_uint32_fn)next_uint32;
    const uint32_t rng_excl = (uint32_t)high;
    const uint32_t threshold = (UINT32_MAX - (rng_excl - 1)) % rng_excl;
    for (int64_t i = 0; i < n; i++) {
        uint64_t m = (uint64_t)next(state) * rng_excl;
        uint32_t leftover = (uint32_t)m;
        if (leftover < rng_excl) {
            while (leftover < threshold) {
                m = (uint64_t)next(state) * rng_excl;
                leftover = (uint32_t)m;
            }
        }
        out[i] = (int64_t)(m >> 32);
    }
}
