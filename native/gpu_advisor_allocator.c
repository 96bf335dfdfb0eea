/* The caching allocator's replay (advisor/memory/allocator.py), compiled: the same rules, step for step.

   advisor.memory.allocator.replay re-plays a traced step's allocations and frees through PyTorch's CUDA caching
   allocator's rules once per layout the multi-GPU planner sizes (16 re-plays of 10,000 events each for the 7B
   example over every GPU), a quarter of an estimate's work in Python. This module does the same loop in C; the
   Python one (CachingAllocator.run) stays the definition and the fallback where this module was not built,
   and tests/test_allocator_native.py checks that both give the same peaks. Built by setup.py as an optional
   extension (a machine without a C compiler installs without it).

   replay(events, in_step, steps, sizes, capacity) -> (peak_allocated, peak_reserved, segments, flushes,
                                                         out_of_memory)
     events: the step's events (i >= 0: allocate storage i, ~i: free it), as LiveMemory.events;
     in_step: per storage, whether the step allocates it (else it lives from before the step: allocated once);
     steps: the steps re-played in a row (allocator.replay's);
     sizes: each storage's bytes as the allocator rounds them (0: no block);
     capacity: the bytes segments may take, or None (nothing is ever released). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VERSION 1 /* allocator.py's NATIVE_VERSION: a module of another version is not used */

#define MIB ((int64_t)1 << 20)
#define MIN_BLOCK ((int64_t)512)
#define SMALL_REQUEST (1 * MIB)
#define SMALL_SEGMENT (2 * MIB)
#define LARGE_SEGMENT (20 * MIB)
#define MIN_LARGE_ALLOC (10 * MIB)
#define ROUND_LARGE (2 * MIB)

#define NO_BLOCK (-1)    /* a storage allocated with no block (an empty request) */
#define NOT_LIVE (-2)    /* a storage not allocated now */

typedef struct {
    int64_t size, address;
    int32_t previous, next; /* neighbours in the segment, or -1 */
    char small, free;
} Block;

typedef struct {
    int64_t size, address; /* sorted by size, then address: the allocator's best fit */
    int32_t block;
} Entry;

typedef struct {
    Entry *entries;
    Py_ssize_t length, capacity;
} Pool;

typedef struct {
    Block *blocks;
    Py_ssize_t count, capacity;
    Pool pools[2]; /* 0: large, 1: small */
    int32_t *live; /* by storage: its block, NO_BLOCK or NOT_LIVE */
    int64_t *sizes;
    Py_ssize_t storages;
    int64_t limit; /* capacity in bytes, or -1 */
    int64_t next_address, allocated, reserved, peak_allocated, peak_reserved, segments, flushes;
} Allocator;

