/* Side by side by weight: each GPU's fair page (struct nvshare_fair_page), shared by the
 * shims that hold it.  Where another holder with work is owed more GPU time per weight,
 * this process's next launches wait (docs/scheduling.md, "Side by side"). */
#ifndef NVSHARE_FAIR_SHARE_H
#define NVSHARE_FAIR_SHARE_H

#include "nvshare_protocol.h"

/* A FAIR_SLOT frame (client thread) and the page's descriptor that came with it (-1:
 * none): maps the page, takes the slot, closes the descriptor. */
void nvshare_fair_attach(int gpu, const struct nvshare_fair_slot *slot, int fd);

/* The usage meter's look at gpu (client thread, every ~1 ms while its gate is open):
 * open, whether it had work, and the interval counted busy.  Publishes this process's
 * state and sets the gate's hold. */
void nvshare_fair_look(int gpu, int open, int busy, double busy_ms);

/* A grant of gpu came for a request made at asked_at_ms (nvshare_now_ms; client thread):
 * back from idle at its next burst, its credit counts only what the others ran on before
 * then, not while it waited for its turn or its grant's prefetch. */
void nvshare_fair_asked(int gpu, double asked_at_ms);

/* An application thread at gpu's gate while it is held: waits until the hold ends, at
 * most HOLD_MS, then goes on (a hold never stops a process for good). */
void nvshare_fair_wait(int gpu);

/* The connection is gone: every page let go, every hold lifted. */
void nvshare_fair_detach_all(void);

/* In a forked child: the parent's pages forgotten, not touched. */
void nvshare_fair_forget_after_fork(void);

#endif
