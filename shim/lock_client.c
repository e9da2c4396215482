/*
 * The lock client: one thread per process, started by the first CUDA call,
 * that talks to the agent (shim/nvshare_protocol.h) for every GPU's lock.
 *
 * Only this thread touches the socket (agent_link.c).  It turns the agent's
 * frames and its own periodic looks into events for the GPUs' lock machines
 * (lock_state.c, lock_machine.c) and carries out what they return: frames to
 * send, work for a GPU's worker (gpu_worker.c).  Application threads that
 * find a gate closed wake it through its doorbell and wait; they never hold
 * anything the application needs.
 *
 * Fail-open: with no agent (never there, gone, or silent) every gate stays
 * open and the process runs unscheduled; the thread keeps trying to connect
 * and, once an agent answers, closes the gates so the next GPU call asks
 * again (when to try again is agent_link.c's).
 *
 * An agent that does not answer is as good as none: a stopped agent, or a
 * socket whose service cannot start, takes the connect into its backlog and
 * never says a word, and the program would wait at its first GPU call for
 * good.  So an agent has LIVENESS_MS to answer HELLO, and one that announced
 * KEEPALIVE (it sends one every keepalive_ms to a shim whose request waits,
 * however long the queue) must not go silent for longer than that, or three
 * keepalive intervals if longer, while a request waits.  An older agent's
 * grants may take as long as its queue: only its answer to HELLO is timed.
 */
#define _GNU_SOURCE
#include "lock_client.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "agent_link.h"
#include "capture.h"
#include "config.h"
#include "devices.h"
#include "fair_share.h"
#include "gpu_worker.h"
#include "lock_machine.h"
#include "lock_state.h"
#include "log.h"
#include "memory_accounting.h"
#include "nvshare_protocol.h"
#include "queue_bound.h"
#include "shim_threads.h"
#include "usage_meter.h"

#define LIVENESS_MS 3000.0
/* An agent sends SETTINGS, its MEMORY_CAPs and WELCOME in one go; one that answered
 * with SETTINGS and no WELCOME this long after is from before WELCOME (and caps):
 * allocations stop waiting for its caps. */
#define WELCOME_WAIT_MS 1000.0

/* This connection: the agent has answered (any frame but ERROR); when it was
 * last heard (or connected to); since when a request has waited (one or more). */
static int answered;
static double heard_at_ms;
static double welcome_due_ms; /* 0: WELCOME came, or no connection */
static double waiting_since_ms;

/* What this connection's agent announced in WELCOME (none: an older agent). */
static uint32_t agent_features;
static uint32_t keepalive_ms;

/* ---- the connection ---------------------------------------------------------------------- */

static void run_unscheduled(const char *why)
{
    nvshare_link_close();
    answered = 0;
    welcome_due_ms = 0;
    nvshare_fair_detach_all();    /* the next agent hands out its own slots */
    nvshare_memory_caps_untold(); /* allocations waiting for them go on */
    nvshare_lock_run_unscheduled();
    nvshare_link_retry_later();
    nvshare_debug("running unscheduled: %s", why);
}

/* The agent is gone or spoke nonsense: warn once, open every gate, retry later. */
static void lose_agent(const char *why)
{
    NVSHARE_WARN_ONCE("lost the nvshare agent (%s): running unscheduled, reconnecting in "
                      "the background",
                      why);
    run_unscheduled(why);
}

/* Connects and says HELLO; on failure runs unscheduled (warning once on the
 * first attempt) and sets the next retry time.  The locks are not touched
 * until the agent answers: a process running unscheduled goes on so. */
static void connect_to_agent(int first_attempt)
{
    const char *path = nvshare_config()->socket_path;
    int error = nvshare_link_connect();
    if (error != 0) {
        if (first_attempt) {
            NVSHARE_WARN_ONCE("cannot reach the nvshare agent at %s (%s): running unscheduled, "
                              "retrying in the background",
                              path, strerror(error));
            run_unscheduled("no agent");
        } else {
            nvshare_link_retry_later();
        }
        return;
    }
    agent_features = 0;
    keepalive_ms = 0;
    answered = 0;
    welcome_due_ms = 0;
    nvshare_usage_reset();
    nvshare_memory_await_caps(); /* this agent says its own (MEMORY_CAP) before WELCOME */
    heard_at_ms = nvshare_now_ms();
    if (nvshare_link_hello() != 0) {
        lose_agent("hello not sent");
        return;
    }
    nvshare_debug("connected to the agent at %s (%d GPUs)", path, nvshare_gpu_count());
}

/* The agent's first frame: scheduled from now on.  The next GPU call of each
 * GPU asks for its lock (threads already waiting keep their place). */