static int64_t segment_size(int64_t request) {
    if (request <= SMALL_REQUEST) return SMALL_SEGMENT;
    if (request < MIN_LARGE_ALLOC) return LARGE_SEGMENT;
    return (request + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

static int entry_before(const Entry *e, int64_t size, int64_t address) {
    return e->size < size || (e->size == size && e->address < address);
}

/* The first position whose entry is not before (size, address). */
static Py_ssize_t bisect_left(const Pool *pool, int64_t size, int64_t address) {
    Py_ssize_t low = 0, high = pool->length;
    while (low < high) {
        Py_ssize_t middle = (low + high) / 2;
        if (entry_before(&pool->entries[middle], size, address)) low = middle + 1;
        else high = middle;
    }
    return low;
}

/* Room for one more item in `*items` (`length` used of `*capacity`, each `size` bytes): doubled when full
   (`initial` items at first). 0, or -1 with MemoryError set. */
static int make_room(void **items, Py_ssize_t length, Py_ssize_t *capacity, size_t size, Py_ssize_t initial) {
    if (length < *capacity) return 0;
    Py_ssize_t grown = *capacity ? 2 * *capacity : initial;
    void *moved = PyMem_Realloc(*items, grown * size);
    if (!moved) { PyErr_NoMemory(); return -1; }
    *items = moved;
    *capacity = grown;
    return 0;
}

static int pool_insert(Pool *pool, int64_t size, int64_t address, int32_t block) {
    if (make_room((void **)&pool->entries, pool->length, &pool->capacity, sizeof(Entry), 64) < 0) return -1;
    Py_ssize_t position = bisect_left(pool, size, address);
    memmove(&pool->entries[position + 1], &pool->entries[position], (pool->length - position) * sizeof(Entry));
    pool->entries[position] = (Entry){size, address, block};
    pool->length++;
    return 0;
}

static void pool_remove_at(Pool *pool, Py_ssize_t position) {
    memmove(&pool->entries[position], &pool->entries[position + 1], (pool->length - position - 1) * sizeof(Entry));
    pool->length--;
}

static void pool_remove(Pool *pool, const Block *block) {
    Py_ssize_t position = bisect_left(pool, block->size, block->address);
    pool_remove_at(pool, position);
}

static int32_t new_block(Allocator *a, int64_t size, int64_t address, char small) {
    if (make_room((void **)&a->blocks, a->count, &a->capacity, sizeof(Block), 1024) < 0) return -1;
    a->blocks[a->count] = (Block){size, address, -1, -1, small, 1};
    return (int32_t)a->count++;
}

/* Release every cached segment that is wholly free (a free block with no neighbour), from both pools; the
   bytes released (CachingAllocator.release_cached). */
static int64_t release_cached(Allocator *a) {
    int64_t released = 0;
    for (int p = 0; p < 2; p++) {
        Pool *pool = &a->pools[p];
        Py_ssize_t kept = 0;
        for (Py_ssize_t i = 0; i < pool->length; i++) {
            const Block *block = &a->blocks[pool->entries[i].block];
            if (block->previous < 0 && block->next < 0) released += block->size;
            else pool->entries[kept++] = pool->entries[i];
        }
        pool->length = kept;
    }
    return released;
}

/* 1: ran every event; 0: out of memory (the state as it was then); -1: a Python error set. */
static int run(Allocator *a, const int64_t *events, Py_ssize_t length) {
    int result = 1;
    for (Py_ssize_t i = 0; i < length; i++) {
        int64_t event = events[i];
        int64_t storage = event >= 0 ? event : ~event;
        if (event >= 0) { /* malloc */
            int64_t size = a->sizes[storage];
            if (!size) { a->live[storage] = NO_BLOCK; continue; }
            char small = size <= SMALL_REQUEST;
            Pool *pool = &a->pools[(int)small];
            Py_ssize_t position = bisect_left(pool, size, 0);
            int32_t taken;
            if (position < pool->length) { /* the best fit: the smallest free block that holds it, the lowest address */
                taken = pool->entries[position].block;
                pool_remove_at(pool, position);
            } else {
                int64_t nbytes = segment_size(size);
                if (a->limit >= 0 && a->reserved + nbytes > a->limit) { /* cudaMalloc fails */
                    a->flushes++;
                    a->reserved -= release_cached(a);
                    if (a->reserved + nbytes > a->limit) { result = 0; break; }
                }
                taken = new_block(a, nbytes, a->next_address, small);
                if (taken < 0) { result = -1; break; }
                a->next_address += nbytes;
                a->reserved += nbytes;
                a->segments++;
                if (a->reserved > a->peak_reserved) a->peak_reserved = a->reserved;
            }
            Block *block = &a->blocks[taken];
            int64_t remaining = block->size - size;
            if (small ? remaining >= MIN_BLOCK : remaining > SMALL_REQUEST) {
                int32_t rest = new_block(a, remaining, block->address + size, block->small);
                if (rest < 0) { result = -1; break; }
                block = &a->blocks[taken]; /* the blocks may have moved */
                Block *split = &a->blocks[rest];
                split->previous = taken;
                split->next = block->next;
                if (block->next >= 0) a->blocks[block->next].previous = rest;
                block->next = rest;
                block->size = size;
                if (pool_insert(pool, remaining, split->address, rest) < 0) { result = -1; break; }
            }
            block->free = 0;
            a->allocated += block->size;
            if (a->allocated > a->peak_allocated) a->peak_allocated = a->allocated;
            a->live[storage] = taken;
            continue;
        }
        int32_t freed = a->live[storage]; /* free */
        if (freed == NOT_LIVE) {
            PyErr_Format(PyExc_KeyError, "storage %lld freed while not allocated", (long long)storage);
            result = -1;
            break;
        }
        a->live[storage] = NOT_LIVE;
        if (freed == NO_BLOCK) continue;
        Block *block = &a->blocks[freed];
        if (block->free) {
            PyErr_SetString(PyExc_AssertionError, "block freed twice");
            result = -1;
            break;
        }
        a->allocated -= block->size;
        block->free = 1;
        int32_t previous = block->previous, following = block->next;
        if (previous >= 0 && a->blocks[previous].free) { /* merged into the free block before it */
            Block *before = &a->blocks[previous];
            pool_remove(&a->pools[(int)before->small], before);
            before->size += block->size;
            before->next = following;
            if (following >= 0) a->blocks[following].previous = previous;
            block = before;
            freed = previous;
        }
        if (following >= 0 && a->blocks[following].free) { /* and the free block after it into it */
            Block *after = &a->blocks[following];
            pool_remove(&a->pools[(int)after->small], after);
            block->size += after->size;
            block->next = after->next;
            if (after->next >= 0) a->blocks[after->next].previous = freed;
        }
        if (pool_insert(&a->pools[(int)block->small], block->size, block->address, freed) < 0) { result = -1; break; }
    }
    return result;
}

static int read_sizes(Allocator *a, PyObject *sizes) {
    PyObject *fast = PySequence_Fast(sizes, "sizes must be a sequence");
    if (!fast) return -1;
    a->storages = PySequence_Fast_GET_SIZE(fast);
    a->sizes = PyMem_Malloc((a->storages ? a->storages : 1) * sizeof(int64_t));
    a->live = PyMem_Malloc((a->storages ? a->storages : 1) * sizeof(int32_t));
    if (!a->sizes || !a->live) { Py_DECREF(fast); PyErr_NoMemory(); return -1; }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < a->storages; i++) {
        long long size = PyLong_AsLongLong(items[i]);
        if (size == -1 && PyErr_Occurred()) { Py_DECREF(fast); return -1; }
        if (size < 0) { Py_DECREF(fast); PyErr_SetString(PyExc_ValueError, "a negative size"); return -1; }
        a->sizes[i] = size;
        a->live[i] = NOT_LIVE;
    }
    Py_DECREF(fast);
    return 0;
}

static void release(Allocator *a) {
    PyMem_Free(a->blocks);
    PyMem_Free(a->pools[0].entries);
    PyMem_Free(a->pools[1].entries);
    PyMem_Free(a->live);
    PyMem_Free(a->sizes);
}

/* The step's events as allocator.replay runs them: `first` (step 0) every event, then the frees of what the
   step allocated and still holds at its end, in the order it was allocated; `later` (every further step) the
   events of the step's own storages (in_step), then the same frees. 0, or -1 with a Python error set. */
static int step_events(PyObject *events, PyObject *in_step, Py_ssize_t storages, int64_t **first,
                       Py_ssize_t *first_length, int64_t **later, Py_ssize_t *later_length) {
    PyObject *fast = PySequence_Fast(events, "events must be a sequence");
    if (!fast) return -1;
    PyObject *flags = PySequence_Fast(in_step, "in_step must be a sequence");
    if (!flags) { Py_DECREF(fast); return -1; }
    Py_ssize_t length = PySequence_Fast_GET_SIZE(fast);
    int result = -1;
    char *stepping = NULL;
    Py_ssize_t *since = NULL; /* by storage: the position of its allocation while alive, else -1 */
    *first = PyMem_Malloc((2 * length + 1) * sizeof(int64_t));
    *later = PyMem_Malloc((2 * length + 1) * sizeof(int64_t));
    stepping = PyMem_Malloc(storages + 1);
    since = PyMem_Malloc((storages + 1) * sizeof(Py_ssize_t));
    if (!*first || !*later || !stepping || !since) { PyErr_NoMemory(); goto done; }
    if (PySequence_Fast_GET_SIZE(flags) != storages) {
        PyErr_SetString(PyExc_ValueError, "in_step and sizes differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < storages; i++) {
        int truth = PyObject_IsTrue(PySequence_Fast_GET_ITEM(flags, i));
        if (truth < 0) goto done;
        stepping[i] = (char)truth;
        since[i] = -1;
    }
    Py_ssize_t later_count = 0;
    for (Py_ssize_t i = 0; i < length; i++) {
        long long event = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (event == -1 && PyErr_Occurred()) goto done;
        long long storage = event >= 0 ? event : ~event;
        if (storage >= storages) {
            PyErr_Format(PyExc_IndexError, "event %lld names no storage (%zd sizes)", event, storages);
            goto done;
        }
        (*first)[i] = event;
        if (!stepping[storage]) continue;
        (*later)[later_count++] = event;
        if (event < 0) since[storage] = -1;
        else if (since[storage] < 0) since[storage] = i;
    }
    Py_ssize_t first_count = length;
    for (Py_ssize_t i = 0; i < length; i++) { /* what is held at the end, in the order it was allocated */
        int64_t event = (*first)[i];
        if (event >= 0 && since[event] == i) {
            (*first)[first_count++] = ~event;
            (*later)[later_count++] = ~event;
        }
    }
    *first_length = first_count;
    *later_length = later_count;
    result = 0;
done:
    PyMem_Free(stepping);
    PyMem_Free(since);
    Py_DECREF(flags);
    Py_DECREF(fast);
    return result;
}

static PyObject *replay(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *events, *in_step, *sizes, *capacity;
    Py_ssize_t steps;
    if (!PyArg_ParseTuple(args, "OOnOO:replay", &events, &in_step, &steps, &sizes, &capacity)) return NULL;
    Allocator a;
    memset(&a, 0, sizeof a);
    a.limit = -1;
    if (capacity != Py_None) {
        a.limit = PyLong_AsLongLong(capacity);
        if (a.limit == -1 && PyErr_Occurred()) return NULL;
        if (a.limit < 0) { PyErr_SetString(PyExc_ValueError, "a negative capacity"); return NULL; }
    }
    int64_t *first = NULL, *later = NULL;
    Py_ssize_t first_length = 0, later_length = 0;
    int ran = 1;
    if (read_sizes(&a, sizes) < 0 ||
        step_events(events, in_step, a.storages, &first, &first_length, &later, &later_length) < 0) ran = -1;
    for (Py_ssize_t step = 0; ran == 1 && step < steps; step++)
        ran = step == 0 ? run(&a, first, first_length) : run(&a, later, later_length);
    PyObject *result = NULL;
    if (ran >= 0)
        result = Py_BuildValue("(LLLLO)", (long long)a.peak_allocated, (long long)a.peak_reserved,
                               (long long)a.segments, (long long)a.flushes, ran == 0 ? Py_True : Py_False);
    PyMem_Free(first);
    PyMem_Free(later);
    release(&a);
    return result;
}

static PyMethodDef methods[] = {
    {"replay", replay, METH_VARARGS,
     "replay(events, in_step, steps, sizes, capacity) -> (peak_allocated, peak_reserved, segments, flushes, "
     "out_of_memory): advisor.memory.allocator.replay's re-play of the caching allocator, compiled."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT, "gpu_advisor_allocator",
    "The caching allocator's replay of advisor/memory/allocator.py, compiled (an optional speed-up).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_gpu_advisor_allocator(void) {
    PyObject *module = PyModule_Create(&definition);
    if (module && PyModule_AddIntConstant(module, "VERSION", VERSION) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
