/* fuzz_ring.c: fuzz target for the ring header validation (ipc/ring.c ring_attach) on a
 * shm object whose bytes the fuzzer writes; an accepted ring is then used for real.
 * Input: [0] flags, [1..2] object size in pages (LE u16, mod 4096, + 1), [3..] object bytes. */
#include <fcntl.h>
#include <sys/stat.h>
#include "common/err.h"
#include "ipc/ring.h"
#include "tests/fuzz/fuzz.h"

#define RING_FUZZ_SIZE_FROM_INPUT 1u    /* flags bit: object size from bytes [1..2] */
#define RING_FUZZ_ANY 2u                /* attach with RING_ATTACH_ANY, else expect the seed layout */
#define RING_FUZZ_RDONLY 4u
#define RING_FUZZ_PUBLISH 8u            /* write-claim, publish, read-claim, release */

/* The layout tests/fuzz/corpus/ring seeds were created with (tools/fuzz.sh --seeds). */
static const struct ring_layout ring_fuzz_layout = {
    .nslots = 2, .hidden = 8, .n_layers = 2, .layer_ids = { 1, 3 }, .dtype = RING_DTYPE_BF16,
    .max_tokens = 16, .max_seqs = 4,
};

static char ring_fuzz_name[64];

static void ring_fuzz_cleanup(void)
{
    ring_unlink(ring_fuzz_name);
}

static int ring_fuzz_object(void)
{
    static int fd = -1;
    if (fd >= 0)
        return fd;
    snprintf(ring_fuzz_name, sizeof ring_fuzz_name, "/dflash-fuzz-ring-%d", (int)getpid());
    fd = shm_open(ring_fuzz_name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0)
        atexit(ring_fuzz_cleanup);
    return fd;
}

static int in_map(const struct ring *r, const void *p, size_t n)
{
    const uint8_t *b = ring_base(r), *q = p;
    return q >= b && n <= ring_map_size(r) && (size_t)(q - b) <= ring_map_size(r) - n;
}

/* Every pointer the ring hands out for a slot stays inside the mapping. */
static void ring_fuzz_slot_bounds(const struct ring *r, unsigned slot)
{
    const struct ring_layout *l = ring_layout(r);
    FUZZ_ASSERT(in_map(r, ring_slot_header(r, slot), sizeof(struct ring_payload)));
    FUZZ_ASSERT(in_map(r, ring_slot_cu_seqlens(r, slot), 4ull * (l->max_seqs + 1)));
    FUZZ_ASSERT(in_map(r, ring_slot_tokens(r, slot), 4ull * l->max_tokens));
    FUZZ_ASSERT(in_map(r, ring_slot_loss_mask(r, slot), l->max_tokens));
    FUZZ_ASSERT(in_map(r, ring_slot_hidden(r, slot), ring_hidden_bytes(r)));
    FUZZ_ASSERT(ring_hidden_pitch(r) == 2ull * l->hidden * l->n_layers);
}