static void agent_answered(void)
{
    answered = 1;
    welcome_due_ms = nvshare_now_ms() + WELCOME_WAIT_MS;
    nvshare_link_answered();
    struct nvshare_lock_event connected = {.kind = NVSHARE_EVENT_CONNECTED};
    struct nvshare_lock_jobs jobs[NVSHARE_MAX_GPUS];
    nvshare_lock_step_each(NVSHARE_MAX_GPUS, &connected, jobs);
    nvshare_memory_mark_all_changed();
}

/* How long the agent may stay silent now; 0: no bound. */
static double liveness_ms(void)
{
    if (!answered)
        return LIVENESS_MS;
    if (!(agent_features & NVSHARE_FEATURE_KEEPALIVE) || nvshare_lock_requests_waiting() == 0)
        return 0;
    return 3.0 * keepalive_ms > LIVENESS_MS ? 3.0 * keepalive_ms : LIVENESS_MS;
}

/* When the agent's silence ends the connection; 0: never. */
static double silent_deadline_ms(void)
{
    double bound = liveness_ms();
    if (bound == 0)
        return 0;
    double since = answered && waiting_since_ms > heard_at_ms ? waiting_since_ms : heard_at_ms;
    return since + bound;
}

static void agent_silent(double bound_ms)
{
    NVSHARE_WARN_ONCE("the nvshare agent has not answered for %.0f s: running unscheduled, "
                      "retrying in the background",
                      bound_ms / 1000);
    nvshare_link_slow_down();
    run_unscheduled("the agent is silent");
}

/* ---- what the lock machines ask for ----------------------------------------------------- */

/* gpu's GPU time to an agent that takes it (usage_meter.c): every ~100 ms while it
 * changes, or now (force). */
static void send_usage(int gpu, int force)
{
    struct nvshare_gpu_usage usage = {.gpu = *nvshare_gpu_uuid(gpu)};
    if (!(agent_features & NVSHARE_FEATURE_USAGE) ||
        !nvshare_usage_take_report(gpu, nvshare_now_ms(), force, &usage.busy_us))
        return;
    if (nvshare_link_send(NVSHARE_MSG_GPU_USAGE, &usage, sizeof usage) != 0)
        lose_agent("gpu usage not sent");
}

/* Sends the frames jobs ask for, and hands posted work to the GPU's worker.
 * 0, or -1 when the agent was lost. */
static int carry_out(int gpu, const struct nvshare_lock_jobs *jobs)
{
    for (int i = 0; i < jobs->count; i++) {
        const struct nvshare_lock_job *job = &jobs->job[i];
        if (job->kind == NVSHARE_JOB_SEND_REQUEST) {
            nvshare_debug("request gpu=%d", gpu);
            if (nvshare_link_send_lock(NVSHARE_MSG_LOCK_REQUEST, gpu, 0, 0) != 0) {
                lose_agent("request not sent");
                return -1;
            }
        } else if (job->kind == NVSHARE_JOB_SEND_RELEASED) {
            /* The agent decides who goes next at RELEASED: its figure must be current. */
            send_usage(gpu, 1);
            if (!nvshare_link_up())
                return -1;
            if (nvshare_link_send_lock(NVSHARE_MSG_RELEASED, gpu, job->lease, job->idle_ms) != 0) {
                lose_agent("release not sent");
                return -1;
            }
        } else if (job->kind == NVSHARE_JOB_POST_WORK) {
            nvshare_worker_post(gpu);
        }
    }
    return 0;
}

/* Every GPU's machine with event, and what each asks for. */
static void step_each_and_carry_out(struct nvshare_lock_event *event)
{
    struct nvshare_lock_jobs jobs[NVSHARE_MAX_GPUS];
    int count = nvshare_gpu_count();
    nvshare_lock_step_each(count, event, jobs);
    for (int gpu = 0; gpu < count && nvshare_link_up(); gpu++)
        if (carry_out(gpu, &jobs[gpu]) != 0)
            return;
}

/* Locks whose GPU a worker has drained: RELEASED (and asked again if a
 * thread came meanwhile). */
static void send_releases(void)
{
    struct nvshare_lock_event release = {.kind = NVSHARE_EVENT_SEND_RELEASE};
    step_each_and_carry_out(&release);
}

static void send_wanted_requests(void)
{
    int waited = nvshare_lock_requests_waiting();
    struct nvshare_lock_event request = {.kind = NVSHARE_EVENT_SEND_REQUEST};
    step_each_and_carry_out(&request);
    if (!waited)
        waiting_since_ms = nvshare_now_ms(); /* the agent's silence counts from here */
}

