/* test_ring_util.h: payloads for the ring stress and crash tests.
 * Each payload is derived from its id and carries a checksum written last. */
#pragma once
#include <stdint.h>
#include "ipc/ring.h"

/* Tiny slots so that many handoffs are cheap: 16 tokens x (1 layer x 8) bf16. */
static inline struct ring_layout tr_layout(uint32_t nslots)
{
    struct ring_layout l = { .nslots = nslots, .hidden = 8, .n_layers = 1, .dtype = RING_DTYPE_BF16,
                             .max_tokens = 16, .max_seqs = 2 };
    l.layer_ids[0] = 3;
    return l;
}

static inline uint64_t tr_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t tr_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static inline uint64_t tr_checksum(const struct ring *r, unsigned s)
{
    const struct ring_payload *p = ring_slot_header(r, s);
    uint64_t h = 0xcbf29ce484222325ull;
    h = tr_fnv(h, &p->batch_id, 8);
    h = tr_fnv(h, &p->n_tokens, 4);
    uint32_t n = p->n_tokens <= ring_layout(r)->max_tokens ? p->n_tokens : 0;
    h = tr_fnv(h, ring_slot_tokens(r, s), 4ull * n);
    h = tr_fnv(h, ring_slot_hidden(r, s), ring_hidden_pitch(r) * n);
    return h;
}

/* Write the payload for `id`. Order: id, then data, checksum last, so a writer stopped
 * half way leaves a payload whose checksum cannot match. stop_half: callback run midway. */
static inline void tr_write(struct ring *r, unsigned s, uint64_t id, void (*stop_half)(void))
{
    struct ring_payload *p = ring_slot_header(r, s);
    uint32_t n = 1 + (uint32_t)(tr_mix(id) % ring_layout(r)->max_tokens);
    p->batch_id = id;
    p->n_tokens = n;
    p->n_seqs = 1;
    ring_slot_cu_seqlens(r, s)[0] = 0;
    ring_slot_cu_seqlens(r, s)[1] = (int32_t)n;
    uint32_t *tok = ring_slot_tokens(r, s);
    for (uint32_t i = 0; i < n; i++)
        tok[i] = (uint32_t)tr_mix(id * 131 + i);
    if (stop_half)
        stop_half();
    uint64_t *hid = ring_slot_hidden(r, s);
    size_t words = ring_hidden_pitch(r) * n / 8;
    for (size_t i = 0; i < words; i++)
        hid[i] = tr_mix(id ^ (i << 40));
    p->checksum = tr_checksum(r, s);
}

/* 1 when slot s holds exactly the payload of its id, intact. */
static inline int tr_verify(const struct ring *r, unsigned s)
{
    const struct ring_payload *p = ring_slot_header(r, s);
    uint64_t id = p->batch_id;
    uint32_t n = 1 + (uint32_t)(tr_mix(id) % ring_layout(r)->max_tokens);
    if (p->n_tokens != n || p->checksum != tr_checksum(r, s))
        return 0;
    const uint32_t *tok = ring_slot_tokens(r, s);
    for (uint32_t i = 0; i < n; i++)
        if (tok[i] != (uint32_t)tr_mix(id * 131 + i))
            return 0;
    const uint64_t *hid = ring_slot_hidden(r, s);
    size_t words = ring_hidden_pitch(r) * n / 8;
    for (size_t i = 0; i < words; i++)
        if (hid[i] != tr_mix(id ^ (i << 40)))
            return 0;
    return 1;
}
