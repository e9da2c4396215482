/*
 * Side by side by weight (docs/scheduling.md, "Side by side").  Processes whose memory
 * fits run together, and the driver gives each context with work an equal slice of the
 * GPU: a weight of 3 got what a weight of 1 got.  So the holders of a GPU share a page
 * (shared memory the agent hands each with its slot, agent/fair_pages.py) and run a
 * start-time fair queue in it: each slot says whether its process is backlogged (has work
 * on the GPU or a thread waiting to launch) and its virtual time, the GPU time it got over
 * its weight (its time with work on the GPU over the number of processes then on it: the
 * driver's equal slices).  A process more than LEAD_MS of virtual time ahead of another backlogged one
 * holds its next launches until that one has caught up or has no work: nobody is held
 * for a process without work, and over time each backlogged process gets GPU time in
 * proportion to its weight.  Back after IDLE_MS idle or more, a process starts at the
 * least virtual time of those backlogged (none: the latest of the others looking), not its
 * own older one: time it did not want is not owed to it later (as in a fluid share of the
 * GPU, where idle time is not banked); back from a shorter gap it keeps its place, but
 * never more than LEAD_MS behind.  Latency work goes first: back from idle, a process is
 * not held for its first BURST_CREDIT_MS of virtual time (a request, a cell, a batch), or
 * for as much as the least virtual time of those with work ran on while it was away and
 * had not yet asked again for the GPU (up to MAX_CREDIT_MS; a newcomer was not away), nor
 * its queue kept short for the first half of it, and it holds those ahead of it as ever.
 *
 * The client thread looks every ~1 ms while the gate is open (the usage meter's sample):
 * it reads its weight from its slot (the agent rewrites it when its group's changes),
 * publishes this process's state and sets or lifts the gate's hold.  Application
 * threads pay one relaxed load at the gate (gate.h); a held one waits on the page's bell
 * (a futex the shims share, rung by one whose look finds its work over, or by its own
 * look lifting the hold) and looks at the page itself when it rings, at most HOLD_MS, so
 * that a slot left stale (its process stopped) or forged slows others, never stops them;
 * and a slot not looked at for STALE_MS is not waited for at all.  Work this
 * process queued before the hold still runs: near a hold, and SHORT_QUEUE_MS after, the
 * queue bound keeps it to ~5 ms (queue_bound.c), else a whole burst is queued at once.
 * The page is for processes that cooperate: one that writes a slot not its own can slow
 * the others by up to HOLD_MS a launch, as a process outside nvshare slows them by
 * interleaving.
 */
#define _GNU_SOURCE
#include "fair_share.h"

#include <errno.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "devices.h"
#include "lock_state.h"
#include "log.h"

#ifndef HOLD_MS /* test_fair_look.py makes it long: a wait that ends early was woken */
#define HOLD_MS 50
#endif
#define STALE_MS 20
/* A process idle for less than this keeps its place, at most LEAD_MS behind: a trainer's
 * sync between two steps is not time it did not want (else each step began level with
 * the others, and a weight of 3 got 0.54 of the GPU beside a weight of 1, not 0.75), but
 * longer host work is not banked past the lead either (policy_sim, 3 : 1 in steps of 20
 * ms with 3 ms gaps: 0.66 / 0.32, the fluid share's 0.68 / 0.31). */
#define IDLE_MS 10
/* The queue stays short (~5 ms, queue_bound.c) this long after this process was last
 * near a hold.  Let go in the gap between another's bursts (its sync, ~1-2 ms), it queued
 * the rest of its burst under the long bound, ~6 ms a gap, and a weight of 1 kept 0.36 of
 * the GPU beside a weight of 3 (H200).  Showing the other backlogged through its gaps
 * instead (e4dc184: 0.75 / 0.16) idled the GPU in every gap: 5 % in policy_sim, where
 * this gives 0.70 / 0.23 and 3.4 % (fair_page_model.py). */
#define SHORT_QUEUE_MS 10
/* Holds only past this lead of virtual time: two level ones (equal weights, both busy)
 * run side by side as the driver interleaves them, not held by turns every look. */