/* Each GPU's total memory, for an agent without NVML (a container, CI):
 * once per connection, to an agent that announced GPU_MEMORY.  A GPU whose
 * size the driver did not give is left out rather than reported empty. */
static void send_gpu_memory(void)
{
    for (int gpu = 0; gpu < nvshare_gpu_count() && nvshare_link_up(); gpu++) {
        struct nvshare_gpu_memory memory = {.gpu = *nvshare_gpu_uuid(gpu),
                                            .total_bytes = nvshare_gpu_total_bytes(gpu)};
        if (memory.total_bytes == 0)
            continue;
        if (nvshare_link_send(NVSHARE_MSG_GPU_MEMORY, &memory, sizeof memory) != 0)
            lose_agent("gpu memory not sent");
    }
}

/* Samples the GPU time of every GPU in use and reports what changed.  Returns
 * the poll timeout until the next sample. */
static int measure_usage(void)
{
    int next = nvshare_usage_sample(nvshare_now_ms());
    for (int gpu = 0; gpu < nvshare_gpu_count() && nvshare_link_up(); gpu++)
        send_usage(gpu, 0);
    return next;
}

static void send_memory_reports(void)
{
    for (int gpu = 0; gpu < nvshare_gpu_count() && nvshare_link_up(); gpu++) {
        struct nvshare_memory_report report = {.gpu = *nvshare_gpu_uuid(gpu)};
        if (!nvshare_memory_take_report(gpu, &report.managed_bytes, &report.unmanaged_bytes))
            continue;
        if (nvshare_link_send(NVSHARE_MSG_MEMORY_REPORT, &report, sizeof report) != 0)
            lose_agent("memory report not sent");
    }
}

/* Early release of idle GPUs (lock_machine.c decides).  Returns the poll
 * timeout until the next look. */
static int release_idle_gpus(void)
{
    struct nvshare_settings settings;
    struct nvshare_lock_event look = {.kind = NVSHARE_EVENT_IDLE_LOOK};
    if (nvshare_lock_settings(&settings))
        look.idle_release_ms = settings.idle_release_ms;
    int timeout = -1;
    for (int gpu = 0; gpu < nvshare_gpu_count(); gpu++) {
        /* Work still runs: a mark not done (a thread waiting in the queue bound, outside
         * the gate, shows only so), or a thread inside a gated call (a synchronous copy),
         * which passed the gate once, when it came in; or work waits in a fair hold
         * (fair_share.c).  Closed gates are not looked at. */
        struct nvshare_gate *gate = &nvshare_gates[gpu];
        look.work_pending = atomic_load(&gate->open) && (atomic_load(&gate->inflight) != 0 ||
                                                         atomic_load(&gate->held_waiting) != 0 ||
                                                         nvshare_queue_newest_pending(gpu));
        struct nvshare_lock_jobs jobs;
        nvshare_lock_step(gpu, &look, &jobs, NULL);
        carry_out(gpu, &jobs);
        if (jobs.look_in_ms >= 0 && (timeout < 0 || jobs.look_in_ms < timeout))
            timeout = jobs.look_in_ms;
    }
    return timeout;
}

/* ---- frames from the agent -------------------------------------------------------------- */

static int has_job(const struct nvshare_lock_jobs *jobs, int kind)
{
    for (int i = 0; i < jobs->count; i++)
        if (jobs->job[i].kind == kind)
            return 1;
    return 0;
}

static void on_grant(int gpu, const struct nvshare_lock_message *message)
{
    struct nvshare_lock_event grant = {.kind = NVSHARE_EVENT_GRANT,
                                       .lease = message->lease,
                                       .flags = message->flags,
                                       .prefetch = nvshare_config()->prefetch,
                                       .prefetch_after_ms = nvshare_config()->prefetch_after_ms};
    struct nvshare_lock_jobs jobs;
    struct nvshare_lock_machine before;
    nvshare_lock_step(gpu, &grant, &jobs, &before);
    if (jobs.stale)
        nvshare_debug("grant gpu=%d lease=%llu not asked for: %s", gpu,
                      (unsigned long long)message->lease,
                      has_job(&jobs, NVSHARE_JOB_SEND_RELEASED) ? "released" : "ignored");
    else {
        nvshare_debug("grant gpu=%d lease=%llu mode=%s waited_ms=%.2f", gpu,
                      (unsigned long long)message->lease,
                      message->flags & NVSHARE_GRANT_SHARED ? "shared" : "exclusive",
                      grant.now_ms - before.requested_at_ms);
        nvshare_fair_asked(gpu, before.requested_at_ms);
    }
    carry_out(gpu, &jobs);
}

