/* Parts of a C kernel run on torch's own OpenMP team (visionblocks._core.native).
 *
 * Why: torch's OpenMP threads keep spinning for a few milliseconds after each parallel op. A
 * kernel that spreads its parts over threads of its own competes with them for the cores
 * (measured: +3.5 ms on a 6 ms call right after any torch op on 2 cores). Run on the same
 * team, the spinning threads take the parts at once instead.
 *
 * How: the library that uses this header receives the address of GOMP_parallel from the
 * OpenMP runtime torch loaded (vb_set_team; NULL when there is none, and then every part runs
 * in the calling thread). vb_run_parts starts one parallel region; its threads take part
 * indices from a shared atomic counter, so a thread that is descheduled delays only the part
 * it holds, and which thread runs which part never changes a result. Parts report failure
 * (e.g. no memory for scratch) by returning nonzero; vb_run_parts returns how many failed.
 */
#include <stdint.h>
#include <stdlib.h>

typedef void (*vb_team_fn)(void (*)(void *), void *, unsigned, unsigned);
static vb_team_fn vb_team;

/* Called once after loading, with GOMP_parallel (or NULL). */
void vb_set_team(void *gomp_parallel) { vb_team = (vb_team_fn)gomp_parallel; }

typedef int (*vb_part_fn)(void *ctx, int64_t part);

typedef struct {
    vb_part_fn fn;
    void *ctx;
    int64_t next, stop, failed;
} vb_job;

static void vb_drain(void *arg) {
    vb_job *job = (vb_job *)arg;
    for (;;) {
        int64_t i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED);
        if (i >= job->stop) return;
        if (job->fn(job->ctx, i)) __atomic_fetch_add(&job->failed, 1, __ATOMIC_RELAXED);
    }
}

/* Parts [start, stop) of fn on up to `threads` threads; returns the number of failed parts. */
static int64_t vb_run_parts(vb_part_fn fn, void *ctx, int64_t start, int64_t stop,
                            int64_t threads) {
    vb_job job = {fn, ctx, start, stop, 0};
    if (threads > stop - start) threads = stop - start;
    if (threads > 1 && vb_team)
        vb_team(vb_drain, &job, (unsigned)threads, 0);
    else
        vb_drain(&job);
    return job.failed;
}

/* Scratch owned by the calling thread, grown as needed and kept for the thread's next parts
 * (threads of the team live as long as the process) unless larger than VB_SCRATCH_KEEP bytes:
 * call vb_scratch_done after each use. NULL when memory runs out. */
#define VB_SCRATCH_KEEP ((size_t)8 << 20)
static __thread void *vb_scratch_buf;
static __thread size_t vb_scratch_size;

static void *vb_scratch(size_t bytes) {
    if (bytes > vb_scratch_size) {
        free(vb_scratch_buf);
        vb_scratch_buf = malloc(bytes);
        vb_scratch_size = vb_scratch_buf ? bytes : 0;
    }
    return vb_scratch_buf;
}

static void vb_scratch_done(void) {
    if (vb_scratch_size > VB_SCRATCH_KEEP) {
        free(vb_scratch_buf);
        vb_scratch_buf = 0;
        vb_scratch_size = 0;
    }
}