#define LEAD_MS 5
/* And never held for more than this of another's virtual time (below). */
#define MAX_AHEAD_MS 20
/* Not held for this much virtual time into work begun after IDLE_MS idle, nor its queue
 * kept short for half of it: a request, a cell, a batch.  Held or short, the node mix's inference
 * server (0.8 ms of GPU work a request, a few dozen launches) answered in p50 24 / p99
 * 147 ms beside the trainer, not 2.7 / 6.5 as without nvshare (H200): the short queue
 * waits on each few launches, and behind another's work each wait is a turn of the
 * driver's time slices.  Virtual time, not wall time: bursts of any length with gaps of
 * IDLE_MS would else never be held, whatever their weight.  At 20, four 30 %-busy
 * processes in 30 ms bursts got 0.93 of their share each in policy_sim, at 30 0.99. */
#define BURST_CREDIT_MS 30
/* Or, back from longer away, for as much virtual time as the least of those with work ran
 * on meanwhile (from the least it saw going idle to the least it sees back), up to this:
 * what it did not use while away, given as a credit, not as a lower virtual time, so
 * that it is not paid back later; not to a newcomer, else each new process of a stream
 * of short jobs escaped its weight (policy_sim: 0.47 of the GPU at weight 1 beside 4).
 * A notebook's 150 ms cell beside a trainer runs unheld (H200: 0 looks held a cell,
 * 286-321 ms; 343 without nvshare); bursts every 10-20 ms earn little, and busy ones are
 * still split by weight.  At 250, beside two trainers apart a 150 ms cell (~150 ms of
 * virtual time there) had its queue short past half of it: p50 373-383 / p95 459-510 ms
 * against 342 / 351 with the page off; at 400 322 / 339 (H200), policy_sim unmoved. */
#define MAX_CREDIT_MS 400
/* Another counts as on the GPU beside this one only if it looked this recently: a slot
 * whose process stopped would else halve everyone's charge until it goes stale. */
#define ON_GPU_FRESH_MS 3

struct fair_gpu {
    struct nvshare_fair_page *page; /* NULL: none (interleaved as the driver does) */
    uint64_t idle_since_ns;         /* when it last stopped being backlogged */
    uint64_t burst_used_ns;         /* virtual time used since it came back from idle */
    uint64_t credit_ns;             /* not held while burst_used_ns is under this */
    uint64_t least_seen_ns;         /* the others' least at the last look that saw one, */
    uint64_t least_seen_at_ns;      /* then (0: never) */
    uint64_t least_at_idle_ns;      /* the least to go by when it went idle (UINT64_MAX: none) */
    uint64_t near_hold_ns;          /* when it was last near a hold: its queue short */
    uint64_t asked_at_ns;           /* when it asked for its last grant, till the next burst */
    uint64_t vtime_ns;              /* what it writes to its slot (never read back) */
    /* For the debug log, a line a second: busy ms, looks, looks backlogged, held, short. */
    double busy_ms, reported_at_ms;
    unsigned slot;
    int backlogged;
    unsigned looks, looks_backlogged, looks_held, looks_short;
};

/* The client thread's; application threads read only the gates, and a held one the page
 * published here (its slot beside it), never after detach() has taken it back. */
static struct fair_gpu fair[NVSHARE_MAX_GPUS];
static struct nvshare_fair_page *_Atomic published[NVSHARE_MAX_GPUS];
static atomic_uint published_slot[NVSHARE_MAX_GPUS];
/* Its virtual time as its last look left it: the slot's copy may still be written by the
 * slot's last owner for a little while. */
static _Atomic uint64_t published_vtime[NVSHARE_MAX_GPUS];

/* The slots are written by other processes: every access to them is atomic. */
#define SLOT_LOAD(field)         __atomic_load_n(&(field), __ATOMIC_RELAXED)
#define SLOT_STORE(field, value) __atomic_store_n(&(field), (value), __ATOMIC_RELAXED)

static uint64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

/* Wakes the threads of every shim held on this page: one it may have waited for went
 * idle, or a hold lifted (the futex is shared: the page is one memfd for all).  Woken
 * whatever wake_waiters says where this process's own threads wait (always): the count is
 * in a page others write, and one killed while waiting leaves it counted for good. */