static void on_drop_request(int gpu, const struct nvshare_lock_message *message)
{
    struct nvshare_lock_event drop = {.kind = NVSHARE_EVENT_DROP,
                                      .lease = message->lease,
                                      .flags = message->flags,
                                      .idle_ms = message->idle_ms};
    struct nvshare_lock_jobs jobs;
    nvshare_lock_step(gpu, &drop, &jobs, NULL);
    if (message->flags & NVSHARE_DROP_WHEN_IDLE)
        nvshare_debug("drop gpu=%d lease=%llu when idle for %u ms%s", gpu,
                      (unsigned long long)message->lease, message->idle_ms,
                      jobs.stale ? " (stale, ignored)" : "");
    else
        nvshare_debug("drop gpu=%d lease=%llu%s", gpu, (unsigned long long)message->lease,
                      jobs.stale ? " (stale, ignored)" : "");
    carry_out(gpu, &jobs);
}

static void on_revoked(int gpu, const struct nvshare_lock_message *message)
{
    struct nvshare_lock_event revoked = {.kind = NVSHARE_EVENT_REVOKED, .lease = message->lease};
    struct nvshare_lock_jobs jobs;
    nvshare_lock_step(gpu, &revoked, &jobs, NULL);
    NVSHARE_WARN_ONCE("the nvshare agent revoked this process's lock of a GPU (a drop request "
                      "was not honoured in time)");
    nvshare_debug("revoked gpu=%d lease=%llu", gpu, (unsigned long long)message->lease);
}

static void on_frame(const struct nvshare_header *header, const unsigned char *payload)
{
    switch (header->type) {
    case NVSHARE_MSG_SETTINGS: {
        struct nvshare_settings settings;
        if (header->payload_bytes != sizeof settings)
            break;
        memcpy(&settings, payload, sizeof settings);
        nvshare_lock_set_settings(&settings);
        nvshare_debug("settings anti_thrash=%u time_quantum_ms=%u idle_release_ms=%u",
                      settings.anti_thrash, settings.time_quantum_ms, settings.idle_release_ms);
        return;
    }
    case NVSHARE_MSG_WELCOME: {
        struct nvshare_welcome welcome;
        if (header->payload_bytes != sizeof welcome)
            break;
        memcpy(&welcome, payload, sizeof welcome);
        agent_features = welcome.features;
        keepalive_ms = welcome.features & NVSHARE_FEATURE_KEEPALIVE ? welcome.keepalive_ms : 0;
        nvshare_debug("welcome features=%u keepalive_ms=%u", welcome.features,
                      welcome.keepalive_ms);
        /* An agent with MEMORY_CAP has said every cap before this frame; an older one
         * says them after it, as it always did. */
        nvshare_memory_caps_told();
        welcome_due_ms = 0;
        if (agent_features & NVSHARE_FEATURE_GPU_MEMORY)
            send_gpu_memory();
        return;
    }
    case NVSHARE_MSG_KEEPALIVE:
        return; /* only its arrival counts (liveness) */
    case NVSHARE_MSG_MEMORY_CAP: {
        struct nvshare_memory_cap cap;
        if (header->payload_bytes != sizeof cap)
            break;
        memcpy(&cap, payload, sizeof cap);
        int gpu = nvshare_gpu_of_uuid(&cap.gpu);
        if (gpu < 0)
            return;
        nvshare_memory_set_cap(gpu, cap.cap_bytes, cap.others_bytes);
        nvshare_debug("memory cap gpu=%d cap_bytes=%llu others_bytes=%llu", gpu,
                      (unsigned long long)cap.cap_bytes, (unsigned long long)cap.others_bytes);
        return;
    }
    case NVSHARE_MSG_FAIR_SLOT: {
        struct nvshare_fair_slot slot;
        if (header->payload_bytes != sizeof slot)
            break;
        memcpy(&slot, payload, sizeof slot);
        nvshare_fair_attach(nvshare_gpu_of_uuid(&slot.gpu), &slot, nvshare_link_take_fd());
        return;
    }
    case NVSHARE_MSG_LOCK_GRANT:
    case NVSHARE_MSG_DROP_REQUEST:
    case NVSHARE_MSG_REVOKED: {
        struct nvshare_lock_message message;
        if (header->payload_bytes != sizeof message)
            break;
        memcpy(&message, payload, sizeof message);
        int gpu = nvshare_gpu_of_uuid(&message.gpu);
        if (gpu < 0)
            return;
        if (header->type == NVSHARE_MSG_LOCK_GRANT)
            on_grant(gpu, &message);
        else if (header->type == NVSHARE_MSG_DROP_REQUEST)
            on_drop_request(gpu, &message);
        else
            on_revoked(gpu, &message);
        return;
    }
    case NVSHARE_MSG_ERROR: {
        struct nvshare_error error;
        if (header->payload_bytes != sizeof error)
            break;
        memcpy(&error, payload, sizeof error);
        error.text[sizeof error.text - 1] = '\0';
        NVSHARE_WARN_ONCE("the nvshare agent refused this process: %s", error.text);
        lose_agent("agent sent an error");
        return;
    }
    default:
        break;
    }
    nvshare_debug("ignored a frame of type %u with %u payload bytes", header->type,
                  header->payload_bytes);
}