static void ring_fuzz_use(struct ring *r, bool rdonly, bool publish)
{
    const struct ring_layout *l = ring_layout(r);
    FUZZ_ASSERT(l->nslots >= 1 && l->n_layers >= 1 && l->n_layers <= RING_MAX_LAYERS);
    FUZZ_ASSERT(l->dtype == RING_DTYPE_BF16 && l->max_seqs >= 1 && l->max_seqs <= l->max_tokens);
    for (unsigned s = 0; s < l->nslots; s++)
        ring_fuzz_slot_bounds(r, s);
    struct ring_slot_stat *slots = calloc(l->nslots, sizeof *slots);
    struct ring_stats st;
    if (slots) {
        FUZZ_ASSERT(ring_stats(r, &st, slots) == 0);
        FUZZ_ASSERT(st.nslots == l->nslots);
        FUZZ_ASSERT((uint64_t)st.count[0] + st.count[1] + st.count[2] + st.count[3] == l->nslots);
        for (unsigned s = 0; s < l->nslots; s++)
            FUZZ_ASSERT(slots[s].state <= RING_READING && ring_state_name(slots[s].state));
        free(slots);
    }
    unsigned slot;
    if (rdonly) {
        FUZZ_ASSERT(ring_claim_write(r, 0, &slot) == -EROFS);
        return;
    }
    struct ring_reclaim rec;
    FUZZ_ASSERT(ring_reclaim_dead(r, &rec) == 0);
    int rc = ring_claim_write(r, 0, &slot);
    FUZZ_ASSERT(rc == 0 || rc == -DF_ETIMEOUT);
    if (rc == 0) {
        FUZZ_ASSERT(slot < l->nslots);
        /* Touch the first and last byte of every area of the claimed slot. */
        struct ring_payload *p = ring_slot_header(r, slot);
        uint8_t *hid = ring_slot_hidden(r, slot);
        hid[0] = 1;
        hid[ring_hidden_bytes(r) - 1] = 1;
        ring_slot_cu_seqlens(r, slot)[0] = 0;
        ring_slot_cu_seqlens(r, slot)[l->max_seqs] = 1;
        ring_slot_tokens(r, slot)[l->max_tokens - 1] = 7;
        ring_slot_loss_mask(r, slot)[l->max_tokens - 1] = 1;
        if (publish) {
            p->n_seqs = 1;
            p->n_tokens = 1;
            ring_slot_cu_seqlens(r, slot)[1] = 1;
            rc = ring_publish(r, slot);
            FUZZ_ASSERT(rc == 0 || rc == -DF_ESTATE);
        } else {
            rc = ring_abort_write(r, slot);
            FUZZ_ASSERT(rc == 0 || rc == -DF_ESTATE);
        }
    }
    rc = ring_claim_read(r, NULL, 0, &slot);
    FUZZ_ASSERT(rc == 0 || rc == -DF_ETIMEOUT);
    if (rc == 0) {
        FUZZ_ASSERT(slot < l->nslots);
        volatile uint32_t n = ring_slot_header(r, slot)->n_tokens;
        (void)n;
        rc = ring_release(r, slot);
        FUZZ_ASSERT(rc == 0 || rc == -DF_ESTATE);
    }
    FUZZ_ASSERT(ring_reclaim_owner(r, ring_owner(r), &rec) == 0);
}

int fuzz_ring(const uint8_t *data, size_t size)
{
    char err[512];
    if (size < 3)
        return 0;
    int fd = ring_fuzz_object();
    if (fd < 0)
        return 0;
    unsigned flags = data[0];
    size_t len = size - 3;
    size_t obj = len;
    if (flags & RING_FUZZ_SIZE_FROM_INPUT) {
        size_t pages = (size_t)(data[1] | data[2] << 8) % 4096 + 1;
        obj = pages * 4096 > len ? pages * 4096 : len;
    }
    /* Shrink to nothing first so bytes of an earlier input never survive. */
    if (ftruncate(fd, 0) < 0 || ftruncate(fd, (off_t)obj) < 0)
        return 0;
    if (len && pwrite(fd, data + 3, len, 0) != (ssize_t)len)
        return 0;
    bool rdonly = flags & RING_FUZZ_RDONLY;
    unsigned af = (flags & RING_FUZZ_ANY ? RING_ATTACH_ANY : 0) | (rdonly ? RING_ATTACH_RDONLY : 0);
    struct ring *r = NULL;
    err[0] = 0;
    int rc = ring_attach(&r, ring_fuzz_name, flags & RING_FUZZ_ANY ? NULL : &ring_fuzz_layout, af, err, sizeof err);
    if (rc < 0) {
        FUZZ_ASSERT(r == NULL);
        FUZZ_ASSERT(fuzz_err_ok(err, sizeof err));
        return 0;
    }
    FUZZ_ASSERT(r && ring_map_size(r) <= obj);
    ring_fuzz_use(r, rdonly, flags & RING_FUZZ_PUBLISH);
    ring_detach(r);
    return 0;
}
