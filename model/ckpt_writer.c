/* ckpt_writer.c: see ckpt_writer.h. The thread only reads the snapshot and writes files; the
 * owner hands a job over at start and takes the result back at collect (a join orders both). */
#include "model/ckpt_writer.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "common/err.h"
#include "common/timeutil.h"
#include "model/optim.h"

struct ckpt_writer {
    int keep;
    _Atomic int64_t head;       /* ckpt_prune's head */
    int delay_ms;               /* debug: wait this long before writing */
    int running;                /* a thread started and not joined */
    pthread_t th;
    atomic_int finished;
    /* the job: read by the thread only while running */
    char root[1024];
    struct drafter view;        /* d's description with the snapshot's buffers */
    struct optim opt;
    struct ckpt_train_state ts;
    float *snap;                /* copy mode: params, m, v back to back */
    size_t snap_n;              /* params the snapshot buffer holds */
    uint64_t t0;
    struct ckpt_result res;
};

int ckpt_writer_create(struct ckpt_writer **out, int keep)
{
    struct ckpt_writer *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->keep = keep;
    atomic_init(&w->head, -1);
    *out = w;
    return 0;
}

void ckpt_writer_set_head(struct ckpt_writer *w, int64_t step) { atomic_store(&w->head, step); }

void ckpt_writer_free(struct ckpt_writer *w)
{
    if (!w)
        return;
    struct ckpt_result r;
    ckpt_writer_collect(w, 1, &r);
    free(w->snap);
    free(w);
}

int ckpt_writer_busy(const struct ckpt_writer *w) { return w && w->running; }

int ckpt_writer_reserve(struct ckpt_writer *w, size_t n_params)
{
    if (w->running)
        return -EBUSY;
    if (w->snap_n == n_params)
        return 0;
    free(w->snap);
    w->snap_n = 0;
    size_t nb = 3 * n_params * sizeof(float) + 1;
    if (!(w->snap = malloc(nb)))
        return -ENOMEM;
    /* fault the pages in now, not in the first checkpoint's pause (a volatile store per page:
     * a memset of fresh memory to 0 may be folded into calloc) */
    volatile char *p = (volatile char *)w->snap;
    long page = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < nb; i += (size_t)(page > 0 ? page : 4096))
        p[i] = 0;
    w->snap_n = n_params;
    return 0;
}

void ckpt_writer_debug_delay(struct ckpt_writer *w, int ms) { w->delay_ms = ms; }

static void *writer_main(void *arg)
{
    struct ckpt_writer *w = arg;
    struct ckpt_result *res = &w->res;
    if (w->delay_ms > 0) {
        struct timespec ts = { w->delay_ms / 1000, (long)(w->delay_ms % 1000) * 1000000L };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
    }
    res->rc = ckpt_save(w->root, &w->view, &w->ts, res->tag, res->dir, sizeof res->dir, res->err, sizeof res->err);
    if (res->rc == 0) {
        res->pruned = ckpt_prune(w->root, w->keep, w->ts.step, atomic_load(&w->head), res->tag);
        res->stale = ckpt_remove_stale(w->root);
    }
    res->write_ms = (double)(mono_ns() - w->t0) / 1e6;
    atomic_store_explicit(&w->finished, 1, memory_order_release);
    return NULL;
}

int ckpt_writer_start(struct ckpt_writer *w, const char *root, const struct drafter *d, int copy,
                      const struct ckpt_train_state *ts, uint64_t tag, const char *why)
{
    if (w->running)
        return -EBUSY;
    if (strlen(root) >= sizeof w->root)
        return -ENAMETOOLONG;
    int r;
    if (copy && (r = ckpt_writer_reserve(w, d->n_params)) < 0)
        return r;
    w->view = *d;
    w->opt = *d->opt;
    if (copy) {
        size_t nb = d->n_params * sizeof(float);
        w->view.params = memcpy(w->snap, d->params, nb);
        w->opt.m = memcpy(w->snap + d->n_params, d->opt->m, nb);
        w->opt.v = memcpy(w->snap + 2 * d->n_params, d->opt->v, nb);
    }
    w->view.opt = &w->opt;
    w->view.grads = NULL;       /* the writer never reads them */
    w->view.ws = NULL;
    snprintf(w->root, sizeof w->root, "%s", root);
    w->ts = *ts;
    memset(&w->res, 0, sizeof w->res);
    w->res.step = ts->step;
    w->res.tag = tag;
    snprintf(w->res.why, sizeof w->res.why, "%s", why ? why : "");
    w->t0 = mono_ns();
    atomic_store_explicit(&w->finished, 0, memory_order_relaxed);
    /* the daemon's signals stay with its main thread */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r = pthread_create(&w->th, NULL, writer_main, w);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r)
        return -r;
    w->running = 1;
    return 0;
}

int ckpt_writer_collect(struct ckpt_writer *w, int wait, struct ckpt_result *res)
{
    if (!w || !w->running)
        return 0;
    if (!wait && !atomic_load_explicit(&w->finished, memory_order_acquire))
        return 0;
    pthread_join(w->th, NULL);
    w->running = 0;
    *res = w->res;
    return 1;
}