static void read_frames(void)
{
    int status = nvshare_link_receive();
    if (status <= 0) {
        lose_agent(status == 0 ? "connection closed" : strerror(errno));
        return;
    }
    struct nvshare_header header;
    unsigned char payload[NVSHARE_MAX_PAYLOAD_BYTES];
    while (nvshare_link_up() && (status = nvshare_link_next_frame(&header, payload)) != 0) {
        if (status < 0) {
            NVSHARE_WARN_ONCE("the nvshare agent speaks another protocol (magic 0x%x, "
                              "version %u; this shim speaks %u)",
                              header.magic, header.version, NVSHARE_PROTOCOL_VERSION);
            lose_agent("protocol mismatch");
            return;
        }
        heard_at_ms = nvshare_now_ms();
        if (!answered && header.type != NVSHARE_MSG_ERROR)
            agent_answered();
        on_frame(&header, payload);
    }
}

/* ---- the thread -------------------------------------------------------------------------- */

void *nvshare_client_main(void *unused)
{
    (void)unused;
    prctl(PR_SET_NAME, "nvshare-client", 0, 0, 0);
    /* Every driver call of this thread is the shim's own (prefetches, their
     * stream's synchronisation): none may invalidate an application's capture. */
    nvshare_capture_relax();
    connect_to_agent(1);
    for (;;) {
        int timeout = -1;
        if (nvshare_link_up() && answered) {
            send_releases();
            if (nvshare_link_up()) {
                send_wanted_requests();
                send_memory_reports();
            }
            if (nvshare_link_up())
                timeout = release_idle_gpus();
            if (nvshare_link_up() && (agent_features & NVSHARE_FEATURE_USAGE)) {
                int sample_in = measure_usage();
                if (sample_in >= 0 && (timeout < 0 || sample_in < timeout))
                    timeout = sample_in;
            }
        }
        double now = nvshare_now_ms(), deadline = silent_deadline_ms();
        if (nvshare_link_up() && welcome_due_ms > 0) {
            if (now >= welcome_due_ms) {
                nvshare_debug("no WELCOME: an agent from before it, which says no caps");
                nvshare_memory_caps_untold();
                welcome_due_ms = 0;
            } else {
                int until_due = (int)(welcome_due_ms - now) + 1;
                timeout = timeout < 0 || until_due < timeout ? until_due : timeout;
            }
        }
        if (nvshare_link_up() && deadline > 0) {
            if (now >= deadline) {
                agent_silent(liveness_ms());
                continue;
            }
            int until_silent = (int)(deadline - now) + 1;
            timeout = timeout < 0 || until_silent < timeout ? until_silent : timeout;
        }
        if (!nvshare_link_up()) {
            double wait = nvshare_link_retry_at_ms() - now;
            timeout = wait < 0 ? 0 : (int)wait + 1;
        }
        struct pollfd watched[2] = {
            {.fd = nvshare_doorbell_fd(), .events = POLLIN},
            {.fd = nvshare_link_up() ? nvshare_link_fd() : nvshare_link_watch_fd(),
             .events = POLLIN},
        };
        int ready = poll(watched, watched[1].fd >= 0 ? 2 : 1, timeout);
        if (ready < 0 && errno != EINTR) {
            struct timespec pause = {.tv_nsec = 10000000};
            nanosleep(&pause, NULL);
        }
        if (ready > 0 && (watched[0].revents & POLLIN))
            nvshare_doorbell_drain();
        if (nvshare_link_up() && ready > 0 && watched[1].revents)
            read_frames();
        else if (!nvshare_link_up() && ready > 0 && watched[1].revents)
            nvshare_link_read_watch();
        if (!nvshare_link_up() && nvshare_now_ms() >= nvshare_link_retry_at_ms())
            connect_to_agent(0);
    }
    return NULL;
}

void nvshare_client_forget_after_fork(void)
{
    answered = 0;
    welcome_due_ms = 0;
}