static void ring(struct nvshare_fair_page *page, int always)
{
    __atomic_add_fetch(&page->wake_seq, 1, __ATOMIC_SEQ_CST);
    if (always || __atomic_load_n(&page->wake_waiters, __ATOMIC_SEQ_CST) != 0)
        syscall(SYS_futex, &page->wake_seq, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

static void lift_hold(int gpu)
{
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    if (atomic_exchange(&gate->held, 0) == 0 || atomic_load(&gate->held_waiting) == 0)
        return;
    struct nvshare_fair_page *page = atomic_load(&published[gpu]);
    if (page != NULL) /* a hold is set only while a page is (none: detach rang already) */
        ring(page, 1);
}

static void detach(int gpu)
{
    struct fair_gpu *mine = &fair[gpu];
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    if (mine->page != NULL) {
        SLOT_STORE(mine->page->slots[mine->slot].backlogged, 0);
        SLOT_STORE(mine->page->slots[mine->slot].on_gpu, 0);
        atomic_store(&published[gpu], NULL);
        atomic_store(&gate->held, 0); /* set only while a page is */
        ring(mine->page, 1);          /* its held threads see it gone and go on */
        /* Unmapped only once no held thread can still read it: they leave at once, woken;
         * one that does not within 10 ms (descheduled) keeps the 4 KiB mapped for good. */
        struct timespec pause = {.tv_nsec = 100000};
        int polls = 0;
        while (atomic_load(&gate->held_waiting) != 0 && polls++ < 100)
            nanosleep(&pause, NULL);
        if (atomic_load(&gate->held_waiting) == 0)
            munmap(mine->page, NVSHARE_FAIR_PAGE_BYTES);
        else
            nvshare_debug("fair page gpu=%d left mapped: a held thread did not leave", gpu);
    }
    *mine = (struct fair_gpu){0};
    atomic_store(&gate->near_hold, 0);
}

/* The others on the page as a look at `now` sees them: the least virtual time of those
 * backlogged (UINT64_MAX: none), the latest of those idle, and how many have work on the
 * GPU beside this one.  Fresh slots only (a stamp from the future is no fresher), and none
 * so large that adding the lead would wrap. */
struct others {
    uint64_t least, latest_idle;
    unsigned sharing;
};

static struct others look_at_others(const struct nvshare_fair_state *slots, unsigned mine,
                                    uint64_t now)
{
    uint64_t stale_before = now - (uint64_t)STALE_MS * 1000000u;
    uint64_t on_gpu_fresh_ns = (uint64_t)ON_GPU_FRESH_MS * 1000000u;
    uint64_t max_ahead_ns = (uint64_t)MAX_AHEAD_MS * 1000000u;
    struct others seen = {.least = UINT64_MAX, .latest_idle = UINT64_MAX, .sharing = 1};
    for (unsigned i = 0; i < NVSHARE_FAIR_SLOTS; i++) {
        uint64_t at = SLOT_LOAD(slots[i].seen_ns), vtime = SLOT_LOAD(slots[i].vtime_ns);
        if (i == mine || !SLOT_LOAD(slots[i].in_use) || at < stale_before || at > now ||
            vtime > UINT64_MAX - max_ahead_ns)
            continue;
        if (!SLOT_LOAD(slots[i].backlogged)) {
            seen.latest_idle = seen.latest_idle == UINT64_MAX || vtime > seen.latest_idle
                                   ? vtime
                                   : seen.latest_idle;
            continue;
        }
        seen.least = vtime < seen.least ? vtime : seen.least;
        seen.sharing += SLOT_LOAD(slots[i].on_gpu) != 0 && now - at < on_gpu_fresh_ns;
    }
    return seen;
}

/* Held: another backlogged is more than the lead behind this one's virtual time. */
static int behind_by_a_lead(uint64_t least, uint64_t vtime)
{
    return least != UINT64_MAX && least + (uint64_t)LEAD_MS * 1000000u < vtime;
}

void nvshare_fair_attach(int gpu, const struct nvshare_fair_slot *slot, int fd)
{
    if (fd < 0)
        return; /* an agent that sent no page */
    if (gpu < 0 || gpu >= NVSHARE_MAX_GPUS || slot->slot >= NVSHARE_FAIR_SLOTS) {
        close(fd);
        return;
    }
    detach(gpu);
    void *page = MAP_FAILED;
    /* Its size by lseek: fstat is a GLIBC_2.33 symbol, and the shim needs only 2.17.  The
     * agent seals the size (F_SEAL_SHRINK): nobody can cut the mapping short under us. */
    if (lseek(fd, 0, SEEK_END) >= NVSHARE_FAIR_PAGE_BYTES)
        page = mmap(NULL, NVSHARE_FAIR_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (page == MAP_FAILED || ((struct nvshare_fair_page *)page)->magic != NVSHARE_MAGIC) {
        if (page != MAP_FAILED)
            munmap(page, NVSHARE_FAIR_PAGE_BYTES);
        nvshare_debug("fair page for gpu=%d not usable", gpu);
        return;
    }
    fair[gpu] = (struct fair_gpu){.page = page, .slot = slot->slot};
    atomic_store(&published_slot[gpu], slot->slot);
    atomic_store(&published[gpu], page);
    nvshare_debug("fair page gpu=%d slot=%u weight=%u", gpu, slot->slot, slot->weight);
}

void nvshare_fair_look(int gpu, int open, int busy, double busy_ms)
{
    struct fair_gpu *mine = &fair[gpu];
    if (mine->page == NULL)
        return;
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    struct nvshare_fair_state *slots = mine->page->slots, *own = &slots[mine->slot];
    int backlogged = open && (busy || atomic_load(&gate->held_waiting) != 0);
    /* Its group's weight as the agent has it now: rewritten there when it changes. */
    uint32_t weight = SLOT_LOAD(own->weight);
    weight = weight ? weight : 1;
    uint64_t now = monotonic_ns(), stale_before = now - (uint64_t)STALE_MS * 1000000u;
    uint64_t lead_ns = (uint64_t)LEAD_MS * 1000000u;
    uint64_t max_ahead_ns = (uint64_t)MAX_AHEAD_MS * 1000000u;
    struct others others = look_at_others(slots, mine->slot, now);
    uint64_t least = others.least, latest_idle = others.latest_idle;
    unsigned sharing = others.sharing;
    /* Its own, kept here: a slot's last owner may write it a little longer. */
    uint64_t vtime = mine->vtime_ns;
    /* The least to reckon a credit by: this look's, else one seen within STALE_MS (the
     * others between two steps); else a look that found them all in a gap gave none. */
    if (least != UINT64_MAX) {
        mine->least_seen_ns = least;
        mine->least_seen_at_ns = now;
    }
    uint64_t least_known = least;
    if (least_known == UINT64_MAX && mine->least_seen_at_ns > stale_before)
        least_known = mine->least_seen_ns;
    /* To come back level with: that least, else the latest of the others that looked within
     * STALE_MS, all idle.  Two trainers that do not fit together, back from every other
     * turn of 0.5 s to find nobody with work, kept the virtual time of their last turn and
     * pulled everyone beside them back to it (at most MAX_AHEAD_MS ahead): a notebook's
     * 15 ms cells took p50 168 ms (H200; 39 ms with fair_page off). */
    uint64_t least_by = least_known != UINT64_MAX ? least_known : latest_idle;
    int resumed = backlogged && !mine->backlogged;
    if (resumed && mine->idle_since_ns != 0 &&
        now - mine->idle_since_ns < (uint64_t)IDLE_MS * 1000000u) {
        /* Back from a short gap: its place, but never more than the lead behind.  A loader's
         * 2 ms batch every 10 ms kept its place through each gap, fell behind by the gap's
         * worth, and held every other holder (each at most MAX_AHEAD_MS past it) at each
         * batch: a notebook's 150 ms cell beside it and a trainer took 0.3-1.1 s, with the
         * credit below too (H200; 343 ms without nvshare). */
        if (least_known != UINT64_MAX && least_known > vtime + lead_ns)
            vtime = least_known - lead_ns;
    } else if (resumed) {
        /* Back from idle, or new: level with the least, and a credit of what that least ran
         * on while it was away (a newcomer was not away: the floor). */
        uint64_t ran = 0;
        if (mine->idle_since_ns != 0 && least_known != UINT64_MAX) {
            uint64_t from =
                mine->least_at_idle_ns != UINT64_MAX ? mine->least_at_idle_ns : mine->vtime_ns;
            ran = least_known > from ? least_known - from : 0;
            /* Only the part of the gap before it asked again for the GPU: from then on it
             * wanted it (waiting for a turn, its grant's prefetch).  Two trainers apart, back
             * from every other 0.5 s turn with ~250 ms of credit each, had it as latency
             * work and kept a notebook's cell beside them short-queued.  One that asked
             * before this look saw it idle (a trainer asks again as its lease ends) never
             * stopped wanting it. */
            uint64_t gap = now - mine->idle_since_ns, asked = mine->asked_at_ns;
            if (asked != 0 && asked <= mine->idle_since_ns)
                ran = 0;
            else if (asked != 0 && asked < now)
                ran = (uint64_t)((double)ran * (double)(asked - mine->idle_since_ns) / (double)gap);
        }
        uint64_t floor_ns = (uint64_t)BURST_CREDIT_MS * 1000000u;
        uint64_t most_ns = (uint64_t)MAX_CREDIT_MS * 1000000u;
        mine->credit_ns = ran < floor_ns ? floor_ns : ran > most_ns ? most_ns : ran;
        if (least_by != UINT64_MAX && least_by > vtime)
            vtime = least_by;
        mine->burst_used_ns = 0;
    }
    if (resumed)
        mine->asked_at_ns = 0;
    if (!backlogged && mine->backlogged) {
        mine->idle_since_ns = now;
        mine->least_at_idle_ns = least_known;
    }
    /* Its GPU time: the driver gives each context with work an equal slice, so time with
     * work on the GPU beside others is theirs too.  Counted whole, a request waiting
     * behind a trainer's queue was charged for the trainer's work. */
    uint64_t charge = (uint64_t)(busy_ms * 1e6 / weight / sharing);
    vtime = vtime > UINT64_MAX - charge ? UINT64_MAX : vtime + charge;
    mine->burst_used_ns += charge;
    /* Never more than MAX_AHEAD_MS ahead of another with work: one that came while this
     * one was idle (started at 0) would else hold it for as long as its whole past here. */
    if (least != UINT64_MAX && vtime > least + max_ahead_ns)
        vtime = least + max_ahead_ns;
    mine->vtime_ns = vtime;
    atomic_store_explicit(&published_vtime[gpu], vtime, memory_order_relaxed);
    SLOT_STORE(own->vtime_ns, vtime);
    SLOT_STORE(own->seen_ns, now);
    SLOT_STORE(own->backlogged, (uint32_t)backlogged);
    SLOT_STORE(own->on_gpu, (uint32_t)(open && busy));
    if (!backlogged && mine->backlogged)
        ring(mine->page, 0); /* one held for this process goes on now, not at its next look */
    mine->backlogged = backlogged;
    /* In a burst: not held while it has credit left, and its queue free for the first half
     * of it, so that what it queues when the credit runs out is short (else the rest of a
     * 60 ms burst was queued by then, and the hold came too late to bind it). */
    int in_burst = mine->burst_used_ns < mine->credit_ns;
    int queue_free = mine->burst_used_ns < mine->credit_ns / 2;
    int held = backlogged && !in_burst && behind_by_a_lead(least, vtime);
    if (!queue_free && least != UINT64_MAX && least + lead_ns / 2 < vtime)
        mine->near_hold_ns = now;
    int short_queue =
        open && !queue_free && now - mine->near_hold_ns < (uint64_t)SHORT_QUEUE_MS * 1000000u;
    atomic_store_explicit(&gate->near_hold, short_queue, memory_order_relaxed);
    mine->looks++;
    mine->looks_backlogged += (unsigned)backlogged;
    mine->looks_held += (unsigned)held;
    mine->looks_short += (unsigned)short_queue;
    mine->busy_ms += busy_ms;
    double now_ms = (double)now / 1e6;
    if (now_ms - mine->reported_at_ms >= 1000) {
        nvshare_debug("fair gpu=%d weight=%u looks=%u backlogged=%u held=%u short=%u "
                      "busy_ms=%.0f vtime_ms=%.1f least_ms=%.1f",
                      gpu, weight, mine->looks, mine->looks_backlogged, mine->looks_held,
                      mine->looks_short, mine->busy_ms, (double)vtime / 1e6,
                      least == UINT64_MAX ? -1.0 : (double)least / 1e6);
        mine->looks = mine->looks_backlogged = mine->looks_held = mine->looks_short = 0;
        mine->busy_ms = 0;
        mine->reported_at_ms = now_ms;
    }
    if (held)
        atomic_store(&gate->held, 1);
    else
        lift_hold(gpu);
}

void nvshare_fair_asked(int gpu, double asked_at_ms)
{
    if (gpu >= 0 && gpu < NVSHARE_MAX_GPUS)
        fair[gpu].asked_at_ns = asked_at_ms > 0 ? (uint64_t)(asked_at_ms * 1e6) : 0;
}

void nvshare_fair_wait(int gpu)
{
    struct nvshare_gate *gate = &nvshare_gates[gpu];
    int saved_errno = errno; /* the application's */
    atomic_fetch_add(&gate->held_waiting, 1);
    struct nvshare_fair_page *page = atomic_load(&published[gpu]);
    uint64_t until = monotonic_ns() + (uint64_t)HOLD_MS * 1000000u;
    /* Woken when the hold lifts, when another on the page goes idle (then on at once if
     * nobody backlogged is a lead behind: the GPU is not left idle till the next look), or
     * after HOLD_MS; then the launch goes on.  No page: detach() took it, and the hold. */
    while (page != NULL) {
        uint64_t now = monotonic_ns();
        if (now >= until)
            break;
        uint32_t seq = __atomic_load_n(&page->wake_seq, __ATOMIC_SEQ_CST);
        unsigned slot = atomic_load(&published_slot[gpu]);
        if (atomic_load(&published[gpu]) != page || !atomic_load(&gate->held))
            break;
        uint64_t least = look_at_others(page->slots, slot, now).least;
        if (!behind_by_a_lead(least, atomic_load(&published_vtime[gpu]))) {
            atomic_store(&gate->held, 0); /* its next launches need not look: the look will */
            break;
        }
        struct timespec timeout = {.tv_sec = (time_t)((until - now) / 1000000000u),
                                   .tv_nsec = (long)((until - now) % 1000000000u)};
        __atomic_add_fetch(&page->wake_waiters, 1, __ATOMIC_SEQ_CST);
        long waited = syscall(SYS_futex, &page->wake_seq, FUTEX_WAIT, seq, &timeout, NULL, 0);
        int again = waited == 0 || errno == EAGAIN || errno == EINTR; /* else: timed out, or
                                                                        no futex: go on */
        __atomic_sub_fetch(&page->wake_waiters, 1, __ATOMIC_SEQ_CST);
        if (!again)
            break;
    }
    atomic_fetch_sub(&gate->held_waiting, 1);
    errno = saved_errno;
}

void nvshare_fair_detach_all(void)
{
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++)
        detach(gpu);
}

void nvshare_fair_forget_after_fork(void)
{
    /* The parent's slots are the parent's: the child's agent gives it its own.  Nor is a
     * hold of the parent's the child's (a thread waiting in it did not come along). */
    memset(fair, 0, sizeof fair);
    for (int gpu = 0; gpu < NVSHARE_MAX_GPUS; gpu++) {
        atomic_store(&published[gpu], NULL);
        atomic_store(&published_vtime[gpu], 0);
        atomic_store(&nvshare_gates[gpu].held, 0);
        atomic_store(&nvshare_gates[gpu].held_waiting, 0);
        atomic_store(&nvshare_gates[gpu].near_hold, 0);
    }
}
